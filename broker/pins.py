"""Which launch description root acts on (ARCHITECTURE §7): the one the run's owner
attested, pinned in root's own database at the run's first verb.

The journal is written by ``cairn``, so a description read from it is a claim. Root takes
the owner's UID from the kernel (the attestation channel's ``SO_PEERCRED``), the owner's
group and name from ``/etc/passwd``, the project's identity from ``lstat``, and the
description only when its hash is the one the owner's own process wrote. Every later verb
acts on the pinned copy and refuses a journal whose description differs from it.
"""

from __future__ import annotations

import logging
import os
import pwd
import stat
from pathlib import Path
from typing import NamedTuple

from cairn.broker.receipts import Pin, ReceiptStore
from cairn.errors import BrokerRefused
from cairn.journal.reader import JournalReader
from cairn.journal.rows import TERMINAL_RUN_STATES
from cairn.protocol.launch import LaunchDescription

log = logging.getLogger(__name__)

# What an upgrade may change in a pinned description (cairn upgrade: new reviewed source);
# the owner, project, profiles, limits and everything else stay what was first attested.
UPGRADABLE_FIELDS = frozenset({"source", "review_hash", "review"})

ATTEST_HINT = "launch runs with the cairn CLI, which attests them as you"


class Attestation(NamedTuple):
    """What the owner's channel told root: who made it (the kernel's word) and the line
    that process wrote."""

    pid: int
    uid: int
    gid: int
    run_id: str
    launch_hash: str


def description(
    journal: JournalReader,
    store: ReceiptStore,
    run_id: str,
    verb: str,
    attestation: Attestation | None,
    service_uids: set[int],
) -> tuple[LaunchDescription, Pin | None]:
    """The description root acts on for ``verb`` of ``run_id``, and its pin.

    With an attestation, pin the journal's description first (or re-pin an upgrade). A
    run never pinned gets no verb but ``delete-v1`` (which only names the run)."""
    claimed = journal.launch_description(run_id)
    if claimed.run_id != run_id:
        raise BrokerRefused(f"the journal's description of {run_id} names {claimed.run_id}")
    pin = store.pin(run_id)
    if attestation is not None:
        pin = attest(journal, store, claimed, pin, attestation, service_uids)
    if pin is None:
        if verb == "delete-v1":
            return claimed, None
        raise BrokerRefused(f"{run_id} was never attested by its owner", hint=ATTEST_HINT)
    if claimed.launch_hash() != pin.launch_hash:
        raise BrokerRefused(
            f"the journal's description of {run_id} is not the one its owner attested "
            f"({pin.launch_hash})",
            hint="the journal was changed behind cairnd's back: see 'journalctl -u "
            "cairn-broker.service'",
        )
    pinned = LaunchDescription.model_validate_json(pin.description)
    if (pinned.run_id, pinned.owner_uid, pinned.owner_gid) != (
        run_id, pin.owner_uid, pin.owner_gid
    ):
        raise BrokerRefused(f"the pin of {run_id} does not match its own description")
    return pinned, pin


def attest(
    journal: JournalReader,
    store: ReceiptStore,
    claimed: LaunchDescription,
    pin: Pin | None,
    attestation: Attestation,
    service_uids: set[int],
) -> Pin:
    """Pin ``claimed`` as the run's description if the owner's own process attested it."""
    run_id = claimed.run_id
    if attestation.run_id != run_id:
        raise BrokerRefused(f"the attestation names {attestation.run_id}, not {run_id}")
    if attestation.uid in service_uids:
        raise BrokerRefused(
            f"a launch is attested by the run's owner, not by uid {attestation.uid}",
            hint=ATTEST_HINT,
        )
    if attestation.uid not in (claimed.owner_uid, claimed.project.owner_uid):
        raise BrokerRefused(
            f"{run_id} names uid {claimed.owner_uid} as its owner; the attestation came "
            f"from uid {attestation.uid}"
        )
    if claimed.owner_uid != claimed.project.owner_uid:
        raise BrokerRefused(f"{run_id}'s project is not its owner's")
    try:
        account = pwd.getpwuid(attestation.uid)
    except KeyError as exc:
        raise BrokerRefused(f"uid {attestation.uid} has no account on this host") from exc
    if (claimed.owner_gid, claimed.owner_name) != (account.pw_gid, account.pw_name):
        raise BrokerRefused(
            f"{run_id} names group {claimed.owner_gid} and user {claimed.owner_name!r}; "
            f"/etc/passwd gives uid {attestation.uid} group {account.pw_gid} and user "
            f"{account.pw_name!r}"
        )
    launch_hash = claimed.launch_hash()
    if launch_hash != attestation.launch_hash:
        raise BrokerRefused(
            f"the journal's description of {run_id} is not the one its owner attested",
            hint="launch it again",
        )
    if journal.get_run(run_id).state in TERMINAL_RUN_STATES:
        raise BrokerRefused(f"{run_id} has ended; it is not pinned again")
    project = project_stat(Path(claimed.project.root), attestation.uid)
    new = Pin(
        run_id=run_id,
        owner_uid=attestation.uid,
        owner_gid=account.pw_gid,
        launch_hash=launch_hash,
        project_dev=project.st_dev,
        project_ino=project.st_ino,
        description=claimed.model_dump_json(),
    )
    if pin is None:
        store.put_pin(new, pid=attestation.pid)
        log.info("%s pinned to %s, attested by uid %d", run_id, launch_hash, attestation.uid)
        return new
    if pin.launch_hash == launch_hash:
        return pin
    check_upgrade(pin, new)
    store.repin(pin, new, pid=attestation.pid)
    log.info("%s re-pinned from %s to %s by its owner", run_id, pin.launch_hash, launch_hash)
    return new


def check_upgrade(old: Pin, new: Pin) -> None:
    """A pinned run moves to another description only by an upgrade of its source."""
    if (old.owner_uid, old.owner_gid, old.project_dev, old.project_ino) != (
        new.owner_uid, new.owner_gid, new.project_dev, new.project_ino
    ):
        raise BrokerRefused(f"{old.run_id} is pinned to another owner or project")
    before = LaunchDescription.model_validate_json(old.description).model_dump(mode="json")
    after = LaunchDescription.model_validate_json(new.description).model_dump(mode="json")
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    if not set(changed) <= UPGRADABLE_FIELDS:
        raise BrokerRefused(
            f"{old.run_id} is pinned; an upgrade changes only its source, not "
            f"{', '.join(sorted(set(changed) - UPGRADABLE_FIELDS))}"
        )


def project_stat(project: Path, owner_uid: int) -> os.stat_result:
    """The owner's project directory, reached without a symlink."""
    try:
        st = os.lstat(project)
    except OSError as exc:
        raise BrokerRefused(f"project {project} is gone: {exc.strerror}") from exc
    if not stat.S_ISDIR(st.st_mode):
        raise BrokerRefused(f"project {project} is not a directory")
    if st.st_uid != owner_uid:
        raise BrokerRefused(f"project {project} is not owned by the run's owner")
    if not project.is_absolute() or project.resolve() != project:
        raise BrokerRefused(f"project path {project} passes through a symlink")
    return st


def check_pinned_project(project: Path, pin: Pin) -> os.stat_result:
    """The live project must still be the directory the owner attested."""
    st = project_stat(project, pin.owner_uid)
    if (st.st_dev, st.st_ino) != (pin.project_dev, pin.project_ino):
        raise BrokerRefused(
            f"project {project} is not the directory {pin.run_id} was launched on",
            hint="it was replaced since the launch; launch the run again",
        )
    return st
