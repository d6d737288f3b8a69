"""Root pins a run on its owner's attestation and acts on nothing else (ARCHITECTURE §7).

On a real journal and the broker's real receipts database: the ``cairn`` user is the
attacker, so every case writes the journal the way cairn could (through the writer or raw
SQL) and asks :func:`cairn.broker.verbs.carry_out` what root would do. A run's pending
intents are left out where the case is about the pin, so no storage is touched.
"""

from __future__ import annotations

import os
import pwd
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TypedDict

import pytest

from cairn import paths
from cairn.broker import verbs
from cairn.broker.pins import Attestation
from cairn.broker.receipts import Pin, ReceiptStore
from cairn.errors import BrokerRefused
from cairn.journal.readwrite import Journal
from cairn.protocol.broker import Intent
from cairn.protocol.launch import LaunchDescription, ProfileSpec, ProjectSpec

RUN = "flow_" + "a1" * 16
OTHER = "flow_" + "b2" * 16
ME = os.getuid()
ACCOUNT = pwd.getpwuid(ME)
# The service users that may never attest; the test process stands for the run's owner.
SERVICE = frozenset({ME + 4242})


class OwnerChanges(TypedDict, total=False):
    owner_gid: int
    owner_name: str


@pytest.fixture(autouse=True)
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    paths.journal_path().parent.mkdir(parents=True)
    paths.broker_db_path().parent.mkdir(parents=True)
    (tmp_path / "home/owner/project").mkdir(parents=True)
    (tmp_path / "home/victim").mkdir(parents=True)
    return tmp_path


@pytest.fixture
def journal() -> Iterator[Journal]:
    with Journal(paths.journal_path(), create=True) as opened:
        yield opened


def description(host: Path, run_id: str = RUN, **changes: object) -> LaunchDescription:
    desc = LaunchDescription(
        run_id=run_id,
        owner_uid=ME,
        owner_gid=ACCOUNT.pw_gid,
        owner_name=ACCOUNT.pw_name,
        definition="builtin:implement",
        source="print('reviewed')",
        source_filename="implement.py",
        review_hash="sha256:" + "c" * 64,
        review={},
        args={"objective": "x"},
        project=ProjectSpec(root=str(host / "home/owner/project"), owner_uid=ME,
                            on_pool_fs=False),
        profiles={"tool": ProfileSpec(name="tool", kind="command", argv=["/usr/bin/true"])},
        cairn_version="test",
        created_at=time.time(),
    )
    return desc.model_copy(update=changes)


def attestation(desc: LaunchDescription, **changes: object) -> Attestation:
    fields: dict[str, object] = {"pid": os.getpid(), "uid": ME, "gid": ACCOUNT.pw_gid,
                                 "run_id": desc.run_id, "launch_hash": desc.launch_hash()}
    fields.update(changes)
    return Attestation(**fields)  # type: ignore[arg-type]


def carry_out(verb: str, run_id: str = RUN, attested: Attestation | None = None) -> None:
    verbs.carry_out(verb, run_id, attested, SERVICE)


def rewrite_launch(run_id: str, desc: LaunchDescription) -> None:
    """What the cairn user can do to the journal behind cairnd."""
    raw = sqlite3.connect(paths.journal_path())
    raw.execute("UPDATE runs SET launch=? WHERE run_id=?", (desc.model_dump_json(), run_id))
    raw.commit()
    raw.close()


def pinned_hash(run_id: str = RUN) -> str | None:
    store = ReceiptStore()
    try:
        pin = store.pin(run_id)
    finally:
        store.close()
    return None if pin is None else pin.launch_hash


def test_a_run_nobody_attested_gets_no_verb_but_its_delete(journal: Journal, host: Path) -> None:
    journal.create_run(description(host), intents=[])
    for verb in ("launch-v1", "storage-v1"):
        with pytest.raises(BrokerRefused, match=f"{RUN} was never attested by its owner"):
            carry_out(verb)
    carry_out("delete-v1")  # names only the run; nothing pending, nothing done
    assert pinned_hash() is None


def test_the_owners_attestation_pins_the_description_and_later_verbs_act_on_it(
    journal: Journal, host: Path
) -> None:
    desc = description(host)
    journal.create_run(desc, intents=[])
    carry_out("launch-v1", attested=attestation(desc))
    assert pinned_hash() == desc.launch_hash()
    carry_out("storage-v1")
    carry_out("launch-v1", attested=attestation(desc))  # the same word again: no change
    assert pinned_hash() == desc.launch_hash()


