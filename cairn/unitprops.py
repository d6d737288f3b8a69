"""Property lists for the transient units the broker starts (ARCHITECTURE §8). Pure: no I/O.

Every list here is what ``StartTransientUnit`` gets, in the write-side names and D-Bus
types PID 1 parses (``...USec`` in microseconds, sizes in bytes, ``CPUQuotaPerSecUSec``).
``AddRef`` is not here: :meth:`cairn.systemd.Systemd.start_transient_service` adds it,
because the pin belongs to the connection that starts the unit.

The agent's mount namespace::

    /workspace              W, read-write (also the working directory)
    /evidence               the host evidence dir, read-only
    /evidence/incoming/<b>/workspace   each incoming checkpoint S, read-only
    /outputs, /state        read-write
    /runtime/capsule        the sealed release, read-only
    /run/cairn/agent/agent.sock   the channel to the coordinator (finish_work, notes)
    /run/cairn/agent/model.sock   the model relay (when the profile uses a model)

Cairn's own state (``/var/lib/cairn``, ``/run/cairn``) is covered by an empty tmpfs,
``/etc/cairn`` and any extra pool roots are inaccessible, ``ProtectHome=yes`` hides
``/home``, ``/root`` and ``/run/user``, and the rest of the system is read-only
(``ProtectSystem=strict``). Mount points such as ``/workspace`` are created on the host
root by systemd on first use (or shipped empty by the package).

An agent is isolated from every process but its own
(/usr/share/doc/cairn/docs/decisions/agent-isolation.md): a private PID namespace with its
own ``/proc`` (``ProtectProc=invisible`` alone hides only other users' processes, and
``/proc/<pid>/root`` of any process of the owner leads to the owner's whole file system,
cairnd and the user manager), an empty ``/run`` (no system bus, journald, user-manager or
PID 1 socket; its stdout stays connected to the journal), a private ``/dev/shm`` and IPC
namespace, and no keyring calls (keyrings are per UID).
"""

from __future__ import annotations

import os
import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from cairn.errors import UsageError
from cairn.netpolicy import NetworkMode
from cairn.protocol.launch import PROFILE_FILES_DIR
from cairn.protocol.names import OP_ID_PATTERN, RUN_ID_PATTERN, is_op_id, is_run_id
from cairn.systemd import Prop, validate_unit_name

BOUNDARY_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
LOG_FIELD_RE = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")

MS_REC = 16384  # BindPaths flags: rbind; systemd accepts only 0 or MS_REC
USEC = 1_000_000
STOP_TIMEOUT_USEC = 20 * USEC
AGENT_SLICE = "cairn-agents.slice"  # nested in cairn.slice
HELPER_SLICE = "cairn-helpers.slice"

# The agent's channel directory: a directory (not the socket files) is bound, so a
# coordinator that restarts and re-creates its sockets is reachable again.
CHANNEL_DIR = "/run/cairn/agent"
AGENT_SOCKET = f"{CHANNEL_DIR}/agent.sock"
MODEL_SOCKET = f"{CHANNEL_DIR}/model.sock"
WORKSPACE = "/workspace"
EVIDENCE = "/evidence"
OUTPUTS = "/outputs"
STATE = "/state"
CAPSULE = "/runtime/capsule"

