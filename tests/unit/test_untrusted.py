"""Files a less trusted process left (ARCHITECTURE §8): the helper, every call site that
reads one, and a check that nothing reads such a place any other way.

Runs as root (device nodes, other owners); the cases that need root skip otherwise.
"""

from __future__ import annotations

import ast
import base64
import errno
import functools
import hashlib
import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cairn import paths, storage, untrusted
from cairn.broker import candidate as candidate_unit
from cairn.broker import units
from cairn.coordinator.base import OperationError
from cairn.coordinator.core import Coordinator
from cairn.errors import CairnError, SystemdError
from cairn.journal.readwrite import Journal
from cairn.journal.rows import OpRow
from cairn.protocol.control import CallRequest
from cairn.protocol.launch import LaunchDescription, ProfileSpec, ProjectSpec
from cairn.settle.diff import unified_diff
from cairn.unitprops import RECORD_SERVICE_RESULT, SERVICE_RESULT_FILE
from cairn.worker import candidate
from cairn.worker.__main__ import write_result
from cairn.workflow.review import review_source

REPO = Path(__file__).resolve().parents[2]
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="needs root (other owners, device nodes)")
OWNER = 1001  # the run owner of the launch descriptions below
OTHER = 1002  # another user
RUN = "flow_" + "cd" * 16
SOURCE = (resources.files("cairn.builtin") / "workflows" / "implement.py").read_text()