@pytest.mark.parametrize(
    ("forged", "refusal"),
    [
        ({"uid": ME + 1}, "names uid .* as its owner; the attestation came from uid"),
        ({"uid": next(iter(SERVICE))}, "attested by the run's owner, not by uid"),
        ({"run_id": OTHER}, f"the attestation names {OTHER}, not {RUN}"),
        ({"launch_hash": "sha256:" + "0" * 64}, "is not the one its owner attested"),
    ],
)
def test_an_attestation_that_is_not_the_owners_word_on_this_description_pins_nothing(
    journal: Journal, host: Path, forged: dict[str, object], refusal: str
) -> None:
    desc = description(host)
    journal.create_run(desc, intents=[])
    with pytest.raises(BrokerRefused, match=refusal):
        carry_out("launch-v1", attested=attestation(desc, **forged))
    assert pinned_hash() is None


@pytest.mark.parametrize(
    ("changes", "refusal"),
    [
        ({"owner_gid": ACCOUNT.pw_gid + 1}, "/etc/passwd gives uid"),
        ({"owner_name": "someone-else"}, "/etc/passwd gives uid"),
    ],
)
def test_the_owners_group_and_name_come_from_etc_passwd(
    journal: Journal, host: Path, changes: OwnerChanges, refusal: str
) -> None:
    desc = description(host, **changes)
    journal.create_run(desc, intents=[])
    with pytest.raises(BrokerRefused, match=refusal):
        carry_out("launch-v1", attested=attestation(desc))


def test_a_project_that_is_not_the_owners_plain_directory_is_never_pinned(
    journal: Journal, host: Path
) -> None:
    link = host / "home/owner/link"
    link.symlink_to(host / "home/victim")
    desc = description(host, project=ProjectSpec(root=str(link), owner_uid=ME,
                                                 on_pool_fs=False))
    journal.create_run(desc, intents=[])
    with pytest.raises(BrokerRefused, match=f"project {link} is not a directory"):
        carry_out("launch-v1", attested=attestation(desc))
    assert pinned_hash() is None


def test_a_project_reached_through_a_linked_parent_is_never_pinned(
    journal: Journal, host: Path
) -> None:
    (host / "home/owner/via").symlink_to(host / "home/victim")
    (host / "home/victim/project").mkdir()
    through = host / "home/owner/via/project"
    desc = description(host, project=ProjectSpec(root=str(through), owner_uid=ME,
                                                 on_pool_fs=False))
    journal.create_run(desc, intents=[])
    with pytest.raises(BrokerRefused, match=f"project path {through} passes through a symlink"):
        carry_out("launch-v1", attested=attestation(desc))
    assert pinned_hash() is None


@pytest.mark.parametrize(
    "field",
    ["owner", "project", "argv", "write_paths", "source", "verifier"],
)
def test_a_description_rewritten_after_its_pin_is_refused_by_every_verb(
    journal: Journal, host: Path, field: str
) -> None:
    desc = description(host)
    journal.create_run(desc, intents=[])
    carry_out("launch-v1", attested=attestation(desc))
    forgeries: dict[str, dict[str, object]] = {
        "owner": {"owner_uid": ME + 1},
        "project": {"project": ProjectSpec(root=str(host / "home/victim"), owner_uid=ME,
                                           on_pool_fs=False)},
        "argv": {"profiles": {"tool": ProfileSpec(name="tool", kind="command",
                                                  argv=["/bin/sh", "-c", "id"])}},
        "write_paths": {"policy": desc.policy.model_copy(update={"write_paths": ["../**"]})},
        "source": {"source": "print('not reviewed')"},
        "verifier": {"apply_mode": "never"},
    }
    forged = forgeries[field]
    rewrite_launch(RUN, desc.model_copy(update=forged))
    for verb in ("launch-v1", "storage-v1"):
        with pytest.raises(BrokerRefused, match="is not the one its owner attested"):
            carry_out(verb)
    assert pinned_hash() == desc.launch_hash()


def test_a_row_carrying_another_runs_description_is_refused(journal: Journal, host: Path) -> None:
    mine, other = description(host), description(host, run_id=OTHER)
    journal.create_run(mine, intents=[])
    journal.create_run(other, intents=[])
    carry_out("launch-v1", attested=attestation(mine))
    carry_out("launch-v1", OTHER, attested=attestation(other))
    rewrite_launch(RUN, other)
    with pytest.raises(BrokerRefused, match=f"the journal's description of {RUN} names {OTHER}"):
        carry_out("storage-v1")