# Cairn's own files are none of a sandboxed process's business. The state dir (journal,
# pool) and the socket dir always exist on a Cairn host and are covered by an empty tmpfs
# (/run/cairn then receives agent.sock); config and extra pool roots become inaccessible
# where they exist, so systemd never creates a mount point for them on the host.
MASKED_PATHS = ("/var/lib/cairn", "/run/cairn")
INACCESSIBLE_PATHS = ("/etc/cairn",)
# What agents and helpers get as empty tmpfs besides MASKED_PATHS: all of /run (sockets of PID 1,
# D-Bus, journald, user managers, other services) and /dev/shm, which PrivateDevices=
# would otherwise bind from the host, where files outlive the unit and other users read
# them. The mode of /dev/shm is the usual sticky world-writable one.
PRIVATE_TMPFS = (("/run", "mode=0755"), ("/dev/shm", "mode=1777"))  # noqa: S108
# What name resolution needs of /run when an agent has the host's network.
HOST_NETWORK_RUN_PATHS = ("/run/systemd/resolve",)
SHELL = "/bin/sh"
SERVICE_RESULT_FILE = f"{OUTPUTS}/service-result"
# The agent is gone when this runs, but it may have left a FIFO or a symlink in the way.
RECORD_SERVICE_RESULT = (
    f"rm -f {SERVICE_RESULT_FILE} && "
    f'printf "%s %s %s\\n" "$SERVICE_RESULT" "$EXIT_CODE" "$EXIT_STATUS" > {SERVICE_RESULT_FILE}'
)
AGENT_ENV_RESERVED = ("HOME", "TMPDIR", "CAIRN_AGENT_SOCKET", "CAIRN_MODEL_SOCKET")


def _check_abs_path(path: str) -> str:
    if (
        not path.startswith("/")
        or path.startswith("//")
        or os.path.normpath(path) != path
        or any(c in path for c in "\0\n")
    ):
        raise ValueError(f"{path!r} is not an absolute, normalised path")
    return path


AbsPath = Annotated[str, AfterValidator(_check_abs_path)]


def _check_argv(argv: list[str]) -> list[str]:
    if not argv:
        raise ValueError("exec_argv is empty")
    _check_abs_path(argv[0])
    if any("\0" in a for a in argv):
        raise ValueError("exec_argv contains a NUL byte")
    return argv


def _check_environment(env: dict[str, str]) -> dict[str, str]:
    for key, value in env.items():
        if not ENV_NAME_RE.fullmatch(key):
            raise ValueError(f"invalid environment variable name {key!r}")
        if any(ord(c) < 0x20 and c != "\t" or c == "\x7f" for c in value):
            raise ValueError(f"environment variable {key} has a control character")
    return env


def _check_log_fields(fields: dict[str, str]) -> dict[str, str]:
    for key, value in fields.items():
        if not LOG_FIELD_RE.fullmatch(key):
            raise ValueError(f"invalid journal field name {key!r}: use [A-Z][A-Z0-9_]*")
        if "\n" in value or "\0" in value:
            raise ValueError(f"journal field {key} has a newline or NUL")
    return fields


Argv = Annotated[list[str], AfterValidator(_check_argv)]
Environment = Annotated[dict[str, str], AfterValidator(_check_environment)]
LogFields = Annotated[dict[str, str], AfterValidator(_check_log_fields)]


