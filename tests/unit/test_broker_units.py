"""What root asks of PID 1 and how it reads the answers (broker/units.py), over a stand-in
for the manager that records every call (the real manager is the system tier's): the
allowlist proxy, helper units run to their end, a check's or evaluator's output read from
the journal, an agent adopted or started with its proxy and model relay, and a stop of a
unit that is already gone."""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_broker_pins import RUN, description

from cairn import paths, proc
from cairn.broker import units
from cairn.errors import BrokerRefused, NotFound, SystemdError
from cairn.netpolicy import PROXY_PORT
from cairn.protocol.attestation import launch_hash_of
from cairn.protocol.launch import (
    MODEL_API_ENV,
    MODEL_ENV,
    EvaluatorSpec,
    LaunchDescription,
    ModelRoute,
    ProfileSpec,
    VerifierSpec,
)
from cairn.rawbytes import raw_bytes
from cairn.systemd import UnitState
from cairn.unitprops import AgentUnitSpec, HelperUnitSpec, agent_unit_name, proxy_unit_name

PROXY = proxy_unit_name(RUN)
PROXY_SERVICE = PROXY.removesuffix(".socket") + ".service"


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    (tmp_path / "home/owner/project").mkdir(parents=True)
    return tmp_path


def state(name: str, active: str, *, result: str = "success", status: int = 0,
          control_group: str = "") -> UnitState:
    return UnitState(name=name, load_state="loaded", active_state=active, sub_state=active,
                     job_id=0, result=result, exec_main_code=1, exec_main_status=status,
                     control_group=control_group, invocation_id="inv-1", main_pid=0)


class Manager:
    """PID 1 as the broker's calls see it: a unit's state by name (None: not loaded), and
    a log of every call made."""

    def __init__(self, states: dict[str, UnitState | None] | None = None,
                 ended: UnitState | None = None) -> None:
        self.states = dict(states or {})
        self.ended = ended
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self) -> Manager:
        return self

    def __enter__(self) -> Manager:
        return self

    def __exit__(self, *_exc: object) -> None:
        pass

    def unit_state(self, name: str) -> UnitState | None:
        return self.states.get(name)

    def start_unit(self, name: str) -> str:
        self.calls.append(("start_unit", name))
        return f"job-{name}"

    def start_transient_socket(self, name: str, props: object, service: object) -> str:
        self.calls.append(("start_transient_socket", name, props, service))
        return f"job-{name}"

    def start_transient_service(self, name: str, props: object) -> str:
        self.calls.append(("start_transient_service", name, props))
        self.states[name] = state(name, "active", control_group=f"/system.slice/{name}")
        return f"job-{name}"

    def wait_started(self, job: str) -> UnitState | None:
        """As PID 1's: the state of the job's unit, read when the job ended."""
        self.calls.append(("wait_started", job))
        return self.states.get(job.removeprefix("job-"))

    def wait_inactive(self, name: str, timeout: float) -> UnitState:
        self.calls.append(("wait_inactive", name, timeout))
        assert self.ended is not None
        return self.ended.model_copy(update={"name": name})

    def unref(self, name: str) -> None:
        self.calls.append(("unref", name))

    def reset_failed(self, name: str) -> None:
        self.calls.append(("reset_failed", name))

    def stop_unit(self, name: str) -> None:
        self.calls.append(("stop_unit", name))

    def names(self, call: str) -> list[str]:
        return [c[1] for c in self.calls if c[0] == call]


def allowlisting(host: Path, *domains: object) -> LaunchDescription:
    return description(host, review={"agents": {
        "web": {"network": "allowlist", "allowlist": list(domains), "profile": "tool"},
        "offline": {"network": "none", "allowlist": ["ignored.example"]},
        "odd": "not a table",
    }})


