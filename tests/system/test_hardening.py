"""Exposure scores of every unit Cairn ships or starts, from ``systemd-analyze security
--offline=yes`` (systemd 257) inside a throwaway machine, against fixed targets.

User units (units/user/) are scored by alice's running manager (``systemd-analyze
security --user``, which needs it), and the notifier's sandbox is looked at from the
outside, for what the score cannot show: that it is in force.

Shipped units are scored as installed by the package. Transient units have no file, so
their property lists (``cairn.unitprops``) are converted into an equivalent unit file
first; the converter refuses a property it does not know, so a new property in
``cairn.unitprops`` cannot silently go unscored.
"""

from __future__ import annotations

import errno
import re
import shlex
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from machine import Machine

from cairn.systemd import Prop
from cairn.unitprops import (
    AgentUnitSpec,
    HelperUnitSpec,
    agent_unit_properties,
    helper_unit_properties,
    proxy_service_properties,
)

# Exposure targets (0 = fully sandboxed, 10 = unprotected). A test fails above a target.
SHIPPED_TARGETS = {
    "cairn-broker.service": 2.0,
    "cairn.service": 1.0,
    "cairn-coordinator@.service": 1.0,
    # Network-scoped by design (the run's only way to its model providers).
    "cairn-egress@.service": 2.0,
    # Root, so cairnd prunes every user's runs; it only talks to cairnd's socket.
    "cairn-retention.service": 1.0,
}
# The user's own services (units/user/), run by the user's manager. Every service there
# must have a target here.
USER_TARGETS = {
    "cairn-notify.service": 2.0,
    "cairn-schedule@.service": 2.0,
    "cairn-schedule-reconcile.service": 2.0,
}
USER_UNITS = Path(__file__).resolve().parents[2] / "units" / "user"
ALICE_UID = 1001
TRANSIENT_TARGETS = {
    # The agent's score as of the sandbox issue: it may get better, never worse.
    "cairn-agent.service": 0.8,
    "cairn-helper.service": 2.0,
    "cairn-proxy.service": 2.0,
}

SCORE_RE = re.compile(r"Overall exposure level for \S+: (\d+\.\d+) ")
UNIT_SECTION = {"Description", "CollectMode"}
SECONDS_FROM_USEC = {
    "TimeoutStopUSec": "TimeoutStopSec",
    "RuntimeMaxUSec": "RuntimeMaxSec",
}


def _yes_no(value: object) -> str:
    return "yes" if value else "no"


def _flag_set(name: str, value: object) -> str:
    # Only the two settings that mean "nothing allowed" are expressible without a table of
    # capability and namespace flag names, and only those are used.
    if value != 0:
        raise ValueError(f"{name}={value!r}: only an empty set is converted")
    return "yes" if name == "RestrictNamespaces" else ""


def _bind(entry: tuple[str, str, bool, int]) -> str:
    src, dst, ignore_missing, flags = entry
    options = "rbind" if flags else "norbind"
    return f"{'-' if ignore_missing else ''}{src}:{dst}:{options}"