class ResourceLimits(BaseModel):
    """cgroup limits from the launch description."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid")

    memory_max: int = Field(ge=1024 * 1024, description="bytes")
    tasks_max: int = Field(ge=1)
    cpu_quota_percent: int = Field(ge=1, le=100 * 1024, description="100 = one CPU")
    runtime_max_sec: int = Field(ge=1)
    io_weight: int = Field(default=100, ge=1, le=10_000)


class AgentUnitSpec(ResourceLimits):
    """Everything the agent unit's properties are derived from (host paths are absolute)."""

    run_id: str = Field(pattern=RUN_ID_PATTERN)
    op_id: str = Field(pattern=OP_ID_PATTERN)
    uid: int = Field(ge=1, lt=2**32 - 1, description="the run owner; never root")
    gid: int = Field(ge=1, lt=2**32 - 1)
    exec_argv: Argv
    workspace: AbsPath
    evidence_dir: AbsPath
    incoming: list[tuple[str, AbsPath]] = Field(
        default_factory=list,
        description="(boundary name, host path of its checkpoint S) -> "
        "/evidence/incoming/<name>/workspace, read-only",
    )
    outputs: AbsPath
    state: AbsPath
    channel_dir: AbsPath = Field(
        description="host directory of the op's agent.sock (and model.sock) -> /run/cairn/agent"
    )
    model_relay: bool = Field(
        default=False, description="the coordinator serves a model relay (model.sock) too"
    )
    capsule: AbsPath | None = None
    profile_files: AbsPath | None = Field(
        default=None,
        description="a command profile's /etc/cairn/profiles.d/NAME.d -> /run/cairn/profile, "
        "read-only",
    )
    network: NetworkMode = "none"
    join_unit: str | None = Field(
        default=None,
        pattern=r"^cairn-proxy-flow_[0-9a-f]{32}\.socket$",
        description="the run's proxy socket, whose namespace an allowlist agent joins",
    )
    loopback_tcp: bool = Field(
        default=False,
        description="allow AF_INET in 'none' mode (only lo exists there), for "
        "the model shim of command profiles",
    )
    environment: Environment = Field(default_factory=dict)
    log_fields: LogFields = Field(default_factory=dict)
    hidden_paths: list[AbsPath] = Field(
        default_factory=list, description="further host paths to cover, e.g. other pool roots"
    )

    @model_validator(mode="after")
    def _check(self) -> AgentUnitSpec:
        names = [name for name, _path in self.incoming]
        for name in names:
            if not BOUNDARY_NAME_RE.fullmatch(name):
                raise ValueError(f"invalid incoming boundary name {name!r}")
        if len(set(names)) != len(names):
            raise ValueError("incoming boundary names repeat")
        reserved = sorted(set(self.environment) & set(AGENT_ENV_RESERVED))
        if reserved:
            raise ValueError(f"environment may not set {', '.join(reserved)}")
        if (self.network == "allowlist") != (self.join_unit is not None):
            raise ValueError("join_unit is required with network='allowlist' and only then")
        return self


class HelperUnitSpec(ResourceLimits):
    """An import, apply or verification unit: runs as the owner, no network, caller's binds.

    Bind destinations must not lie below a hidden path (``/home``, ``/root``, ``/run/user``,
    :data:`MASKED_PATHS`, :data:`INACCESSIBLE_PATHS`); bind a project to a neutral
    destination instead.
    """

    description: str = Field(min_length=1, max_length=200)
    uid: int = Field(ge=1, lt=2**32 - 1)
    gid: int = Field(ge=1, lt=2**32 - 1)
    exec_argv: Argv
    binds: list[tuple[AbsPath, AbsPath]] = Field(default_factory=list)
    read_only_binds: list[tuple[AbsPath, AbsPath]] = Field(default_factory=list)
    working_directory: AbsPath = "/"
    environment: Environment = Field(default_factory=dict)
    log_fields: LogFields = Field(default_factory=dict)
    hidden_paths: list[AbsPath] = Field(default_factory=list)
    join_unit: str | None = Field(
        default=None,
        pattern=r"^cairn-proxy-flow_[0-9a-f]{32}\.socket$",
        description="the run's proxy socket, whose namespace an evaluator allowed domains "
        "joins (only the run's proxy: no other network)",
    )

    @model_validator(mode="after")
    def _check(self) -> HelperUnitSpec:
        masked = (
            *MASKED_PATHS,
            *INACCESSIBLE_PATHS,
            "/home",
            "/root",
            "/run/user",
            *self.hidden_paths,
        )
        for _src, dst in (*self.binds, *self.read_only_binds):
            if any(dst == m or dst.startswith(m + "/") for m in masked):
                raise ValueError(f"bind destination {dst} lies below a hidden path")
        return self


def is_agent_unit_of(unit: str, run_id: str, op_id: str) -> bool:
    """Whether ``unit`` is an attempt of :func:`agent_unit_name` for ``run_id``'s
    operation ``op_id``."""
    prefix = f"cairn-agent-{run_id}-{op_id}-"
    attempt = unit.removeprefix(prefix).removesuffix(".service")
    return (unit.startswith(prefix) and unit.endswith(".service") and attempt.isascii()
            and attempt.isdigit() and not attempt.startswith("0"))