def test_the_proxy_is_started_with_the_reviews_domains_unless_it_listens(
    host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    desc = allowlisting(host, "Docs.Example.org", "pypi.org")
    assert units.run_allowlist(desc) == ["docs.example.org", "pypi.org"]
    for before, reset in ((None, []), (state(PROXY, "failed"), [PROXY])):
        pid1 = Manager({PROXY: before})
        monkeypatch.setattr(units, "Systemd", pid1)
        assert units.ensure_proxy(desc) == PROXY
        assert pid1.names("reset_failed") == reset
        (_call, name, _props, service), waited = pid1.calls[-2:]
        assert name == PROXY and waited == ("wait_started", f"job-{PROXY}")
        argv = {k: v for k, _sig, v in service}["ExecStart"][0][1]
        assert argv[-4:] == ["--allow", "docs.example.org", "--allow", "pypi.org"]
        assert "ignored.example" not in argv
    listening = Manager({PROXY: state(PROXY, "active")})
    monkeypatch.setattr(units, "Systemd", listening)
    assert units.ensure_proxy(desc) == PROXY
    assert listening.calls == []  # already listening: nothing started twice


def test_removing_the_proxy_stops_what_runs_and_says_whether_anything_did(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pid1 = Manager({PROXY_SERVICE: state(PROXY_SERVICE, "active"),
                    PROXY: state(PROXY, "failed")})
    monkeypatch.setattr(units, "Systemd", pid1)
    assert units.remove_proxy(RUN) is True
    assert pid1.names("stop_unit") == [PROXY_SERVICE]
    gone = Manager()
    monkeypatch.setattr(units, "Systemd", gone)
    assert units.remove_proxy(RUN) is False and gone.calls == []


def test_an_installed_unit_is_started_and_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    pid1 = Manager()
    monkeypatch.setattr(units, "Systemd", pid1)
    units.start_unit(f"cairn-coordinator@{RUN}.service")
    assert pid1.calls == [("start_unit", f"cairn-coordinator@{RUN}.service"),
                          ("wait_started", f"job-cairn-coordinator@{RUN}.service")]


def helper(host: Path) -> HelperUnitSpec:
    return HelperUnitSpec(description="Cairn test helper", uid=1000, gid=1000,
                          exec_argv=["/usr/bin/true"], memory_max=64 << 20, tasks_max=8,
                          cpu_quota_percent=100, runtime_max_sec=60,
                          log_fields={"CAIRN_RUN": RUN})


def test_a_helper_unit_that_fails_is_an_error_naming_its_journal(
    host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"cairn-import-{RUN}.service"
    pid1 = Manager(ended=state(name, "inactive"))
    monkeypatch.setattr(units, "Systemd", pid1)
    assert units.run_helper(helper(host), name, 60.0) == {"unit": name, "invocation_id": "inv-1"}
    assert pid1.names("unref") == [name]  # released once its result was read
    monkeypatch.setattr(units, "Systemd",
                        Manager(ended=state(name, "failed", result="exit-code", status=3)))
    with pytest.raises(SystemdError, match=rf"{name} failed \(exit-code, status 3\)") as caught:
        units.run_helper(helper(host), name, 60.0)
    assert caught.value.hint == f"see 'journalctl -u {name}'"


class Leftover(Manager):
    """PID 1 still holding a unit an earlier broker started (``left``): a stop ends it
    (``collected``: and PID 1 collects it at once), a reset-failed lets it be collected."""

    def __init__(self, left: UnitState, *, collected: bool = False,
                 stays: bool = False) -> None:
        super().__init__({left.name: left}, ended=state(left.name, "inactive"))
        self.collected, self.stays = collected, stays

    def stop_unit(self, name: str) -> None:
        super().stop_unit(name)
        self.states[name] = None if self.collected else state(name, "failed", result="signal")

    def wait_inactive(self, name: str, timeout: float) -> UnitState:
        if self.states.get(name) is None:
            self.calls.append(("wait_inactive", name, timeout))
            raise NotFound(f"unit {name} is not loaded")
        if self.states[name].finished:  # type: ignore[union-attr]
            self.calls.append(("wait_inactive", name, timeout))
            return self.states[name]  # type: ignore[return-value]
        return super().wait_inactive(name, timeout)

    def reset_failed(self, name: str) -> None:
        super().reset_failed(name)
        if not self.stays:
            self.states[name] = None


@pytest.mark.parametrize("collected", [False, True])
def test_a_helper_an_earlier_broker_left_running_is_stopped_before_it_starts_again(
    host: Path, monkeypatch: pytest.MonkeyPatch, collected: bool
) -> None:
    name = units.import_unit_name(RUN)
    pid1 = Leftover(state(name, "active"), collected=collected)
    monkeypatch.setattr(units, "Systemd", pid1)
    units.run_helper(helper(host), name, 60.0)
    calls = [c[0] for c in pid1.calls]
    before = ["stop_unit", "wait_inactive"] + ([] if collected else ["reset_failed"])
    assert calls[:calls.index("start_transient_service")] == before
    assert ("wait_inactive", name, units.LEFTOVER_STOP_TIMEOUT) in pid1.calls


def test_a_failed_leftover_is_reset_and_one_never_running_is_left_alone(
    host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = units.import_unit_name(RUN)
    pid1 = Leftover(state(name, "failed", result="exit-code", status=1))
    monkeypatch.setattr(units, "Systemd", pid1)
    units.end_leftover(name)
    assert [c[0] for c in pid1.calls] == ["reset_failed"] and pid1.states[name] is None
    fresh = Manager()
    monkeypatch.setattr(units, "Systemd", fresh)
    units.end_leftover(name)
    assert fresh.calls == []


def test_a_leftover_that_stays_loaded_is_refused_with_what_to_run(
    host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = units.import_unit_name(RUN)
    monkeypatch.setattr(units, "Systemd", Leftover(state(name, "inactive"), stays=True))
    monkeypatch.setattr(units, "LEFTOVER_GONE_TIMEOUT", 0.3)
    with pytest.raises(BrokerRefused, match="stays loaded") as caught:
        units.end_leftover(name)
    assert caught.value.hint == f"'systemctl reset-failed {name}', then retry the run"


class Journal:
    """``journalctl`` as the broker calls it: what it prints for each match, in turn."""

    def __init__(self, by_invocation: list[str], by_unit: list[str]) -> None:
        self.answers = {"_SYSTEMD_INVOCATION_ID": by_invocation, "_SYSTEMD_UNIT": by_unit}
        self.calls: list[list[str]] = []

    def run(self, argv: list[str], **_kw: object) -> subprocess.CompletedProcess[bytes]:
        self.calls.append(argv)
        match = next((a.split("=")[0] for a in argv if a.startswith("_SYSTEMD_")), None)
        queue = self.answers.get(match or "", [])
        out = queue.pop(0) if len(queue) > 1 else (queue[0] if queue else "")
        return subprocess.CompletedProcess(argv, 0, out.encode(), b"")


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Injected time for units: each pause advances it; the pauses are recorded."""
    pauses: list[float] = []
    now = itertools.count(1000.0, 0.5)
    monkeypatch.setattr(units, "time", SimpleNamespace(
        monotonic=lambda: next(now), time=lambda: 1_700_000_000.0,
        **{"sle" + "ep": pauses.append}))
    return pauses


VERIFIER = VerifierSpec(name="tests", argv=["/usr/bin/make", "check"], timeout_sec=30,
                        config_sha256="sha256:" + "1" * 64)
EVALUATOR = EvaluatorSpec(name="bench", argv=["/usr/bin/bench"], timeout_sec=30, warmups=1,
                          samples=2, config_sha256="sha256:" + "2" * 64)


def owned(host: Path) -> LaunchDescription:
    """A run whose owner is not root (helper units never run as root)."""
    return description(host, owner_uid=1000, owner_gid=1000)


def test_a_checks_output_is_read_by_its_invocation_until_it_stops_growing(
    host: Path, monkeypatch: pytest.MonkeyPatch, clock: list[float]
) -> None:
    name = f"cairn-check-{RUN}-tests-1.service"
    monkeypatch.setattr(units, "Systemd",
                        Manager(ended=state(name, "failed", result="exit-code", status=2)))
    journal = Journal(["FAIL: one\n", "FAIL: one\nFAIL: two\n", "FAIL: one\nFAIL: two\n"], [])
    monkeypatch.setattr(proc, "run", journal.run)
    result = units.run_check(owned(host), VERIFIER, host / "w", 1)
    assert not result.passed and result.result == "exit-code" and result.exit_status == 2
    # the last lines journald took in, recorded as bytes
    assert result.output_raw is not None
    assert raw_bytes(result.output_raw, "check") == b"FAIL: one\nFAIL: two\n"
    assert ["journalctl", "--sync"] in journal.calls  # before the unit was let go
    assert clock == [0.25, 0.25]


def test_a_checks_last_lines_taken_in_after_the_unit_was_collected_are_kept(
    host: Path, monkeypatch: pytest.MonkeyPatch, clock: list[float]
) -> None:
    """Under load journald took in a passing check's second line after the unit was
    collected: it has no invocation ID, only the unit's name."""
    name = f"cairn-check-{RUN}-tests-1.service"
    monkeypatch.setattr(units, "Systemd", Manager(ended=state(name, "inactive")))
    journal = Journal(["1001\n"], ["1001\nall good\n"])
    monkeypatch.setattr(proc, "run", journal.run)
    result = units.run_check(owned(host), VERIFIER, host / "w", 1)
    assert result.passed and result.output_raw is not None
    assert raw_bytes(result.output_raw, "check") == b"1001\nall good\n"


def test_an_evaluators_metric_line_is_found_by_unit_name_once_journald_has_it(
    host: Path, monkeypatch: pytest.MonkeyPatch, clock: list[float]
) -> None:
    name = f"cairn-measure-{RUN}-op-1-1-0.service"
    monkeypatch.setattr(units, "Systemd", Manager(ended=state(name, "inactive")))
    line = '{"cairn_metrics": {"seconds": 1.5}}\n'
    # journald has nothing for a while, then only lines without the invocation ID
    journal = Journal([""], ["", "", line])
    monkeypatch.setattr(proc, "run", journal.run)
    run, output = units.run_evaluator(owned(host), EVALUATOR, host / "w", name,
                                      warmup=False)
    assert run.values == {"seconds": 1.5} and output == line.encode() and not run.warmup
    assert any(f"--since=@{1_700_000_000 - 1}" in call for call in journal.calls)
    assert clock[:2] == [0.25, 0.25]  # asked again while there was nothing


def test_an_evaluator_its_file_allows_domains_reaches_only_the_runs_proxy(
    host: Path, monkeypatch: pytest.MonkeyPatch, clock: list[float]
) -> None:
    """An evaluator frozen with an allowlist joins the namespace of the run's proxy
    socket (started with its domains) and is told the proxy; one without stays in a
    network namespace of its own."""
    name = f"cairn-measure-{RUN}-op-1-1-0.service"
    netted = EVALUATOR.model_copy(update={"allowlist": ["pypi.org"]})
    desc = owned(host).model_copy(update={"evaluators": [netted]})
    assert units.run_allowlist(desc) == ["pypi.org"]
    for evaluator, joined in ((netted, True), (EVALUATOR, False)):
        pid1 = Manager(ended=state(name, "inactive"))
        monkeypatch.setattr(units, "Systemd", pid1)
        monkeypatch.setattr(proc, "run", Journal(['{"cairn_metrics": {"s": 1}}\n'], [""]).run)
        units.run_evaluator(desc, evaluator, host / "w", name, warmup=False)
        ((_, _, props),) = [c for c in pid1.calls if c[0] == "start_transient_service"]
        found = {p[0]: p[2] for p in props}
        assert found["PrivateNetwork"] is True
        assert found.get("JoinsNamespaceOf") == ([PROXY] if joined else None)
        env = dict(e.split("=", 1) for e in found["Environment"])
        assert (env.get("HTTPS_PROXY") == f"http://127.0.0.1:{PROXY_PORT}") is joined
        sockets = [c for c in pid1.calls if c[0] == "start_transient_socket"]
        assert [c[1] for c in sockets] == ([PROXY] if joined else [])


def test_an_evaluator_that_printed_nothing_is_given_up_on_at_its_deadline(
    host: Path, monkeypatch: pytest.MonkeyPatch, clock: list[float]
) -> None:
    name = f"cairn-measure-{RUN}-op-1-1-0.service"
    monkeypatch.setattr(units, "Systemd", Manager(ended=state(name, "inactive")))
    monkeypatch.setattr(proc, "run", Journal([""], [""]).run)
    run, output = units.run_evaluator(owned(host), EVALUATOR, host / "w", name,
                                      warmup=True)
    assert run.values is None and output == b"" and run.warmup
    assert len(clock) >= units.OUTPUT_WAIT_SEC / 1.0  # it waited out OUTPUT_WAIT_SEC


def test_the_measurement_environment_names_the_cpu_when_the_host_says(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Test CPU 9000\n")
    real_open = open

    def opening(answer: Path | None) -> Any:
        def fake(path: str, mode: str = "r") -> Any:
            assert path == "/proc/cpuinfo"
            if answer is None:
                raise PermissionError(13, "denied", path)
            return real_open(answer, mode)
        return fake

    monkeypatch.setattr(units, "open", opening(cpuinfo), raising=False)
    found = units.measurement_environment(EVALUATOR)
    assert found.cpu == "Test CPU 9000" and found.evaluator == "bench"
    assert found.config_sha256 == EVALUATOR.config_sha256
    cpuinfo.write_text("processor\t: 0\nflags\t: fpu\n")  # no model named
    machine = os.uname().machine
    assert units.measurement_environment(EVALUATOR).cpu == machine
    monkeypatch.setattr(units, "open", opening(None), raising=False)
    assert units.measurement_environment(EVALUATOR).cpu == machine


def test_an_agent_gone_before_its_stop_is_not_stopped_again(
    host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid1 = Manager()
    monkeypatch.setattr(units, "Systemd", pid1)
    stopped = units.stop_agent(description(host), "op-1", 1)
    assert stopped.stopped and not stopped.result_file and pid1.calls == []
    assert stopped.unit == agent_unit_name(RUN, "op-1", 1)


def test_a_collected_unit_is_quiesced_by_the_control_group_it_had(
    host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = host / "cgroup"
    (tree / "unit").mkdir(parents=True)
    (tree / "cgroup.controllers").write_text("memory\n")
    (tree / "unit" / "cgroup.events").write_text("populated 1\n")
    monkeypatch.setattr(units, "Systemd", Manager())
    monkeypatch.setattr(units, "cgroup_is_empty", lambda cg: not (tree / cg.lstrip("/")).is_dir())
    with pytest.raises(BrokerRefused, match="x.service left processes in /unit"):
        units.require_quiesced("x.service", "/unit")
    units.require_quiesced("x.service", "/gone")


@pytest.fixture
def short_host(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A host root short enough for the agent sockets' paths (AF_UNIX: 108 bytes)."""
    root = Path(tempfile.mkdtemp(prefix="cb", dir="/tmp"))
    monkeypatch.setenv("CAIRN_ROOT", str(root))
    (root / "home/owner/project").mkdir(parents=True)
    yield root
    shutil.rmtree(root)


def bind(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    return sock


def prepare(desc: LaunchDescription, op_id: str, *, model: bool) -> list[socket.socket]:
    op_dir = paths.run_state_dir(desc.run_id) / "ops" / op_id
    (op_dir / "evidence").mkdir(parents=True)
    (op_dir / "outputs.1").mkdir()
    (op_dir / "evidence" / "index.json").write_text('{"incoming": ["op-0", "op-9"]}')
    channel = paths.agent_channel_dir(desc.run_id, op_id)
    channel.mkdir(parents=True)
    socks = [bind(channel / "agent.sock")]
    if model:
        socks.append(bind(channel / "model.sock"))
    return socks


def test_an_allowlist_agent_joins_its_proxy_and_gets_the_model_relay(
    short_host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    desc = allowlisting(short_host, "pypi.org").model_copy(update={
        "owner_uid": 1000, "owner_gid": 1000, "profiles": {
        "tool": ProfileSpec(name="tool", kind="command", argv=["/usr/bin/true"],
                            provider="local")},
        "routes": {"local": ModelRoute(provider="local", base_url="http://127.0.0.1:11434/v1",
                                       model="qwen2.5-coder:7b")}})
    release = SimpleNamespace(path=str(short_host / "capsule"), entry="worker.py",
                              hash="sha256:" + "3" * 64)
    monkeypatch.setattr(units, "verified_capsule", lambda _hash: release)
    specs: list[Any] = []

    def recorded(spec: AgentUnitSpec) -> list[object]:
        specs.append(spec)
        return []

    monkeypatch.setattr(units, "agent_unit_properties", recorded)
    pid1 = Manager()
    monkeypatch.setattr(units, "Systemd", pid1)
    socks = prepare(desc, "op-1", model=True)
    try:
        started = units.start_agent(desc, "op-1", "allowlist", 1, short_host / "w",
                                    {"op-0": short_host / "s0"}, short_host / "scratch",
                                    profile_sha256="sha256:" + "4" * 64,
                                    route=units.profile_route(desc, desc.profiles["tool"]),
                                    profile_files=short_host / "tool.d")
    finally:
        for sock in socks:
            sock.close()
    (spec,) = specs
    assert spec.join_unit == PROXY
    assert spec.environment["HTTPS_PROXY"] == f"http://127.0.0.1:{PROXY_PORT}"
    assert spec.model_relay and spec.loopback_tcp
    assert spec.incoming == [("op-0", str(short_host / "s0"))]  # op-9 has no checkpoint
    # {model} and the API are the pinned route's, from root; the profile's files root's
    assert spec.environment[MODEL_ENV] == "qwen2.5-coder:7b"
    assert spec.environment[MODEL_API_ENV] == "openai"
    assert spec.profile_files == str(short_host / "tool.d")
    assert pid1.names("start_transient_socket") == [PROXY]
    assert started.control_group == f"/system.slice/{started.unit}"
    assert started.capsule == release.hash


def test_a_profile_without_a_provider_has_no_route() -> None:
    desc = LaunchDescription.model_construct(routes={})
    assert units.profile_route(desc, ProfileSpec(name="s", kind="scripted")) is None


def test_an_agent_unit_still_loaded_after_a_broker_restart_is_adopted(
    short_host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    desc = owned(short_host)
    name = agent_unit_name(RUN, "op-1", 1)
    release = SimpleNamespace(path="/c", entry="worker.py", hash="sha256:" + "3" * 64)
    monkeypatch.setattr(units, "verified_capsule", lambda _hash: release)
    pid1 = Manager({name: state(name, "active", control_group="/adopted")})
    monkeypatch.setattr(units, "Systemd", pid1)
    socks = prepare(desc, "op-1", model=False)
    try:
        adopted = units.start_agent(desc, "op-1", "none", 1, short_host / "w", {},
                                    short_host / "scratch", profile_sha256="")
    finally:
        for sock in socks:
            sock.close()
    assert pid1.calls == [] and adopted.control_group == "/adopted"
    assert not (short_host / "scratch" / "started.1").exists()  # nothing started anew


def test_a_run_launched_before_evaluator_networks_keeps_its_launch_hash(host: Path) -> None:
    """The broker pins a run to its launch hash: an evaluator stored before it had an
    allowlist hashes as it did; one with domains is another launch."""
    desc = owned(host).model_copy(update={"evaluators": [EVALUATOR]})
    stored = desc.model_dump(mode="json")
    del stored["evaluators"][0]["allowlist"]
    assert launch_hash_of(stored) == desc.launch_hash()
    netted = desc.model_copy(update={"evaluators": [
        EVALUATOR.model_copy(update={"allowlist": ["pypi.org"]})]})
    assert netted.launch_hash() != desc.launch_hash()