def test_an_upgrade_re_pins_a_new_source_on_the_owners_word_and_nothing_else(
    journal: Journal, host: Path
) -> None:
    desc = description(host)
    journal.create_run(desc, intents=[])
    carry_out("launch-v1", attested=attestation(desc))
    upgraded = desc.model_copy(update={"source": "print('v2')",
                                       "review_hash": "sha256:" + "d" * 64})
    rewrite_launch(RUN, upgraded)
    with pytest.raises(BrokerRefused, match="is not the one its owner attested"):
        carry_out("storage-v1")  # cairn alone cannot move it
    carry_out("launch-v1", attested=attestation(upgraded))
    assert pinned_hash() == upgraded.launch_hash()
    carry_out("storage-v1")
    widened = upgraded.model_copy(update={"limits": desc.limits.model_copy(
        update={"memory_max": 64 << 30})})
    rewrite_launch(RUN, widened)
    with pytest.raises(BrokerRefused,
                       match=f"{RUN} is pinned; an upgrade changes only its source, not limits"):
        carry_out("launch-v1", attested=attestation(widened))
    assert pinned_hash() == upgraded.launch_hash()


def test_a_project_replaced_after_the_pin_is_not_the_one_root_acts_on(
    journal: Journal, host: Path
) -> None:
    desc = description(host)
    start = Intent(intent_id="prepare-q", run_id=RUN, kind="prepare-q")
    journal.create_run(desc, intents=[start])
    carry_out("launch-v1", attested=attestation(desc))
    project = Path(desc.project.root)
    project.rename(project.with_name("moved"))
    project.mkdir()
    with pytest.raises(BrokerRefused, match="is not the directory .* was launched on"):
        carry_out("storage-v1")


def test_an_ended_run_is_never_pinned(journal: Journal, host: Path) -> None:
    desc = description(host)
    journal.create_run(desc, intents=[])
    journal.fail_unstarted_run(RUN, "test")
    with pytest.raises(BrokerRefused, match="has ended; it is not pinned"):
        carry_out("launch-v1", attested=attestation(desc))


NOBODY = 2**31 - 7  # a uid with no account on any test host


@pytest.mark.parametrize(
    ("owners", "attested_by", "refusal"),
    [
        ((ME, ME + 1), ME + 1, f"{RUN}'s project is not its owner's"),
        ((NOBODY, NOBODY), NOBODY, f"uid {NOBODY} has no account on this host"),
    ],
)
def test_the_owner_is_the_projects_owner_with_an_account_here(
    journal: Journal, host: Path, owners: tuple[int, int], attested_by: int, refusal: str
) -> None:
    owner, project_owner = owners
    desc = description(host, owner_uid=owner, project=ProjectSpec(
        root=str(host / "home/owner/project"), owner_uid=project_owner, on_pool_fs=False))
    journal.create_run(desc, intents=[])
    with pytest.raises(BrokerRefused, match=refusal):
        carry_out("launch-v1", attested=attestation(desc, uid=attested_by))
    assert pinned_hash() is None


@pytest.mark.parametrize("planted", ["gone", "someone else's"])
def test_a_project_gone_or_not_the_owners_is_never_pinned(
    journal: Journal, host: Path, planted: str
) -> None:
    desc = description(host)
    project = Path(desc.project.root)
    journal.create_run(desc, intents=[])
    if planted == "gone":
        project.rmdir()
        refusal = f"project {project} is gone: No such file or directory"
    else:
        os.chown(project, ME + 1, -1)
        refusal = f"project {project} is not owned by the run's owner"
    with pytest.raises(BrokerRefused, match=refusal):
        carry_out("launch-v1", attested=attestation(desc))
    assert pinned_hash() is None


def test_an_upgrade_never_moves_a_run_to_another_project_directory(
    journal: Journal, host: Path
) -> None:
    desc = description(host)
    journal.create_run(desc, intents=[])
    carry_out("launch-v1", attested=attestation(desc))
    project = Path(desc.project.root)
    project.rename(project.with_name("moved"))
    project.mkdir()  # same path, the owner's, but not the directory that was attested
    upgraded = desc.model_copy(update={"source": "print('v2')"})
    rewrite_launch(RUN, upgraded)
    with pytest.raises(BrokerRefused, match=f"{RUN} is pinned to another owner or project"):
        carry_out("launch-v1", attested=attestation(upgraded))
    assert pinned_hash() == desc.launch_hash()


def test_a_pin_whose_description_names_another_run_is_refused(
    journal: Journal, host: Path
) -> None:
    """Root's own database is the last word, yet a pin must agree with itself."""
    desc = description(host)
    journal.create_run(desc, intents=[])
    st = os.lstat(desc.project.root)
    store = ReceiptStore()
    try:
        store.put_pin(Pin(run_id=RUN, owner_uid=ME, owner_gid=ACCOUNT.pw_gid,
                          launch_hash=desc.launch_hash(), project_dev=st.st_dev,
                          project_ino=st.st_ino,
                          description=description(host, run_id=OTHER).model_dump_json()),
                      pid=os.getpid())
    finally:
        store.close()
    with pytest.raises(BrokerRefused, match=f"the pin of {RUN} does not match its own"):
        carry_out("storage-v1")