def agent_unit_name(run_id: str, op_id: str, attempt: int) -> str:
    """``cairn-agent-<run>-<op>-<attempt>.service``: a new name for every attempt."""
    if not is_run_id(run_id):
        raise UsageError(f"invalid run id {run_id!r}: expected flow_ and 32 lowercase hex digits")
    if not is_op_id(op_id):
        raise UsageError(f"invalid operation id {op_id!r}: use [a-z0-9-], at most 128 characters")
    if isinstance(attempt, bool) or not isinstance(attempt, int) or not 1 <= attempt < 10**6:
        raise UsageError(f"invalid attempt {attempt!r}: use a whole number from 1")
    return validate_unit_name(f"cairn-agent-{run_id}-{op_id}-{attempt}.service")


def _bind(src: str, dst: str) -> tuple[str, str, bool, int]:
    return (src, dst, False, MS_REC)


def _bind_props(
    binds: list[tuple[str, str, bool, int]], read_only: list[tuple[str, str, bool, int]]
) -> list[Prop]:
    """BindPaths= and BindReadOnlyPaths=, each only when it has entries: systemd keeps
    both in one list, and an empty assignment of either empties that whole list (a check
    with no read-only bind would otherwise start with its workspace unbound)."""
    return [
        *([("BindPaths", "a(ssbt)", binds)] if binds else []),
        *([("BindReadOnlyPaths", "a(ssbt)", read_only)] if read_only else []),
    ]


def _exec_props(argv: list[str], description: str, slice_: str) -> list[Prop]:
    return [
        ("Description", "s", description),
        ("Type", "s", "exec"),
        ("ExecStart", "a(sasb)", [(argv[0], list(argv), False)]),
        ("RemainAfterExit", "b", False),
        ("Restart", "s", "no"),
        ("CollectMode", "s", "inactive-or-failed"),
        ("Slice", "s", slice_),
        ("KillMode", "s", "control-group"),
        ("SendSIGKILL", "b", True),
        ("TimeoutStopUSec", "t", STOP_TIMEOUT_USEC),
    ]


def _limit_props(limits: ResourceLimits) -> list[Prop]:
    return [
        ("RuntimeMaxUSec", "t", limits.runtime_max_sec * USEC),
        ("MemoryAccounting", "b", True),
        ("MemoryMax", "t", limits.memory_max),
        ("MemorySwapMax", "t", 0),
        ("TasksAccounting", "b", True),
        ("TasksMax", "t", limits.tasks_max),
        ("CPUAccounting", "b", True),
        ("CPUQuotaPerSecUSec", "t", limits.cpu_quota_percent * 10_000),
        ("IOAccounting", "b", True),
        ("IOWeight", "t", limits.io_weight),
    ]


def _identity_props(uid: int, gid: int, umask: int, env: dict[str, str]) -> list[Prop]:
    return [
        ("User", "s", str(uid)),
        ("Group", "s", str(gid)),
        ("SupplementaryGroups", "as", []),
        ("UMask", "u", umask),
        ("Environment", "as", [f"{k}={v}" for k, v in env.items()]),
    ]


def _log_props(identifier: str, fields: dict[str, str]) -> list[Prop]:
    return [
        ("SyslogIdentifier", "s", identifier),
        ("LogExtraFields", "aay", [f"{k}={v}".encode() for k, v in fields.items()]),
    ]