def property_lines(prop: Prop) -> list[str]:
    """The unit-file lines equivalent to one ``StartTransientUnit`` property."""
    name, signature, value = prop
    if name in SECONDS_FROM_USEC and signature == "t":
        assert isinstance(value, int)
        return [f"{SECONDS_FROM_USEC[name]}={value}us"]
    if name == "CPUQuotaPerSecUSec":
        assert isinstance(value, int)
        return [f"CPUQuota={value / 10_000:g}%"]
    if name in ("RestrictNamespaces", "CapabilityBoundingSet", "AmbientCapabilities"):
        return [f"{name}={_flag_set(name, value)}"]
    if name == "UMask":
        assert isinstance(value, int)
        return [f"UMask={value:04o}"]
    if name == "SystemCallErrorNumber":
        assert isinstance(value, int)
        return [f"SystemCallErrorNumber={errno.errorcode[value]}"]
    if name == "ExecStart":
        assert isinstance(value, list)
        return [f"ExecStart={shlex.join(argv)}" for _path, argv, _ignore in value]
    if name == "ExecStopPostEx":  # flag "no-env-expand" is the unit-file prefix ":"
        assert isinstance(value, list)
        return [
            f"ExecStopPost={':' if 'no-env-expand' in flags else ''}{shlex.join(argv)}"
            for _path, argv, flags in value
        ]
    if name == "Environment":
        assert isinstance(value, list)
        return [f"Environment={shlex.quote(item)}" for item in value]
    if name == "LogExtraFields":
        assert isinstance(value, list)
        return [f"LogExtraFields={item.decode()}" for item in value]
    if signature == "b":
        return [f"{name}={_yes_no(value)}"]
    if signature in ("s", "t", "u", "i"):
        return [f"{name}={value}"]
    if signature == "as":
        assert isinstance(value, list)
        return [f"{name}={' '.join(value)}"]
    if signature == "(bas)":
        assert isinstance(value, tuple)
        allow, items = value
        return [f"{name}={'' if allow else '~'}{' '.join(items)}"]
    if signature == "a(ss)" and name == "TemporaryFileSystem":
        assert isinstance(value, list)
        return [f"TemporaryFileSystem={path}:{options}" for path, options in value]
    if signature == "a(ssbt)" and name in ("BindPaths", "BindReadOnlyPaths"):
        assert isinstance(value, list)
        return [f"{name}={_bind(entry)}" for entry in value]
    raise ValueError(f"no unit-file form known for {name} ({signature}); extend the converter")


def unit_file(props: Sequence[Prop]) -> str:
    """A unit file with the same settings as a transient unit's property list."""
    unit, service = ["[Unit]"], ["[Service]"]
    for prop in props:
        (unit if prop[0] in UNIT_SECTION else service).extend(property_lines(prop))
    return "\n".join([*unit, "", *service, ""])


def sample_agent_spec() -> AgentUnitSpec:
    run_dir = "/var/lib/cairn/pool/runs/flow_" + "ab" * 16
    return AgentUnitSpec(
        run_id="flow_" + "ab" * 16,
        op_id="root-1",
        uid=1001,
        gid=1001,
        exec_argv=["/usr/bin/python3", "-I", "-B", "/runtime/capsule/cairn-worker"],
        workspace=f"{run_dir}/scopes/root/W.1",
        evidence_dir="/var/lib/cairn/runs/flow_" + "ab" * 16 + "/ops/root-1/evidence",
        incoming=[("root-0", f"{run_dir}/checkpoints/root-0")],
        outputs=f"{run_dir}/scratch/outputs",
        state=f"{run_dir}/scratch/state",
        channel_dir="/run/cairn/agents/flow_" + "ab" * 16 + "/root-1",
        capsule="/usr/lib/cairn/releases/" + "0" * 64,
        memory_max=2 << 30,
        tasks_max=256,
        cpu_quota_percent=200,
        runtime_max_sec=3600,
        log_fields={"CAIRN_RUN": "flow_" + "ab" * 16, "CAIRN_OP": "root-1"},
    )


def sample_helper_spec() -> HelperUnitSpec:
    return HelperUnitSpec(
        description="Cairn apply of run flow_" + "ab" * 16,
        uid=1001,
        gid=1001,
        exec_argv=["/usr/bin/python3", "-I", "-m", "cairn.worker.apply"],
        binds=[("/home/alice/demo", "/live")],
        read_only_binds=[("/var/lib/cairn/pool/runs/x/Q", "/q")],
        memory_max=2 << 30,
        tasks_max=64,
        cpu_quota_percent=100,
        runtime_max_sec=3600,
    )


