"""Machine-wide admission of runs: how many may run at once (``/etc/cairn/admission.toml``,
with a default from the host's CPUs and memory) and which queued run goes next.

A run holds a slot while it is ``pending`` or ``running`` (a coordinator runs or is about
to). A run that waits for a person, is paused or blocked holds none: no process runs for
it, and it may wait for days. Which queued run starts next is a pure function over what
the journal says (:func:`admission_order`): the user with the fewest runs holding a slot
goes first, ties to the user whose oldest queued run is oldest, and each user's runs in
the order they were launched. Two users with queued runs thus take turns.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from pydantic import ConfigDict, Field

from cairn import paths
from cairn.config import Problems, load_file
from cairn.protocol.base import Frozen

SLOT_STATES = ("pending", "running")
MEMORY_PER_RUN = 1 << 30  # a coordinator and an agent or two, with room to spare
RUNS_PER_CPU = 2  # agents mostly wait for a model or a tool; a run is rarely CPU-bound

ADMISSION_FIX = (
    "its keys are max_running_runs and max_running_per_user, whole numbers of at least 1, "
    "and max_daily_cost_cents_per_user, a whole number "
    "(see /usr/share/doc/cairn/docs/people.md); fix the file or remove it to use the defaults"
)


def default_machine_limit(cpus: int | None = None, memory: int | None = None) -> int:
    """``RUNS_PER_CPU`` runs per CPU, no more than one per ``MEMORY_PER_RUN`` of memory,
    at least one."""
    cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    if memory is None:
        try:
            memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            memory = MEMORY_PER_RUN
    return max(1, min(cpus * RUNS_PER_CPU, memory // MEMORY_PER_RUN))


class AdmissionConfig(Frozen):
    """``/etc/cairn/admission.toml``: at most ``max_running_runs`` runs hold a slot at
    once, at most ``max_running_per_user`` of them one user's (by default, as many as the
    machine's limit: users share by taking turns)."""

    model_config = ConfigDict(defer_build=True, strict=True)

    max_running_runs: int | None = Field(default=None, ge=1, le=10_000)
    max_running_per_user: int | None = Field(default=None, ge=1, le=10_000)
    # what one user's runs may spend on model calls per local day, in hundredths of the
    # currency of the providers' prices (None: no daily budget)
    max_daily_cost_cents_per_user: int | None = Field(default=None, ge=0)

    @property
    def machine_limit(self) -> int:
        return self.max_running_runs or default_machine_limit()

    @property
    def user_limit(self) -> int:
        return min(self.max_running_per_user or self.machine_limit, self.machine_limit)


def admission_config(*, problems: Problems | None = None) -> AdmissionConfig:
    """The host's admission settings; every problem of the file raised as one
    :class:`cairn.config.ConfigError`, or, given ``problems``, recorded there (and the
    defaults returned)."""
    file = paths.config_dir() / "admission.toml"
    if problems is not None:
        return problems.load(file, AdmissionConfig, fix=ADMISSION_FIX) or AdmissionConfig()
    return load_file(file, AdmissionConfig, fix=ADMISSION_FIX) or AdmissionConfig()


@dataclass(frozen=True)
class Queued:
    """A queued run as admission sees it: whose, and when it was launched."""

    run_id: str
    owner_uid: int
    queued_at: float


def admission_order(
    queued: list[Queued], holding: dict[int, int], *, user_limit: int | None = None
) -> list[Queued]:
    """The order ``queued`` runs would start in if slots freed one at a time, given how
    many slots each user ``holding`` has now. Each step takes the user with the fewest
    slots (ties: the user whose oldest queued run is oldest), that user's oldest queued
    run. A user at ``user_limit`` is passed over (their runs are left out)."""
    by_user: dict[int, list[Queued]] = {}
    for run in sorted(queued, key=lambda r: (r.queued_at, r.run_id)):
        by_user.setdefault(run.owner_uid, []).append(run)
    counts = {uid: holding.get(uid, 0) for uid in by_user}
    order: list[Queued] = []
    while by_user:
        uid = min(by_user, key=lambda u: (counts[u], by_user[u][0].queued_at, u))
        if user_limit is not None and counts[uid] >= user_limit:
            del by_user[uid]
            continue
        order.append(by_user[uid].pop(0))
        counts[uid] += 1
        if not by_user[uid]:
            del by_user[uid]
    return order


def next_admitted(
    queued: list[Queued], holding: dict[int, int], config: AdmissionConfig
) -> list[Queued]:
    """The queued runs that start now: the head of :func:`admission_order`, as many as
    the machine has free slots and each user's share allows."""
    free = config.machine_limit - sum(holding.values())
    if free <= 0:
        return []
    return admission_order(queued, holding, user_limit=config.user_limit)[:free]


def queue_positions(queued: list[Queued], holding: dict[int, int]) -> dict[str, int]:
    """Each queued run's place (1 = next) in the order runs start as slots free."""
    return {run.run_id: i for i, run in enumerate(admission_order(queued, holding), 1)}