def within(seconds: float, func: Callable[[], Any]) -> Any:
    """``func()``'s result, failing the test (instead of hanging it) if it blocks."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = func()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"blocked for more than {seconds} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def owned(path: Path, uid: int) -> Path:
    if ROOT:
        os.lchown(path, uid, uid)
    return path


@pytest.fixture(params=["openat2", "walk"])
def impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every helper test runs on both resolvers: openat2 and the O_NOFOLLOW walk."""
    if request.param == "walk":
        monkeypatch.setattr(untrusted, "openat2_works", False)
    else:
        monkeypatch.setattr(untrusted, "openat2_works", None)
    return str(request.param)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A trusted directory holding what an agent could leave in it."""
    base = tmp_path / "outputs"
    base.mkdir()
    uid = os.geteuid()
    (base / "good.json").write_text('{"a": 1}')
    os.mkdir(base / "sub")
    (base / "sub" / "deep.txt").write_text("deep")
    secret = tmp_path / "elsewhere"
    secret.mkdir()
    (secret / "secret.txt").write_text("SECRET")
    os.symlink(secret / "secret.txt", base / "link.txt")
    os.symlink(secret, base / "linkdir")
    os.mkfifo(base / "fifo")
    os.mkdir(base / "dir")
    (base / "big").write_bytes(b"x" * 100)
    (base / "linked").write_text("one inode, two names")
    os.link(base / "linked", tmp_path / "second-name")
    for p in base.rglob("*"):
        owned(p, uid)
    return base


# --- the helper -------------------------------------------------------------------------


def test_happy_path_reads_json_text_bytes(tree: Path, impl: str) -> None:
    me = os.geteuid()
    assert untrusted.read_json(tree, "good.json", owner=me, limit=100) == {"a": 1}
    assert untrusted.read_text(tree, "sub/deep.txt", owner=me, limit=4) == "deep"
    assert untrusted.read_bytes(tree, "good.json", owner=[OTHER, me], limit=8) == b'{"a": 1}'
    if impl == "openat2":
        assert untrusted.openat2_works is True  # the kernel path really was taken


def test_a_dir_fd_is_a_trusted_base(tree: Path, impl: str) -> None:
    fd = os.open(tree / "sub", os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert untrusted.read_text(fd, "deep.txt", owner=os.geteuid(), limit=10) == "deep"
        os.fstat(fd)  # the caller's fd stays open
    finally:
        os.close(fd)


def test_a_final_symlink_is_never_followed(tree: Path, impl: str) -> None:
    with pytest.raises(untrusted.UntrustedFileError, match="symbolic link") as info:
        untrusted.read_bytes(tree, "link.txt", owner=None, limit=100)
    assert not isinstance(info.value, untrusted.UntrustedFileMissing)
    assert "SECRET" not in str(info.value)


def test_a_symlink_in_a_parent_component_is_never_followed(tree: Path, impl: str) -> None:
    with pytest.raises(untrusted.UntrustedFileError, match="symbolic link|not a directory"):
        untrusted.read_bytes(tree, "linkdir/secret.txt", owner=None, limit=100)


def test_a_fifo_is_refused_without_blocking(tree: Path, impl: str) -> None:
    with pytest.raises(untrusted.UntrustedFileError, match="FIFO"):
        within(5, lambda: untrusted.read_bytes(tree, "fifo", owner=None, limit=100))


def test_a_directory_is_refused(tree: Path, impl: str) -> None:
    with pytest.raises(untrusted.UntrustedFileError, match="a directory"):
        untrusted.read_bytes(tree, "dir", owner=None, limit=100)


@needs_root
def test_a_device_node_is_refused(tree: Path, impl: str) -> None:
    try:
        os.mknod(tree / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod not permitted here")
    with pytest.raises(untrusted.UntrustedFileError, match="character device"):
        within(5, lambda: untrusted.read_bytes(tree, "null", owner=None, limit=100))
    assert not untrusted.is_regular_file(tree, "null", owner=None)


@needs_root
def test_another_owner_is_refused(tree: Path, impl: str) -> None:
    os.chown(tree / "good.json", OTHER, OTHER)
    with pytest.raises(untrusted.UntrustedFileError, match=f"uid {OTHER}, not {OWNER}"):
        untrusted.read_bytes(tree, "good.json", owner=OWNER, limit=100)
    assert untrusted.read_bytes(tree, "good.json", owner=(OWNER, OTHER), limit=100)
    assert untrusted.read_bytes(tree, "good.json", owner=None, limit=100)


def test_an_oversized_file_is_refused(tree: Path, impl: str) -> None:
    with pytest.raises(untrusted.UntrustedFileError, match="larger than 99 bytes"):
        untrusted.read_bytes(tree, "big", owner=None, limit=99)
    assert len(untrusted.read_bytes(tree, "big", owner=None, limit=100)) == 100


def test_more_bytes_than_fstat_promised_are_refused(impl: str) -> None:
    """/proc files say size 0 and then deliver more: the read itself is bounded."""
    status = Path("/proc/self")
    assert os.stat(status / "status").st_size == 0
    with pytest.raises(untrusted.UntrustedFileError, match="larger than 10 bytes"):
        untrusted.read_bytes(status, "status", owner=None, limit=10)


def test_a_hard_link_is_refused_unless_allowed(tree: Path, impl: str) -> None:
    with pytest.raises(untrusted.UntrustedFileError, match="2 hard links"):
        untrusted.read_bytes(tree, "linked", owner=None, limit=100)
    assert untrusted.read_bytes(tree, "linked", owner=None, limit=100, single_link=False)
    assert not untrusted.is_regular_file(tree, "linked", owner=None)


def test_a_missing_file_is_its_own_error(tree: Path, impl: str) -> None:
    with pytest.raises(untrusted.UntrustedFileMissing):
        untrusted.read_bytes(tree, "nothing", owner=None, limit=100)
    with pytest.raises(untrusted.UntrustedFileMissing):
        untrusted.read_bytes(tree, "no-dir/nothing", owner=None, limit=100)


@pytest.mark.parametrize("rel", ["", "/etc/passwd", "../outputs/good.json", "sub/../good.json",
                                 "./good.json", "sub//deep.txt", "a\0b"])
def test_only_plain_relative_paths(tree: Path, rel: str) -> None:
    with pytest.raises(untrusted.UntrustedFileError, match="not a plain relative path"):
        untrusted.read_bytes(tree, rel, owner=None, limit=100)


def test_errors_are_one_line_cairn_errors(tree: Path, impl: str) -> None:
    with pytest.raises(CairnError) as info:
        within(5, lambda: untrusted.read_bytes(tree, "fifo", owner=None, limit=100))
    assert isinstance(info.value, untrusted.UntrustedFileError)
    assert "\n" not in str(info.value) and info.value.reason == "a FIFO, not a regular file"


def test_bad_json_and_text(tree: Path, impl: str) -> None:
    (tree / "bad").write_bytes(b"\xff{")
    with pytest.raises(untrusted.UntrustedFileError, match="not valid JSON"):
        untrusted.read_json(tree, "bad", owner=None, limit=100)
    with pytest.raises(untrusted.UntrustedFileError, match="not UTF-8"):
        untrusted.read_text(tree, "bad", owner=None, limit=100)


def test_is_regular_file_answers_safely(tree: Path, impl: str) -> None:
    me = os.geteuid()
    assert untrusted.is_regular_file(tree, "good.json", owner=me)
    for rel in ("link.txt", "linkdir/secret.txt", "dir", "nothing", "linked"):
        assert not untrusted.is_regular_file(tree, rel, owner=me), rel
    assert not within(5, lambda: untrusted.is_regular_file(tree, "fifo", owner=me))
    if ROOT:
        assert not untrusted.is_regular_file(tree, "good.json", owner=OTHER)


def test_lstat_and_readlink_follow_no_parent(tree: Path, impl: str) -> None:
    assert stat.S_ISLNK(untrusted.lstat(tree, "link.txt").st_mode)
    assert untrusted.readlink(tree, "link.txt").endswith("elsewhere/secret.txt")
    assert stat.S_ISREG(untrusted.lstat(tree, "sub/deep.txt").st_mode)
    with pytest.raises(untrusted.UntrustedFileError) as info:
        untrusted.lstat(tree, "linkdir/secret.txt")
    assert not isinstance(info.value, untrusted.UntrustedFileMissing)
    with pytest.raises(untrusted.UntrustedFileError):
        untrusted.readlink(tree, "linkdir/secret.txt")
    with pytest.raises(untrusted.UntrustedFileMissing):
        untrusted.lstat(tree, "sub/nothing")


def test_write_new_replaces_a_planted_link_without_writing_through(tree: Path) -> None:
    victim = tree.parent / "elsewhere" / "secret.txt"
    os.symlink(victim, tree / "plan.json")
    untrusted.write_new(tree, "plan.json", b"[]", mode=0o644, uid=OWNER, gid=OWNER)
    assert victim.read_text() == "SECRET"
    st = os.lstat(tree / "plan.json")
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644
    assert (tree / "plan.json").read_bytes() == b"[]"
    if ROOT:
        assert (st.st_uid, st.st_gid) == (OWNER, OWNER)
    with pytest.raises(untrusted.UntrustedFileError, match="a directory"):
        untrusted.write_new(tree, "dir", b"[]", mode=0o644, uid=OWNER, gid=OWNER)


def test_without_openat2_the_walk_takes_over(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel without openat2 (ENOSYS) or a seccomp filter (EPERM): same answers."""

    def refused(dir_fd: int, rel: str, flags: int) -> int:
        raise OSError(errno.ENOSYS, "no openat2")

    monkeypatch.setattr(untrusted, "_openat2", refused)
    monkeypatch.setattr(untrusted, "openat2_works", None)
    assert untrusted.read_text(tree, "sub/deep.txt", owner=None, limit=10) == "deep"
    assert untrusted.openat2_works is False
    with pytest.raises(untrusted.UntrustedFileError, match="symbolic link"):
        untrusted.read_bytes(tree, "link.txt", owner=None, limit=100)


# --- the coordinator ----------------------------------------------------------------------


