"""Host-configured evaluators: the commands ``flow.measure_proposal`` runs (ARCHITECTURE §4.1).

One file per evaluator, ``/etc/cairn/evaluators.d/NAME.toml``::

    argv = ["/usr/local/bin/bench", "--json"]  # run in a snapshot of W; argv[0] absolute
    timeout_sec = 600                           # each run (warm-up or sample)
    warmups = 1                                 # runs whose values are discarded
    samples = 5                                 # runs whose values are recorded
    network = false                             # or "allowlist", with allowlist = [...]
    [environment]
    LANG = "C.UTF-8"

``network = "allowlist"`` with ``allowlist = ["pypi.org", "*.example.com"]`` (the
agents' allowlist entries) has its runs reach those domains, and nothing else, through
the run's allowlist proxy; ``false`` (or ``"none"``) keeps them off the network.

A workflow names an evaluator (``flow.measure_proposal("bench", ...)``, or
``flow.measure_proposal(args.evaluator, ...)`` to let a launch argument choose it), never
its argv. The review records the names, or the argument fields, a workflow uses; a launch
freezes the evaluators they name into its
launch description (a run never re-reads this directory) and refuses a launch that names
one the host does not configure. Each run prints the metric values as one JSON line
(:mod:`cairn.protocol.measurement`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from cairn import paths
from cairn.config import Problems
from cairn.netpolicy import is_allowlist_entry
from cairn.protocol.launch import MAX_EVALUATOR_ALLOWLIST, EvaluatorSpec
from cairn.protocol.names import is_verifier_name
from cairn.verifiers import CommandConfig

FIX = (
    "an evaluator has argv (argv[0] an absolute path), timeout_sec, warmups, samples, "
    "network = false (or \"allowlist\" with allowlist = [domains]) and an optional "
    "[environment] "
    "(see /usr/share/doc/cairn/docs/writing-workflows.md)"
)


class EvaluatorConfig(CommandConfig):
    """One ``evaluators.d/NAME.toml``."""

    warmups: int = Field(default=0, ge=0, le=100)
    samples: int = Field(default=1, ge=1, le=1000)
    network: Literal[False, "none", "allowlist"] = False
    allowlist: list[str] = Field(default=[], max_length=MAX_EVALUATOR_ALLOWLIST)

    @model_validator(mode="after")
    def _allowlist(self) -> EvaluatorConfig:
        if (self.network == "allowlist") != bool(self.allowlist):
            raise ValueError('network = "allowlist" takes a non-empty allowlist, and only it')
        for entry in self.allowlist:
            if not is_allowlist_entry(entry):
                raise ValueError(f"allowlist entry {entry!r} is not a domain: host, "
                                 "host:port or *.domain")
        return self


def evaluators_dir() -> Path:
    return paths.config_dir() / "evaluators.d"


def load_evaluators(problems: Problems) -> dict[str, EvaluatorConfig]:
    """Every ``evaluators.d/*.toml`` by name; problems recorded in ``problems``."""
    found: dict[str, EvaluatorConfig] = {}
    directory = evaluators_dir()
    if not directory.is_dir():
        return found
    for file in sorted(directory.glob("*.toml")):
        if not is_verifier_name(file.stem):
            problems.add(file, "", f"evaluator name {file.stem!r} is not [a-z0-9][a-z0-9_-]*",
                         "rename the file")
            continue
        loaded = problems.load(file, EvaluatorConfig, fix=FIX)
        if loaded is not None:
            found[file.stem] = loaded
    return found


def frozen_evaluators(
    wanted: Mapping[str, str | None], problems: Problems
) -> list[EvaluatorSpec]:
    """The evaluators a reviewed workflow measures with, as its launch freezes them (sorted
    by name); ``wanted`` maps each name to the launch argument that names it (``None``: the
    workflow's literal). A name the host does not configure is a problem. A workflow that
    measures nothing reads no evaluator file, so a broken one refuses only the launches
    using it."""
    if not wanted:
        return []
    configured = load_evaluators(problems)
    specs: list[EvaluatorSpec] = []
    for name in sorted(wanted):
        config = configured.get(name) if is_verifier_name(name) else None
        if config is None:
            problems.add(*_unconfigured(name, wanted[name], sorted(configured)))
            continue
        specs.append(EvaluatorSpec(
            name=name,
            argv=config.argv,
            timeout_sec=config.timeout_sec,
            environment=config.environment,
            warmups=config.warmups,
            samples=config.samples,
            config_sha256=problems.read_sha256[evaluators_dir() / f"{name}.toml"],
            allowlist=[e.lower() for e in config.allowlist] or None,
        ))
    return specs


def _unconfigured(name: str, argument: str | None, configured: list[str]) -> tuple[
    Path, str, str, str
]:
    if argument is None:
        return (evaluators_dir() / f"{name}.toml", "",
                f"the workflow measures with evaluator {name!r}, which is not configured",
                f"an administrator adds it: {FIX}")
    where = evaluators_dir() / f"{name}.toml" if is_verifier_name(name) else (
        evaluators_dir())
    return (where, "",
            f"the launch argument {argument!r} names evaluator {name!r}, which is not "
            "configured",
            f"launch with {argument} set to one of: {', '.join(configured) or '(none)'}; "
            f"or an administrator adds it: {FIX}")