def _hardening_props(
    hidden_paths: list[str], extra_tmpfs: tuple[tuple[str, str], ...] = ()
) -> list[Prop]:
    """The sandbox every Cairn-started unit shares: read-only system, no privileges."""
    tmpfs = [*extra_tmpfs, *((path, "mode=0755") for path in MASKED_PATHS)]
    return [
        ("ProtectSystem", "s", "strict"),
        ("ProtectHome", "s", "yes"),
        ("TemporaryFileSystem", "a(ss)", tmpfs),
        ("InaccessiblePaths", "as", [f"-{p}" for p in (*INACCESSIBLE_PATHS, *hidden_paths)]),
        ("PrivateTmp", "b", True),
        ("PrivateDevices", "b", True),
        ("PrivateIPC", "b", True),
        ("ProtectProc", "s", "invisible"),
        ("ProtectKernelTunables", "b", True),
        ("ProtectKernelModules", "b", True),
        ("ProtectKernelLogs", "b", True),
        ("ProtectControlGroups", "b", True),
        ("ProtectClock", "b", True),
        ("ProtectHostname", "b", True),
        ("RestrictNamespaces", "t", 0),  # the allowed CLONE_NEW* flags: none
        ("RestrictRealtime", "b", True),
        ("RestrictSUIDSGID", "b", True),
        ("LockPersonality", "b", True),
        ("NoNewPrivileges", "b", True),
        ("CapabilityBoundingSet", "t", 0),
        ("AmbientCapabilities", "t", 0),
        ("SystemCallArchitectures", "as", ["native"]),
        ("SystemCallFilter", "(bas)", (True, ["@system-service"])),
        # A second filter entry subtracts: the kernel keyrings are per UID, not per
        # namespace, so keyctl() would reach the owner's user keyring outside the unit.
        ("SystemCallFilter", "(bas)", (False, ["@keyring"])),
        ("SystemCallErrorNumber", "i", 1),  # EPERM instead of killing the process
    ]


def _network_props(
    network: NetworkMode,
    join_unit: str | None = None,
    loopback_tcp: bool = False,
) -> list[Prop]:
    if network == "none":
        # AF_UNIX stays: the model relay and finish_work go through the sockets.
        families = ["AF_UNIX", "AF_INET", "AF_INET6"] if loopback_tcp else ["AF_UNIX"]
        return [
            ("PrivateNetwork", "b", True),
            ("RestrictAddressFamilies", "(bas)", (True, families)),
        ]
    if network == "allowlist":
        # The proxy socket's namespace: lo and the proxy's listener, nothing routed.
        assert join_unit is not None
        return [
            ("PrivateNetwork", "b", True),
            ("JoinsNamespaceOf", "as", [join_unit]),
            ("RestrictAddressFamilies", "(bas)", (True, ["AF_UNIX", "AF_INET", "AF_INET6"])),
        ]
    # glibc's getaddrinfo(AI_ADDRCONFIG) needs AF_NETLINK.
    families = ["AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"]
    return [("RestrictAddressFamilies", "(bas)", (True, families))]


def _agent_isolation_props() -> list[Prop]:
    """What separates an agent from every process but its own (see the module docstring).

    With ``PrivatePIDs=`` the worker is PID 1 of its namespace: it installs its own
    SIGTERM handler (the kernel ignores unhandled signals to a namespace's init), and
    when it exits the kernel kills whatever it left behind in the namespace.
    """
    return [("PrivatePIDs", "s", "yes")]  # a string on D-Bus (systemd 257)