@pytest.fixture
def desc() -> LaunchDescription:
    review = review_source(SOURCE, filename="implement.py")
    return LaunchDescription(
        run_id=RUN, owner_uid=OWNER, owner_gid=OWNER, owner_name="alice",
        definition="builtin:implement", source=SOURCE, source_filename="implement.py",
        review_hash=review.review_hash, review=review.model_dump(mode="json"),
        args={"objective": "x"},
        project=ProjectSpec(root="/home/alice/p", owner_uid=OWNER, on_pool_fs=False),
        profiles={"builtin:implementer": ProfileSpec(name="builtin:implementer",
                                                     kind="scripted")},
        cairn_version="0", created_at=time.time(),
    )


@pytest.fixture
def coordinator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, desc: LaunchDescription
) -> Coordinator:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    paths.journal_path().parent.mkdir(parents=True)
    with Journal(paths.journal_path(), create=True) as journal:
        journal.create_run(desc, intents=[])
    c = Coordinator(RUN)
    c.token = c.journal.acquire_lease(RUN, c.lease.holder)
    return c


def agent_op(c: Coordinator) -> OpRow:
    call = CallRequest(scope="root", seq=1, kind="agent",
                       request={"descriptor": "implement", "prompt": "x", "title": "t"},
                       location="implement.py:25:14")
    c.journal.record_requested(call, run_id=RUN, op_id="root-1", predecessor=None,
                               token=c.token)
    c.journal.update_op(RUN, "root-1", token=c.token, state="started")
    return c.journal.get_op_by_id(RUN, "root-1")


def outputs_of(c: Coordinator, op: OpRow) -> Path:
    out = c.context.outputs_dir(op.op_id, op.attempt)
    out.mkdir(parents=True)
    os.chmod(out, 0o777)
    return out


FINISH: dict[str, Any] = {"output": {"summary": "done"}, "handoff": "h"}


def plant(out: Path, name: str, kind: str, tmp_path: Path, content: str) -> None:
    """What an agent could leave at ``out/name`` instead of its own file."""
    target = out / name
    if kind == "own":
        target.write_text(content)
        owned(target, OWNER)
    elif kind == "symlink":  # to another user's run: readable by the coordinator
        victim = tmp_path / "other-run" / name
        victim.parent.mkdir(exist_ok=True)
        victim.write_text(content)
        owned(victim, OWNER)
        os.symlink(victim, target)
    elif kind == "fifo":
        os.mkfifo(target)
        owned(target, OWNER)
    elif kind == "directory":
        target.mkdir()
        owned(target, OWNER)
    elif kind == "wrong-owner":
        target.write_text(content)
        owned(target, OTHER)
    elif kind == "oversized":  # sparse, larger than every limit
        target.write_text(content)
        os.truncate(target, 80 << 20)
        owned(target, OWNER)
    elif kind == "hard-link":
        elsewhere = tmp_path / "kept"
        elsewhere.write_text(content)
        owned(elsewhere, OWNER)
        os.link(elsewhere, target)
    else:
        raise AssertionError(kind)


HOSTILE = ["symlink", "fifo", "directory", "wrong-owner", "oversized", "hard-link"]
# What the helper logs when it refuses each (so a test sees the refusal, not a mere None).
REFUSAL = {"symlink": "symbolic link", "fifo": "a FIFO", "directory": "a directory",
           "wrong-owner": f"belongs to uid {OTHER}", "oversized": "larger than",
           "hard-link": "2 hard links"}


def refused(caplog: pytest.LogCaptureFixture, kind: str) -> bool:
    return any(
        r.name == "cairn.untrusted" and "refused" in r.getMessage()
        and REFUSAL[kind] in r.getMessage()
        for r in caplog.records
    )


def test_read_result_file_accepts_the_owners_file(coordinator: Coordinator, tmp_path: Path) -> None:
    """Written the way the worker writes it (as the owner, in the unit)."""
    op = agent_op(coordinator)
    out = outputs_of(coordinator, op)
    write_result(FINISH["output"], "h", out / "finish.json")
    owned(out / "finish.json", OWNER)
    model = coordinator.context.models[coordinator.context.review["agents"]["implement"]["output"]]
    message = coordinator.agents.read_result_file(op, model)
    assert message is not None and message.output == {"summary": "done"}


