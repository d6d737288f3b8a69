"""The agent and helper unit property lists: names, D-Bus signatures, values, validation."""

from __future__ import annotations

from typing import Any

import pytest
from jeepney import DBusAddress, new_method_call
from jeepney.low_level import Message
from pydantic import ValidationError

from cairn.errors import UsageError
from cairn.systemd import Prop, unit_object_path, validate_unit_name
from cairn.unitprops import (
    AGENT_SLICE,
    MS_REC,
    AgentUnitSpec,
    HelperUnitSpec,
    agent_unit_name,
    agent_unit_properties,
    helper_unit_properties,
)

RUN = "flow_" + "0123456789abcdef" * 2
POOL = f"/var/lib/cairn/pool/runs/{RUN}"


def agent_spec(**overrides: Any) -> AgentUnitSpec:
    fields: dict[str, Any] = {
        "run_id": RUN,
        "op_id": "implement-1",
        "uid": 1001,
        "gid": 1001,
        "exec_argv": ["/usr/bin/python3", "-I", "-m", "cairn.worker"],
        "workspace": f"{POOL}/scopes/root/W.1",
        "evidence_dir": f"/var/lib/cairn/runs/{RUN}/evidence/implement-1",
        "incoming": [("b1", f"{POOL}/checkpoints/plan")],
        "outputs": f"/var/lib/cairn/runs/{RUN}/outputs/implement-1",
        "state": f"/var/lib/cairn/runs/{RUN}/state/implement-1",
        "channel_dir": f"/run/cairn/agents/{RUN}/implement-1",
        "capsule": "/usr/lib/cairn/releases/1",
        "memory_max": 4 * 2**30,
        "tasks_max": 512,
        "cpu_quota_percent": 150,
        "runtime_max_sec": 7200,
        "io_weight": 50,
        "network": "none",
        "environment": {"CAIRN_MODEL": "m"},
        "log_fields": {"CAIRN_RUN": RUN, "CAIRN_OP": "implement-1"},
    }
    fields.update(overrides)
    return AgentUnitSpec.model_validate(fields)


# Properties sent more than once on purpose: systemd appends, and a deny list after the
# allow list subtracts from it.
APPENDED = {"SystemCallFilter"}


def as_dict(props: list[Prop]) -> dict[str, tuple[str, Any]]:
    names = [name for name, _sig, _value in props if name not in APPENDED]
    assert len(names) == len(set(names)), "a property is sent twice (systemd would append)"
    return {name: (sig, value) for name, sig, value in props if name not in APPENDED}


def appended(props: list[Prop], name: str) -> list[tuple[str, Any]]:
    return [(sig, value) for n, sig, value in props if n == name]


def binds(props: dict[str, tuple[str, Any]], key: str) -> dict[str, tuple[str, bool, int]]:
    sig, entries = props[key]
    assert sig == "a(ssbt)"
    return {dst: (src, ignore, flags) for src, dst, ignore, flags in entries}


def test_agent_unit_name_is_unique_per_attempt_and_valid() -> None:
    first = agent_unit_name(RUN, "implement-1", 1)
    second = agent_unit_name(RUN, "implement-1", 2)
    assert first == f"cairn-agent-{RUN}-implement-1-1.service"
    assert first != second
    assert validate_unit_name(first) == first


@pytest.mark.parametrize(
    ("run_id", "op_id", "attempt"),
    [
        ("flow_../../etc", "op", 1),
        ("flow_" + "0123456789ABCDEF" * 2, "op", 1),  # uppercase hex
        ("flow_" + "ab" * 15, "op", 1),  # too short
        (RUN, "../op", 1),
        (RUN, "op x", 1),
        (RUN, "Op", 1),
        (RUN, "-op", 1),
        (RUN, "o" * 129, 1),
        (RUN, "op", 0),
        (RUN, "op", True),
    ],
)
def test_agent_unit_name_rejects_bad_parts(run_id: str, op_id: str, attempt: int) -> None:
    with pytest.raises(UsageError):
        agent_unit_name(run_id, op_id, attempt)


@pytest.mark.parametrize(
    "name",
    [
        "../evil.service",
        "a b.service",
        "a/b.service",
        "noext",
        "x.mount",
        ".service",
        "a" * 248 + ".service",  # 256 bytes
        "ünïcode.service",
    ],
)
def test_validate_unit_name_rejects(name: str) -> None:
    with pytest.raises(UsageError):
        validate_unit_name(name)


def test_validate_unit_name_accepts_the_longest_name() -> None:
    name = "a" * 247 + ".service"
    assert len(name) == 255
    assert validate_unit_name(name) == name
    assert validate_unit_name("cairn-coordinator@flow_x.service")


def test_unit_object_path_escapes_like_systemd() -> None:
    assert unit_object_path("wf-run-r1.service") == (
        "/org/freedesktop/systemd1/unit/wf_2drun_2dr1_2eservice"
    )
    assert unit_object_path("1a@b.service") == "/org/freedesktop/systemd1/unit/_31a_40b_2eservice"