def agent_unit_properties(spec: AgentUnitSpec) -> list[Prop]:
    """The full property list of one agent attempt's transient service."""
    binds = [
        _bind(spec.workspace, WORKSPACE),
        _bind(spec.outputs, OUTPUTS),
        _bind(spec.state, STATE),
        _bind(spec.channel_dir, CHANNEL_DIR),
    ]
    ro_binds = [_bind(spec.evidence_dir, EVIDENCE)]
    ro_binds += [
        _bind(path, f"{EVIDENCE}/incoming/{name}/workspace") for name, path in spec.incoming
    ]
    if spec.capsule is not None:
        ro_binds.append(_bind(spec.capsule, CAPSULE))
    if spec.profile_files is not None:
        ro_binds.append(_bind(spec.profile_files, PROFILE_FILES_DIR))
    if spec.network == "host":  # "-": not every host runs systemd-resolved
        ro_binds += [(path, path, True, MS_REC) for path in HOST_NETWORK_RUN_PATHS]
    env = {
        **spec.environment,
        "HOME": STATE,
        "TMPDIR": "/tmp",  # noqa: S108  (the unit's own PrivateTmp=)
        "CAIRN_AGENT_SOCKET": AGENT_SOCKET,
        **({"CAIRN_MODEL_SOCKET": MODEL_SOCKET} if spec.model_relay else {}),
    }
    return [
        *_exec_props(spec.exec_argv, f"Cairn agent {spec.op_id} of run {spec.run_id}", AGENT_SLICE),
        # Files the agent creates become project files, so they get ordinary modes.
        *_identity_props(spec.uid, spec.gid, 0o022, env),
        ("WorkingDirectory", "s", WORKSPACE),
        *_log_props("cairn-agent", spec.log_fields),
        *_limit_props(spec),
        *_hardening_props(spec.hidden_paths, PRIVATE_TMPFS),
        *_agent_isolation_props(),
        *_network_props(spec.network, spec.join_unit, spec.loopback_tcp),
        *_bind_props(binds, ro_binds),
        # How the unit ended, for the coordinator: a collected unit's Result is gone,
        # and "oom-kill" or "timeout" must reach the person as the limit that was hit.
        # no-env-expand: the shell, not systemd, reads $SERVICE_RESULT and friends.
        (
            "ExecStopPostEx",
            "a(sasas)",
            [(SHELL, [SHELL, "-c", RECORD_SERVICE_RESULT], ["no-env-expand"])],
        ),
    ]


def proxy_unit_name(run_id: str) -> str:
    """``cairn-proxy-<run>.socket`` (and its ``.service``): the run's allowlist proxy."""
    if not is_run_id(run_id):
        raise UsageError(f"invalid run id {run_id!r}: expected flow_ and 32 lowercase hex digits")
    return validate_unit_name(f"cairn-proxy-{run_id}.socket")


def proxy_socket_properties(run_id: str, port: int) -> list[Prop]:
    """The proxy's listening socket on the loopback of a namespace systemd makes for it.

    Allowlist agents join that namespace (``JoinsNamespaceOf=``), and with it the unit's
    private /tmp and IPC namespace: without them here, a joining unit would get the host's.
    """
    return [
        ("Description", "s", f"Cairn allowlist proxy of run {run_id}"),
        ("Listen", "a(ss)", [("Stream", f"127.0.0.1:{port}")]),
        ("PrivateNetwork", "b", True),
        ("PrivateTmp", "b", True),
        ("PrivateIPC", "b", True),
        ("CollectMode", "s", "inactive-or-failed"),
    ]


def proxy_service_properties(run_id: str, exec_argv: list[str]) -> list[Prop]:
    """The proxy process: in the host's namespace (it connects out), unprivileged, with
    the same sandbox as every Cairn-started unit otherwise."""
    families = ["AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"]  # NETLINK: getaddrinfo
    return [
        *_exec_props(exec_argv, f"Cairn allowlist proxy of run {run_id}", HELPER_SLICE),
        ("DynamicUser", "b", True),
        *_log_props("cairn-proxy", {"CAIRN_RUN": run_id}),
        *_hardening_props([]),
        ("RestrictAddressFamilies", "(bas)", (True, families)),
    ]


def helper_unit_properties(spec: HelperUnitSpec) -> list[Prop]:
    """Properties of an import/apply/verify unit: owner identity, no network (or only the
    run's proxy, with ``join_unit``), given binds."""
    return [
        *_exec_props(spec.exec_argv, spec.description, HELPER_SLICE),
        *_identity_props(spec.uid, spec.gid, 0o022, spec.environment),
        ("WorkingDirectory", "s", spec.working_directory),
        *_log_props("cairn-helper", spec.log_fields),
        *_limit_props(spec),
        *_hardening_props(spec.hidden_paths, PRIVATE_TMPFS),
        *(_network_props("allowlist", spec.join_unit) if spec.join_unit
          else _network_props("none")),
        *_bind_props(
            [_bind(s, d) for s, d in spec.binds], [_bind(s, d) for s, d in spec.read_only_binds]
        ),
    ]