@pytest.mark.parametrize("kind", HOSTILE)
def test_read_result_file_refuses_what_is_not_the_agents_own_file(
    coordinator: Coordinator, tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    if kind in ("wrong-owner",) and not ROOT:
        pytest.skip("needs root")
    op = agent_op(coordinator)
    plant(outputs_of(coordinator, op), "finish.json", kind, tmp_path, json.dumps(FINISH))
    model = coordinator.context.models[coordinator.context.review["agents"]["implement"]["output"]]
    assert within(5, lambda: coordinator.agents.read_result_file(op, model)) is None
    assert refused(caplog, kind)


def test_fail_if_limit_hit_reads_the_owners_record(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    """Written by the unit's own ExecStopPost command (as the owner)."""
    op = agent_op(coordinator)
    record = outputs_of(coordinator, op) / "service-result"
    command = RECORD_SERVICE_RESULT.replace(SERVICE_RESULT_FILE, str(record))
    env = {"SERVICE_RESULT": "oom-kill", "EXIT_CODE": "killed", "EXIT_STATUS": "9"}
    subprocess.run(["/bin/sh", "-c", command], env=env, check=True)
    owned(record, OWNER)
    with pytest.raises(OperationError, match="OOM killer"):
        coordinator.agents.recovery.fail_if_limit_hit(op)


@pytest.mark.parametrize("kind", HOSTILE)
def test_fail_if_limit_hit_ignores_a_planted_record(
    coordinator: Coordinator, tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    if kind in ("wrong-owner",) and not ROOT:
        pytest.skip("needs root")
    op = agent_op(coordinator)
    plant(outputs_of(coordinator, op), "service-result", kind, tmp_path, "oom-kill 2 9\n")
    assert within(5, lambda: coordinator.agents.recovery.fail_if_limit_hit(op)) is None
    assert refused(caplog, kind)


# --- the broker (root) ------------------------------------------------------------------


def broker_outputs(desc: LaunchDescription, op_id: str, attempt: int) -> Path:
    out = paths.run_state_dir(desc.run_id) / "ops" / op_id / f"outputs.{attempt}"
    out.mkdir(parents=True)
    return out


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    return tmp_path


def test_stop_agent_sees_the_owners_result_file(desc: LaunchDescription, host: Path) -> None:
    plant(broker_outputs(desc, "root-1", 1), "finish.json", "own", host, "{}")
    assert units.result_file_written(desc, "root-1", 1)
    assert not units.result_file_written(desc, "root-1", 2)


@pytest.mark.parametrize("kind", HOSTILE)
def test_stop_agent_is_not_fooled_by_a_planted_result_file(
    desc: LaunchDescription, host: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    if kind in ("wrong-owner",) and not ROOT:
        pytest.skip("needs root")
    plant(broker_outputs(desc, "root-1", 1), "finish.json", kind, host, "{}")
    expected = kind == "oversized"  # presence only: its size is the reader's business
    assert within(5, lambda: units.result_file_written(desc, "root-1", 1)) is expected
    assert refused(caplog, kind) is not expected


class Reached(Exception):
    """start_agent got past reading the evidence index."""


def prepared_agent(desc: LaunchDescription, host: Path) -> tuple[Path, socket.socket]:
    op_dir = paths.run_state_dir(desc.run_id) / "ops" / "root-1"
    (op_dir / "evidence").mkdir(parents=True)
    (op_dir / "outputs.1").mkdir()
    channel = paths.agent_channel_dir(desc.run_id, "root-1")
    channel.mkdir(parents=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(paths.agent_socket_path(desc.run_id, "root-1")))
    return op_dir / "evidence", sock


@pytest.fixture
def short_host(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A host root short enough for the agent socket's path (AF_UNIX: 108 bytes)."""
    root = Path(tempfile.mkdtemp(prefix="cu", dir="/tmp"))
    monkeypatch.setenv("CAIRN_ROOT", str(root))
    yield root
    shutil.rmtree(root)


def start(desc: LaunchDescription, host: Path) -> None:
    units.start_agent(desc, "root-1", "none", 1, host / "w", {}, host / "scratch" / "root-1",
                      profile_sha256="")


def test_start_agent_reads_the_coordinators_index(
    desc: LaunchDescription, short_host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = short_host
    evidence, sock = prepared_agent(desc, host)
    with sock:
        (evidence / "index.json").write_text('{"incoming": []}')
        monkeypatch.setattr(units, "verified_capsule", lambda _h: (_ for _ in ()).throw(Reached()))
        with pytest.raises(Reached):
            start(desc, host)


class GoneUnits:
    """A systemd whose units are collected the moment they end: none is ever seen."""

    started: list[str] = []

    def __enter__(self) -> GoneUnits:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None

    def unit_state(self, _name: str) -> None:
        return None

    def start_transient_service(self, name: str, _properties: object) -> str:
        self.started.append(name)
        return "job"

    def wait_started(self, _job: str) -> None:
        return None


def test_start_agent_never_starts_an_attempt_twice(
    desc: LaunchDescription, short_host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker killed after starting an agent, before its receipt: the retried launch
    finds the unit gone (the agent finished) and must not run the attempt again."""
    host = short_host
    evidence, sock = prepared_agent(desc, host)
    release = SimpleNamespace(path=str(host / "capsule"), entry="worker.py", hash="sha256:x")
    monkeypatch.setattr(units, "verified_capsule", lambda _h: release)
    monkeypatch.setattr(units, "Systemd", GoneUnits)
    monkeypatch.setattr(units, "agent_unit_properties", lambda _spec: [])
    GoneUnits.started.clear()
    with sock:
        (evidence / "index.json").write_text('{"incoming": []}')
        first = units.start_agent(desc, "root-1", "none", 1, host / "w", {},
                                  host / "scratch" / "root-1", profile_sha256="")
        again = units.start_agent(desc, "root-1", "none", 1, host / "w", {},
                                  host / "scratch" / "root-1", profile_sha256="")
    assert GoneUnits.started == [first.unit] and again.unit == first.unit


@pytest.mark.parametrize("kind", ["symlink", "fifo", "wrong-owner", "oversized"])
def test_start_agent_refuses_a_planted_index(
    desc: LaunchDescription, short_host: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    if not ROOT:
        pytest.skip("needs root")
    host = short_host
    evidence, sock = prepared_agent(desc, host)
    with sock:
        if kind == "wrong-owner":
            (evidence / "index.json").write_text('{"incoming": []}')
            os.chown(evidence / "index.json", OWNER, OWNER)  # not the coordinator's
        else:
            plant(evidence, "index.json", kind, host, '{"incoming": []}')
        monkeypatch.setattr(units, "verified_capsule", lambda _h: (_ for _ in ()).throw(Reached()))
        with pytest.raises(untrusted.UntrustedFileError):
            within(5, lambda: start(desc, host))


def test_start_agent_waits_for_a_real_socket_not_a_planted_link(
    desc: LaunchDescription, short_host: Path
) -> None:
    """An earlier attempt's agent wrote in the channel directory: a link to some socket
    is not the coordinator listening, and a planted model.sock binds no relay."""
    host = short_host
    evidence, sock = prepared_agent(desc, host)
    channel = paths.agent_channel_dir(desc.run_id, "root-1")
    with sock:
        os.rename(channel / "agent.sock", host / "elsewhere.sock")
        os.symlink(host / "elsewhere.sock", channel / "agent.sock")
        os.symlink(host / "elsewhere.sock", channel / "model.sock")
        assert units._socket_in(host, "elsewhere.sock")
        assert not units._socket_in(channel, "agent.sock")
        assert units._model_relay(desc, "root-1") == {}
        with pytest.raises(units.ChannelNotReady):
            start(desc, host)


@pytest.fixture
def no_units(monkeypatch: pytest.MonkeyPatch) -> list[Callable[[], None]]:
    """run_helper without systemd: runs what the test says the unit would do."""
    actions: list[Callable[[], None]] = []

    def fake_run_helper(spec: Any, name: str, timeout: float) -> dict[str, Any]:
        for action in actions:
            action()
        return {"unit": name, "invocation_id": "x"}

    monkeypatch.setattr(units, "run_helper", fake_run_helper)
    return actions


def test_run_import_reads_the_owners_stats(
    desc: LaunchDescription, host: Path, no_units: list[Callable[[], None]]
) -> None:
    staging = host / "pool" / "Q.import"
    staging.mkdir(parents=True)
    result = staging.parent / "import-result"
    no_units.append(lambda: plant(result, "stats.json", "own", host, '{"files": 3}'))
    done = units.run_import(desc, host / "project", staging)
    assert done.stats is None and done.stats_raw is not None  # recorded, never parsed
    assert base64.b64decode(done.stats_raw.b64) == b'{"files": 3}'
    assert done.stats_raw.sha256 == hashlib.sha256(b'{"files": 3}').hexdigest()


@pytest.mark.parametrize("kind", HOSTILE)
def test_run_import_refuses_planted_stats(
    desc: LaunchDescription, host: Path, no_units: list[Callable[[], None]], kind: str
) -> None:
    if kind == "wrong-owner" and not ROOT:
        pytest.skip("needs root")
    staging = host / "pool" / "Q.import"
    staging.mkdir(parents=True)
    result = staging.parent / "import-result"
    no_units.append(lambda: plant(result, "stats.json", kind, host, '{"files": 3}'))
    with pytest.raises(untrusted.UntrustedFileError):
        within(5, lambda: units.run_import(desc, host / "project", staging))


APPLIED = {"status": "applied", "applied": ["a"], "already_applied": [], "conflicts": []}


def test_run_apply_replaces_a_planted_plan_and_reads_the_owners_result(
    desc: LaunchDescription, host: Path, no_units: list[Callable[[], None]]
) -> None:
    work = host / "scratch" / "apply"
    work.mkdir(parents=True)
    victim = host / "victim"
    victim.write_text("root's file")
    os.symlink(victim, work / "plan.json")  # left by an earlier attempt
    no_units.append(lambda: plant(work, "result.json", "own", host, json.dumps(APPLIED)))
    out = units.run_apply(desc, 1, host / "q", host / "f", "", ["a"], work)
    assert out["result"]["applied"] == ["a"]
    assert victim.read_text() == "root's file"
    assert json.loads((work / "plan.json").read_text()) == ["a"]
    assert not (work / "plan.json").is_symlink()


@pytest.mark.parametrize("kind", HOSTILE)
def test_run_apply_refuses_a_planted_result(
    desc: LaunchDescription, host: Path, no_units: list[Callable[[], None]], kind: str
) -> None:
    if kind == "wrong-owner" and not ROOT:
        pytest.skip("needs root")
    work = host / "scratch" / "apply"
    work.mkdir(parents=True)
    no_units.append(lambda: plant(work, "result.json", kind, host, json.dumps(APPLIED)))
    with pytest.raises(untrusted.UntrustedFileError):
        within(5, lambda: units.run_apply(desc, 1, host / "q", host / "f", "", ["a"], work))


CANDIDATE = {"accepted": ["a"], "refused": [], "bytes_accepted": 1,
             "inventories_equal": False, "diff": "+a\n"}


def run_candidate(desc: LaunchDescription, host: Path, work: Path) -> Any:
    unit, result = candidate_unit.run_candidate(
        desc, host / "q", host / "p", host / "c", "", ("stream", b"s"), work
    )
    assert unit["unit"] == f"cairn-candidate-{desc.run_id}.service"
    return result


def test_run_candidate_replaces_planted_inputs_and_reads_the_owners_result(
    desc: LaunchDescription, host: Path, no_units: list[Callable[[], None]]
) -> None:
    work = host / "scratch" / "candidate"
    work.mkdir(parents=True)
    victim = host / "victim"
    victim.write_text("root's file")
    os.symlink(victim, work / "stream")  # left by an earlier attempt
    os.symlink(victim, work / "record")  # an earlier attempt's: not this one's changes
    os.symlink(victim, work / "policy.json")
    no_units.append(lambda: plant(work, "result.json", "own", host, json.dumps(CANDIDATE)))
    out = run_candidate(desc, host, work)
    assert out.accepted == ["a"] and out.diff == "+a\n"
    assert victim.read_text() == "root's file"
    assert (work / "stream").read_bytes() == b"s"
    assert not os.path.lexists(work / "record")
    assert json.loads((work / "policy.json").read_text()) == desc.policy.model_dump()


@pytest.mark.parametrize("kind", HOSTILE)
def test_run_candidate_refuses_a_planted_result(
    desc: LaunchDescription, host: Path, no_units: list[Callable[[], None]], kind: str
) -> None:
    if kind == "wrong-owner" and not ROOT:
        pytest.skip("needs root")
    work = host / "scratch" / "candidate"
    work.mkdir(parents=True)
    no_units.append(lambda: plant(work, "result.json", kind, host, json.dumps(CANDIDATE)))
    with pytest.raises(untrusted.UntrustedFileError):
        within(5, lambda: run_candidate(desc, host, work))


TRIAL = {"refused": [{"path": "bench.py", "reason": "outside the write paths"}],
         "refused_count": 1}


def test_run_trial_check_records_the_owners_result_unparsed(
    desc: LaunchDescription, host: Path, no_units: list[Callable[[], None]]
) -> None:
    work = host / "scratch" / "trial"
    work.mkdir(parents=True)
    body = json.dumps(TRIAL) + "\x1b[2J not json"  # root neither parses nor decodes it
    no_units.append(lambda: plant(work, "result.json", "own", host, body))
    name = candidate_unit.trial_unit_name(desc.run_id, "root-3", 1)
    checked = candidate_unit.run_trial_check(desc, host / "q", host / "t", "", ("record", b"s"),
                                             work, name)
    assert checked.unit == name == f"cairn-trial-{desc.run_id}-root-3-1.service"
    assert base64.b64decode(checked.result_raw.b64) == body.encode()
    assert (work / "record").read_bytes() == b"s"


@pytest.mark.parametrize("kind", HOSTILE)
def test_run_trial_check_refuses_a_planted_result(
    desc: LaunchDescription, host: Path, no_units: list[Callable[[], None]], kind: str
) -> None:
    if kind == "wrong-owner" and not ROOT:
        pytest.skip("needs root")
    work = host / "scratch" / "trial"
    work.mkdir(parents=True)
    no_units.append(lambda: plant(work, "result.json", kind, host, json.dumps(TRIAL)))
    with pytest.raises(untrusted.UntrustedFileError):
        within(5, lambda: candidate_unit.run_trial_check(
            desc, host / "q", host / "t", "", ("stream", b"s"), work, "cairn-trial-x.service"))


@pytest.mark.parametrize(
    "path", ["/etc/shadow", "../outside", "a/../../b", "", "a//b", "./a"]
)
def test_run_candidate_refuses_a_result_naming_paths_outside_the_project(
    desc: LaunchDescription, host: Path, no_units: list[Callable[[], None]], path: str
) -> None:
    work = host / "scratch" / "candidate"
    work.mkdir(parents=True)
    body = json.dumps({**CANDIDATE, "accepted": [path]})
    no_units.append(lambda: plant(work, "result.json", "own", host, body))
    with pytest.raises(CairnError, match="invalid result"):
        run_candidate(desc, host, work)


def test_run_candidate_passes_an_option_like_subpath_whole(
    desc: LaunchDescription, host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = host / "scratch" / "candidate"
    work.mkdir(parents=True)
    seen: list[list[str]] = []

    def unit(spec: Any, name: str, timeout: float) -> dict[str, Any]:
        seen.append(spec.exec_argv)
        plant(work, "result.json", "own", host, json.dumps(CANDIDATE))
        return {"unit": name, "invocation_id": "x"}

    monkeypatch.setattr(units, "run_helper", unit)
    candidate_unit.run_candidate(desc, host / "q", host / "p", host / "c", "-x/proj",
                                 ("stream", b"s"), work)
    module = seen[0].index("cairn.worker.candidate")
    args = candidate.parse_args(seen[0][module + 1 :])
    assert args.subpath == "-x/proj" and str(args.work) == "/candidate"


@pytest.mark.parametrize("planted", ["own", "symlink", None])
def test_run_candidate_failure_says_why_only_from_a_real_file(
    desc: LaunchDescription, host: Path, monkeypatch: pytest.MonkeyPatch, planted: str | None
) -> None:
    work = host / "scratch" / "candidate"
    work.mkdir(parents=True)
    failure = json.dumps({"message": "cannot write a in the candidate: No space", "hint": "h"})

    def failing_unit(spec: Any, name: str, timeout: float) -> dict[str, Any]:
        if planted:
            plant(work, "failure.json", planted, host, failure)
        raise SystemdError(f"{name} failed (exit-code, status 1)", hint="see journalctl")

    monkeypatch.setattr(units, "run_helper", failing_unit)
    with pytest.raises(CairnError) as caught:
        run_candidate(desc, host, work)
    if planted == "own":
        assert caught.value.message.startswith("cannot write a in the candidate")
        assert caught.value.hint == "h"
    else:
        assert "failed (exit-code" in caught.value.message


ASKS_FOR_THE_STREAM = json.dumps({"message": "the owner may not read /p/docs", "hint": "",
                                  "send_stream": True})


@pytest.mark.parametrize("first", ["record", "stream"])
def test_a_unit_that_cannot_read_the_record_gets_the_send_stream_once(
    desc: LaunchDescription, host: Path, monkeypatch: pytest.MonkeyPatch, first: str
) -> None:
    """A trial's check may ask for the send stream instead of root's record (it could
    not list a directory the agent shut): root hands it over and runs the unit once more;
    asked again, or handed the stream already, the failure is the unit's to explain. A
    candidate's unit asking so raises StreamNeeded (build_c makes C afresh for it)."""
    work = host / "scratch" / "trial"
    work.mkdir(parents=True)
    handed: list[bytes] = []

    def unit(spec: Any, name: str, timeout: float) -> dict[str, Any]:
        handed.append((work / "record").read_bytes() if (work / "record").exists()
                      else b"stream:" + (work / "stream").read_bytes())
        if len(handed) == 1 or first == "stream":
            plant(work, "failure.json", "own", host, ASKS_FOR_THE_STREAM)
            raise SystemdError(f"{name} failed (exit-code, status 1)")
        plant(work, "result.json", "own", host, json.dumps(TRIAL))
        return {"unit": name, "invocation_id": "x"}

    monkeypatch.setattr(units, "run_helper", unit)
    monkeypatch.setattr(storage, "metadata_stream", lambda q, p: b"sent")
    source: candidate_unit.ChangeSource = (
        ("record", b"rec") if first == "record" else ("stream", b"rec"))
    run = functools.partial(candidate_unit.run_trial_check, desc, host / "q", host / "t", "",
                            source, work, "cairn-trial-x.service")
    if first == "stream":
        with pytest.raises(CairnError, match="may not read"):
            run()
        assert handed == [b"stream:rec"]
        return
    checked = run()
    assert handed == [b"rec", b"stream:sent"]
    assert base64.b64decode(checked.result_raw.b64) == json.dumps(TRIAL).encode()
    assert not (work / "record").exists() and not (work / "failure.json").exists()
    candidate_work = host / "scratch" / "candidate"
    candidate_work.mkdir()

    def asking_unit(spec: Any, name: str, timeout: float) -> dict[str, Any]:
        plant(candidate_work, "failure.json", "own", host, ASKS_FOR_THE_STREAM)
        raise SystemdError(f"{name} failed (exit-code, status 1)")

    monkeypatch.setattr(units, "run_helper", asking_unit)
    with pytest.raises(candidate_unit.StreamNeeded):
        candidate_unit.run_candidate(desc, host / "q", host / "p", host / "c", "",
                                     ("record", b"rec"), candidate_work)


def test_unified_diff_shows_text_and_never_follows_or_blocks(tmp_path: Path) -> None:
    q, f = tmp_path / "Q", tmp_path / "F"
    for root in (q, f):
        (root / "a").mkdir(parents=True)
    (q / "a" / "secret").write_text("q side\n")
    (q / "notes.txt").write_text("one\n")
    (f / "notes.txt").write_text("one\ntwo\n")
    os.mkfifo(q / "pipe")
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir()
    (elsewhere / "secret").write_text("ROOT ONLY\n")
    os.rmdir(f / "a")
    os.symlink(elsewhere, f / "a")  # the proposal made a/ a link out: a/secret "deleted"
    diff = within(10, lambda: unified_diff(q, f, "", ["a/secret", "notes.txt", "pipe"]))
    assert "+two" in diff
    assert "ROOT ONLY" not in diff and "q side" not in diff
    assert diff.count("(changed; not a text difference)") == 2


# --- every reader of an agent-writable place, and nothing else -------------------------

# (file, function, the helper functions it must call). Each reads what an agent or the
# run owner's helper unit wrote; each runs as a more trusted user (cairn or root).
READERS: list[tuple[str, str, set[str]]] = [
    ("coordinator/agentop.py", "AgentOperations.read_result_file", {"read_bytes"}),
    ("coordinator/agentop.py", "AgentOperations.read_invalid_file", {"read_bytes"}),
    ("coordinator/recovery.py", "Recovery.fail_if_limit_hit", {"read_text"}),
    ("broker/units.py", "evidence_index", {"read_bytes"}),  # evidence/index.json (cairn's)
    ("broker/units.py", "result_file_written", {"is_regular_file"}),
    ("broker/units.py", "run_import", {"read_bytes"}),
    ("broker/units.py", "run_apply", {"read_bytes", "write_new"}),
    ("broker/candidate.py", "_stage_candidate_work", {"remove", "write_new"}),
    ("broker/candidate.py", "_run_candidate_unit", {"read_bytes"}),
    ("broker/candidate.py", "run_candidate", {"read_bytes"}),
    ("broker/candidate.py", "run_trial_check", {"read_bytes"}),
    ("cairn/settle/diff.py", "_diff_side", {"lstat", "readlink", "read_bytes"}),
    ("broker/units.py", "_socket_in", {"lstat"}),  # agent.sock, model.sock in the channel
    ("cairn/artifacts.py", "collect", {"open_dir"}),  # /outputs/artifacts
    ("cairn/artifacts.py", "_walk_dir", {"list_names", "lstat"}),
    ("cairn/artifacts.py", "_walk_subdir", {"open_dir"}),
    ("cairn/artifacts.py", "_take_file", {"open_file"}),
]
# P, read by the owner's candidate unit (cairn.worker.candidate); root never reads it.
PENDING: list[tuple[str, str, set[str]]] = [
    ("cairn/settle/candidate.py", "_judge", {"lstat", "readlink"}),
    ("cairn/settle/candidate.py", "_install", {"open_file"}),
    ("cairn/settle/candidate.py", "_install_file", {"open_file"}),
    # inventories_equal, root, P's bytes
    ("cairn/settle/inventory.py", "_same_bytes", {"open_file"}),
]

# Where agent-written (or owner-written) files live, as the host names them; the last
# three: the owner's helper units.
MARKERS = ("finish.json", "result-invalid.json", "service-result", "stats.json", "/outputs",
           "/state", "/workspace", "/apply/", "/result/", "/candidate")
MARKER_NAMES = {"outputs_dir", "outputs", "result_dir", "agent_channel_dir", "agent_socket_path",
                "model_socket_path"}  # the channel directory is the agent's to write in too
READ_ATTRS = {"read_text", "read_bytes", "is_file", "is_fifo", "is_socket", "open", "load",
              "readlink", "lstat", "stat"}
SCANNED = ("cairn", "coordinator", "broker", "daemon")  # worker/ runs in the sandbox itself


def functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield f"{prefix}{node.name}", node
            yield from functions(node, f"{prefix}{node.name}.")


def plain_reads(func: ast.AST) -> list[str]:
    """Calls in ``func`` that open, read or stat a path some other way than the helper."""
    found = []
    for node in ast.walk(func):
        if not isinstance(node, ast.Call):
            continue
        target = node.func
        if isinstance(target, ast.Name) and target.id in ("open", "io_open"):
            found.append(f"line {node.lineno}: {target.id}()")
        if isinstance(target, ast.Attribute) and target.attr in READ_ATTRS:
            owner = target.value
            if isinstance(owner, ast.Name) and owner.id == "untrusted":
                continue
            if target.attr == "open" and "O_CREAT" in ast.unparse(node):
                continue  # a new file the caller creates (O_EXCL), not a read
            found.append(f"line {node.lineno}: .{target.attr}()")
    return found


def helper_calls(func: ast.AST) -> set[str]:
    return {
        node.func.attr
        for node in ast.walk(func)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "untrusted"
    }


def mentions_agent_place(func: ast.AST) -> bool:
    for node in ast.walk(func):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            docstring = isinstance(getattr(node, "parent", None), ast.Expr)
            if any(m in node.value for m in MARKERS) and not docstring:
                return True
        if isinstance(node, ast.Name) and node.id in MARKER_NAMES:
            return True
        if isinstance(node, ast.Attribute) and node.attr in MARKER_NAMES:
            return True
    return False


def parsed(rel: str) -> ast.Module:
    module = ast.parse((REPO / rel).read_text(), filename=rel)
    for node in ast.walk(module):  # docstrings name these places without reading them
        for child in ast.iter_child_nodes(node):
            child.parent = node  # type: ignore[attr-defined]
    return module


def check_reader(rel: str, name: str, helpers: set[str]) -> None:
    found = dict(functions(parsed(rel)))
    assert name in found, f"{rel}: {name} is gone; update READERS"
    func = found[name]
    assert helpers <= helper_calls(func), f"{rel}:{name} must read through untrusted.{helpers}"
    assert not plain_reads(func), f"{rel}:{name} reads another way: {plain_reads(func)}"


@pytest.mark.parametrize(("rel", "name", "helpers"), READERS)
def test_every_reader_of_an_agent_file_uses_the_helper(
    rel: str, name: str, helpers: set[str]
) -> None:
    check_reader(rel, name, helpers)


@pytest.mark.parametrize(("rel", "name", "helpers"), PENDING)
def test_settlement_reads_the_proposal_through_the_helper(
    rel: str, name: str, helpers: set[str]
) -> None:
    check_reader(rel, name, helpers)


def test_nothing_else_reads_an_agent_writable_place() -> None:
    """Any function of a host-side process that names where agents (or the owner's helper
    units) write must not open, read or stat anything except through the helper."""
    offenders = []
    for top in SCANNED:
        for file in sorted((REPO / top).rglob("*.py")):
            rel = str(file.relative_to(REPO))
            if rel == "cairn/untrusted.py":
                continue
            for name, func in functions(parsed(rel)):
                if mentions_agent_place(func) and plain_reads(func):
                    offenders.append(f"{rel}:{name}: {plain_reads(func)}")
    assert not offenders, "\n".join(offenders)


def test_the_scan_catches_the_old_ways(tmp_path: Path) -> None:
    """The checks above fail on the code this issue was about."""
    old = ast.parse(
        "def stop_agent(desc, op_id, attempt):\n"
        "    outputs = base / f'outputs.{attempt}'\n"
        "    return (outputs / 'finish.json').is_file()\n"
        "class C:\n"
        "    def read_result_file(self, op):\n"
        "        return json.loads((self.outputs_dir(op) / 'finish.json').read_text())\n"
        "    def fail_if_limit_hit(self, op):\n"
        "        return open(self.outputs_dir(op) / 'service-result').read()\n"
    )
    found = dict(functions(old))
    assert set(found) == {"stop_agent", "C.read_result_file", "C.fail_if_limit_hit"}
    for name in ("stop_agent", "C.read_result_file", "C.fail_if_limit_hit"):
        assert mentions_agent_place(found[name]) and plain_reads(found[name]), name
        assert not helper_calls(found[name])


def test_a_base_that_is_not_a_directory_or_a_name_too_long_is_an_error(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("x")
    with pytest.raises(untrusted.UntrustedFileError, match="cannot open: Not a directory"):
        untrusted.read_bytes(plain, "f", owner=os.getuid(), limit=10)
    with pytest.raises(untrusted.UntrustedFileError, match="cannot open: File name too long"):
        untrusted.read_bytes(tmp_path, "n" * 300, owner=os.getuid(), limit=10)


def test_readlink_of_what_is_not_a_link_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("x")
    (tmp_path / "link").symlink_to("/etc/shadow")
    assert untrusted.readlink(tmp_path, "link") == "/etc/shadow"  # read, never followed
    with pytest.raises(untrusted.UntrustedFileError, match="plain: Invalid argument"):
        untrusted.readlink(tmp_path, "plain")


def test_reads_through_kept_open_directories_refuse_what_a_path_read_refuses(
    tmp_path: Path,
) -> None:
    """``untrusted.Dirs`` as the base of lstat, readlink and open_file: the same answers
    and refusals as reading from the root, with each directory opened once."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"abc")
    (tmp_path / "d" / "link").symlink_to("f")
    (tmp_path / "up").symlink_to("d")
    os.mkfifo(tmp_path / "d" / "fifo")
    with untrusted.Dirs(tmp_path) as dirs:
        fd = untrusted.open_file(dirs, "d/f", owner=None, limit=3)
        try:
            assert os.read(fd, 10) == b"abc"
        finally:
            os.close(fd)
        assert stat.S_ISLNK(untrusted.lstat(dirs, "d/link").st_mode)
        assert untrusted.readlink(dirs, "d/link") == "f"
        with pytest.raises(untrusted.UntrustedFileError, match="symbolic link"):
            untrusted.open_file(dirs, "d/link", owner=None, limit=3)
        with pytest.raises(untrusted.UntrustedFileError, match="symbolic link"):
            untrusted.lstat(dirs, "up/f")
        with pytest.raises(untrusted.UntrustedFileError, match="FIFO"):
            untrusted.open_file(dirs, "d/fifo", owner=None, limit=3)
        with pytest.raises(untrusted.UntrustedFileError, match="larger than 2"):
            untrusted.open_file(dirs, "d/f", owner=None, limit=2)
        with pytest.raises(untrusted.UntrustedFileMissing):
            untrusted.lstat(dirs, "d/none")
        with pytest.raises(untrusted.UntrustedFileMissing):
            untrusted.lstat(dirs, "gone/f")
        with pytest.raises(untrusted.UntrustedFileError, match="plain relative"):
            untrusted.lstat(dirs, "d/../d/f")
        # a directory replaced by a link after it was opened: forget() makes it count
        assert dirs.fds
        os.rename(tmp_path / "d", tmp_path / "e")
        (tmp_path / "d").symlink_to("e")
        dirs.forget("d")
        with pytest.raises(untrusted.UntrustedFileError, match="symbolic link"):
            untrusted.lstat(dirs, "d/f")