def test_converter_covers_every_agent_and_helper_property() -> None:
    text = unit_file(agent_unit_properties(sample_agent_spec()))
    assert "ExecStart=/usr/bin/python3 -I -B /runtime/capsule/cairn-worker" in text
    assert "RuntimeMaxSec=3600000000us" in text
    assert "CPUQuota=200%" in text
    assert "CapabilityBoundingSet=\n" in text
    assert "RestrictNamespaces=yes" in text
    assert "SystemCallErrorNumber=EPERM" in text
    assert "BindReadOnlyPaths=/usr/lib/cairn/releases/" + "0" * 64 + ":/runtime/capsule:rbind" in (
        text
    )
    unit_file(helper_unit_properties(sample_helper_spec()))
    proxy = unit_file(proxy_service_properties("flow_" + "ab" * 16, ["/usr/bin/python3"]))
    assert "DynamicUser=yes" in proxy and "AF_INET" in proxy
    with pytest.raises(ValueError, match="extend the converter"):
        property_lines(("NewSetting", "a(tt)", []))


@pytest.fixture(scope="module")
def machine(deb: Path) -> Iterator[Machine]:
    with Machine(deb) as booted:
        yield booted


def exposure(machine: Machine, path: str) -> tuple[float, str]:
    """The overall exposure score of a unit file inside the machine, and the report."""
    proc = machine.exec(["systemd-analyze", "security", "--offline=yes", path], check=False)
    return _score(path, (proc.stdout + proc.stderr).decode(errors="replace"))


def user_exposure(machine: Machine, unit: str) -> tuple[float, str]:
    """The exposure score of a unit of alice's running manager, and the report."""
    argv = ["systemd-analyze", "security", "--user", "--no-pager", unit]
    proc = machine.exec(argv, user="alice", check=False)
    return _score(unit, (proc.stdout + proc.stderr).decode(errors="replace"))


def _score(unit: str, report: str) -> tuple[float, str]:
    match = SCORE_RE.search(report)
    if match is None:
        pytest.fail(f"systemd-analyze security printed no score for {unit}:\n{report}")
    return float(match.group(1)), report


def failing_checks(report: str) -> str:
    return "\n".join(line for line in report.splitlines() if line.startswith("✗"))


def test_shipped_units_meet_exposure_targets(machine: Machine) -> None:
    scores: dict[str, float] = {}
    reports: dict[str, str] = {}
    for unit in SHIPPED_TARGETS:
        scores[unit], reports[unit] = exposure(machine, f"/usr/lib/systemd/system/{unit}")
    print("\nexposure of shipped units (target in parentheses):")
    for unit, target in SHIPPED_TARGETS.items():
        print(f"  {unit:32} {scores[unit]:.1f}  (<= {target})")
    over = {u: s for u, s in scores.items() if s > SHIPPED_TARGETS[u]}
    assert not over, "\n\n".join(f"{u}: {s}\n{failing_checks(reports[u])}" for u, s in over.items())


def test_transient_unit_property_sets_meet_exposure_targets(machine: Machine) -> None:
    files = {
        "cairn-agent.service": unit_file(agent_unit_properties(sample_agent_spec())),
        "cairn-helper.service": unit_file(helper_unit_properties(sample_helper_spec())),
        "cairn-proxy.service": unit_file(
            proxy_service_properties(
                "flow_" + "ab" * 16, ["/usr/bin/python3", "-I", "-m", "cairn.proxy"]
            )
        ),
    }
    scores: dict[str, float] = {}
    reports: dict[str, str] = {}
    for name, text in files.items():
        (machine.merged / "root" / name).write_text(text)
        scores[name], reports[name] = exposure(machine, f"/root/{name}")
    print("\nexposure of transient unit property sets (target in parentheses):")
    for name, target in TRANSIENT_TARGETS.items():
        print(f"  {name:32} {scores[name]:.1f}  (<= {target})")
    over = {n: s for n, s in scores.items() if s > TRANSIENT_TARGETS[n]}
    assert not over, "\n\n".join(f"{n}: {s}\n{failing_checks(reports[n])}" for n, s in over.items())


def test_every_user_service_has_a_target() -> None:
    assert sorted(p.name for p in USER_UNITS.glob("*.service")) == sorted(USER_TARGETS)