def test_agent_properties_values_and_signatures() -> None:
    props = as_dict(agent_unit_properties(agent_spec()))
    assert props["Type"] == ("s", "exec")
    assert props["ExecStart"] == (
        "a(sasb)",
        [("/usr/bin/python3", ["/usr/bin/python3", "-I", "-m", "cairn.worker"], False)],
    )
    assert props["User"] == ("s", "1001")
    assert props["Group"] == ("s", "1001")
    assert props["WorkingDirectory"] == ("s", "/workspace")
    assert props["CPUQuotaPerSecUSec"] == ("t", 1_500_000)
    assert props["MemoryMax"] == ("t", 4 * 2**30)
    assert props["MemorySwapMax"] == ("t", 0)
    assert props["TasksMax"] == ("t", 512)
    assert props["IOWeight"] == ("t", 50)
    assert props["RuntimeMaxUSec"] == ("t", 7_200_000_000)
    assert props["CollectMode"] == ("s", "inactive-or-failed")
    assert props["KillMode"] == ("s", "control-group")
    assert props["Slice"] == ("s", AGENT_SLICE)
    assert props["RestrictNamespaces"] == ("t", 0)
    assert props["CapabilityBoundingSet"] == ("t", 0)
    assert props["AmbientCapabilities"] == ("t", 0)
    assert appended(agent_unit_properties(agent_spec()), "SystemCallFilter") == [
        ("(bas)", (True, ["@system-service"])),
        ("(bas)", (False, ["@keyring"])),
    ]
    assert props["ProtectSystem"] == ("s", "strict")
    assert props["ProtectHome"] == ("s", "yes")
    assert props["PrivateNetwork"] == ("b", True)
    assert props["RestrictAddressFamilies"] == ("(bas)", (True, ["AF_UNIX"]))
    assert "AddRef" not in props  # Systemd.start_transient_service owns the pin
    sig, fields = props["LogExtraFields"]
    assert sig == "aay"
    assert fields == [f"CAIRN_RUN={RUN}".encode(), b"CAIRN_OP=implement-1"]
    sig, env = props["Environment"]
    assert sig == "as"
    assert isinstance(env, list)
    assert "CAIRN_MODEL=m" in env and "HOME=/state" in env
    assert "CAIRN_AGENT_SOCKET=/run/cairn/agent/agent.sock" in env


def test_agent_mount_namespace() -> None:
    spec = agent_spec()
    props = as_dict(agent_unit_properties(spec))
    rw = binds(props, "BindPaths")
    ro = binds(props, "BindReadOnlyPaths")
    assert rw == {
        "/workspace": (spec.workspace, False, MS_REC),
        "/outputs": (spec.outputs, False, MS_REC),
        "/state": (spec.state, False, MS_REC),
        "/run/cairn/agent": (spec.channel_dir, False, MS_REC),
    }
    assert ro == {
        "/evidence": (spec.evidence_dir, False, MS_REC),
        "/evidence/incoming/b1/workspace": (f"{POOL}/checkpoints/plan", False, MS_REC),
        "/runtime/capsule": ("/usr/lib/cairn/releases/1", False, MS_REC),
    }
    masks = dict(props["TemporaryFileSystem"][1])
    assert set(masks) == {"/var/lib/cairn", "/run/cairn", "/run", "/dev/shm"}
    assert masks["/dev/shm"] == "mode=1777"
    assert props["InaccessiblePaths"] == ("as", ["-/etc/cairn"])
    # Only processes of its own unit: a PID namespace with its own /proc.
    assert props["PrivatePIDs"] == ("s", "yes")
    assert props["PrivateIPC"] == ("b", True)


def test_a_command_profiles_files_are_bound_read_only_beside_the_channel() -> None:
    props = as_dict(agent_unit_properties(agent_spec(
        profile_files="/etc/cairn/profiles.d/opencode.d")))
    assert binds(props, "BindReadOnlyPaths")["/run/cairn/profile"] == (
        "/etc/cairn/profiles.d/opencode.d", False, MS_REC)
    assert "/run/cairn/profile" not in binds(props, "BindPaths")
    assert "/run/cairn/profile" not in binds(as_dict(agent_unit_properties(agent_spec())),
                                             "BindReadOnlyPaths")


def test_agent_without_capsule_and_with_hidden_pool() -> None:
    props = as_dict(agent_unit_properties(agent_spec(capsule=None, hidden_paths=["/srv/pool"])))
    assert "/runtime/capsule" not in binds(props, "BindReadOnlyPaths")
    assert props["InaccessiblePaths"] == ("as", ["-/etc/cairn", "-/srv/pool"])


def test_host_network_keeps_the_host_namespace() -> None:
    props = as_dict(agent_unit_properties(agent_spec(network="host")))
    assert "PrivateNetwork" not in props
    _sig, (allow, families) = props["RestrictAddressFamilies"]
    assert allow is True
    assert set(families) == {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"}
    # /run is empty; name resolution through systemd-resolved still works.
    ro = binds(props, "BindReadOnlyPaths")
    assert ro["/run/systemd/resolve"] == ("/run/systemd/resolve", True, MS_REC)
    assert "/run/systemd/resolve" not in binds(
        as_dict(agent_unit_properties(agent_spec())), "BindReadOnlyPaths"
    )


@pytest.mark.parametrize(
    "overrides",
    [
        {"uid": 0},
        {"gid": 0},
        {"exec_argv": []},
        {"exec_argv": ["python3", "x"]},
        {"workspace": "relative/W"},
        {"workspace": "/var/lib/cairn/../../etc"},
        {"workspace": "/a//b"},
        {"channel_dir": "/run/x\n"},
        {"incoming": [("../b", "/x")]},
        {"incoming": [("b", "/x"), ("b", "/y")]},
        {"environment": {"HOME": "/root"}},
        {"environment": {"BAD-NAME": "x"}},
        {"environment": {"X": "a\nb"}},
        {"log_fields": {"_SYSTEMD_UNIT": "forged"}},
        {"log_fields": {"lower": "x"}},
        {"cpu_quota_percent": 0},
        {"memory_max": 0},
        {"io_weight": 10_001},
        {"network": "allowlist"},
        {"run_id": "flow_x"},
        {"op_id": "Op"},
        {"unexpected": 1},
    ],
)
def test_agent_spec_rejects(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        agent_spec(**overrides)


def helper_spec(**overrides: Any) -> HelperUnitSpec:
    fields: dict[str, Any] = {
        "description": f"Cairn apply of {RUN}",
        "uid": 1001,
        "gid": 1001,
        "exec_argv": ["/usr/bin/python3", "-I", "-m", "cairn.apply"],
        "binds": [("/home/alice/project", "/live/0")],
        "read_only_binds": [(f"{POOL}/F", "/final/0")],
        "working_directory": "/live/0",
        "memory_max": 2**30,
        "tasks_max": 64,
        "cpu_quota_percent": 100,
        "runtime_max_sec": 600,
    }
    fields.update(overrides)
    return HelperUnitSpec.model_validate(fields)


def test_helper_shares_the_agent_hardening() -> None:
    helper = as_dict(helper_unit_properties(helper_spec()))
    agent = as_dict(agent_unit_properties(agent_spec()))
    hardening = [
        "ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices", "NoNewPrivileges",
        "CapabilityBoundingSet", "RestrictNamespaces", "TemporaryFileSystem",
        "PrivateNetwork", "RestrictAddressFamilies", "KillMode", "CollectMode", "Type",
    ]
    for name in hardening:
        assert helper[name] == agent[name], name
    assert appended(helper_unit_properties(helper_spec()), "SystemCallFilter") == appended(
        agent_unit_properties(agent_spec()), "SystemCallFilter"
    )
    assert helper["BindPaths"] == ("a(ssbt)", [("/home/alice/project", "/live/0", False, MS_REC)])
    assert helper["CPUQuotaPerSecUSec"] == ("t", 1_000_000)
    assert helper["Slice"] != agent["Slice"]


@pytest.mark.parametrize("dst", ["/home/alice/project", "/var/lib/cairn/x", "/etc/cairn", "/root"])
def test_helper_rejects_binds_below_hidden_paths(dst: str) -> None:
    with pytest.raises(ValidationError):
        helper_spec(binds=[("/home/alice/project", dst)])


def test_agent_properties_marshal_as_start_transient_unit() -> None:
    """jeepney serialises the list with the real method signature (types match values)."""
    props = agent_unit_properties(agent_spec())
    wire = [(name, (sig, value)) for name, sig, value in props]
    manager = DBusAddress(
        "/org/freedesktop/systemd1", bus_name="org.freedesktop.systemd1",
        interface="org.freedesktop.systemd1.Manager",
    )
    msg = new_method_call(
        manager, "StartTransientUnit", "ssa(sv)a(sa(sv))",
        (agent_unit_name(RUN, "implement-1", 1), "fail", wire, []),
    )
    data = msg.serialise(serial=1)
    parsed = Message.from_buffer(data)  # round-trip through the wire format
    assert [name for name, _v in parsed.body[2]] == [name for name, _s, _v in props]
    assert dict(parsed.body[2])["CPUQuotaPerSecUSec"] == ("t", 1_500_000)


def test_an_empty_bind_list_is_never_sent() -> None:
    """systemd keeps BindPaths= and BindReadOnlyPaths= in one list and empties it on an
    empty assignment of either: a unit with only writable binds must not send the other."""
    only_rw = as_dict(helper_unit_properties(helper_spec(read_only_binds=[])))
    assert "BindReadOnlyPaths" not in only_rw
    assert binds(only_rw, "BindPaths") == {"/live/0": ("/home/alice/project", False, MS_REC)}
    only_ro = as_dict(helper_unit_properties(helper_spec(binds=[])))
    assert "BindPaths" not in only_ro
    assert list(binds(only_ro, "BindReadOnlyPaths")) == ["/final/0"]