def test_user_units_meet_exposure_targets(machine: Machine) -> None:
    machine.enable_user_manager("alice")
    scores: dict[str, float] = {}
    reports: dict[str, str] = {}
    for unit in USER_TARGETS:
        instance = unit.replace("@.", "@000000000000.")  # a template is scored as an instance
        scores[unit], reports[unit] = user_exposure(machine, instance)
    print("\nexposure of user units, systemd-analyze security --user (target in parentheses):")
    for unit, target in USER_TARGETS.items():
        print(f"  {unit:32} {scores[unit]:.1f}  (<= {target})")
    over = {u: s for u, s in scores.items() if s > USER_TARGETS[u]}
    assert not over, "\n\n".join(f"{u}: {s}\n{failing_checks(reports[u])}" for u, s in over.items())


def _notifier_pid(machine: Machine) -> int:
    deadline = time.monotonic() + 60
    while True:
        out = machine.exec(
            ["systemctl", "--user", "show", "-p", "MainPID", "--value", "cairn-notify.service"],
            user="alice", check=False,
        ).stdout.decode().strip()  # fmt: skip
        if out.isdigit() and int(out) > 0:
            return int(out)
        if time.monotonic() > deadline:
            pytest.fail("cairn-notify.service did not start for alice's hook")
        time.sleep(0.5)


def test_the_notifiers_sandbox_is_in_force(machine: Machine) -> None:
    """What the score takes on trust, seen in the running notifier: no capabilities, no
    new privileges, a syscall filter, a user namespace that maps only alice, only ``lo``,
    and a view of the homes with nothing but notify.d, its own state and alice's bus."""
    machine.enable_user_manager("alice")
    hooks = "/home/alice/.config/cairn/notify.d"
    machine.exec(["mkdir", "-p", hooks, "/home/alice/.config/cairn/definitions"], user="alice")
    machine.exec(
        ["tee", "/home/alice/.config/cairn/definitions/private"],
        user="alice",
        input=b"not the notifier's business\n",
    )
    machine.exec(["tee", f"{hooks}/noop"], user="alice", input=b"#!/bin/sh\nexit 0\n")
    machine.exec(["chmod", "0755", f"{hooks}/noop"], user="alice")
    pid = _notifier_pid(machine)
    cursor = "/home/alice/.local/state/cairn/notify-cursor"
    deadline = time.monotonic() + 60
    while machine.exec(["test", "-e", cursor], check=False).returncode != 0:
        if time.monotonic() > deadline:
            pytest.fail(f"the notifier wrote no {cursor}")
        time.sleep(0.5)

    status = dict(
        line.split(":\t", 1)
        for line in machine.exec(["cat", f"/proc/{pid}/status"]).stdout.decode().splitlines()
        if ":\t" in line
    )
    assert status["Uid"].split() == [str(ALICE_UID)] * 4
    assert int(status["CapBnd"], 16) == 0 and int(status["CapEff"], 16) == 0
    assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2"
    uid_map = machine.exec(["cat", f"/proc/{pid}/uid_map"]).stdout.decode().split()
    assert uid_map == [str(ALICE_UID), str(ALICE_UID), "1"]
    links = machine.exec(["nsenter", "-t", str(pid), "-n", "ip", "-o", "link"]).stdout.decode()
    assert [line.split(":")[1].strip() for line in links.splitlines()] == ["lo"]

    def visible(path: str) -> bool:
        probe = machine.exec(["nsenter", "-t", str(pid), "-m", "test", "-e", path], check=False)
        return probe.returncode == 0

    assert visible(f"{hooks}/noop") and visible(cursor)
    assert visible(f"/run/user/{ALICE_UID}/bus") and visible("/run/cairn/cairnd.sock")
    for hidden in (
        "/home/alice/.config/cairn/definitions/private",
        "/home/bob/.bashrc",
        "/home/alice/.bashrc",
        f"/run/user/{ALICE_UID}/systemd",
        "/root/.bashrc",
    ):
        assert not visible(hidden), f"{hidden} is visible to the notifier"
    writable = machine.exec(
        ["nsenter", "-t", str(pid), "-m", "findmnt", "-rno", "TARGET,OPTIONS", "-T",
         f"{hooks}"],
    ).stdout.decode()  # fmt: skip
    assert writable.split()[1].startswith("ro,"), writable
