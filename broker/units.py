"""Units the broker starts: the coordinator instance, agent attempts, and the owner's
import and apply units (the candidate unit: ``broker/candidate.py``).

Every argv here is fixed (the installed cairn modules under /usr/bin/python3 -I); every
path is derived from the pool and the launch description, never taken from a caller.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import time
from pathlib import Path
from typing import Any, Literal, TypedDict

from pydantic import ValidationError

from cairn import failpoints, paths, proc, untrusted
from cairn.background import yield_session
from cairn.broker.capsule import verified_capsule
from cairn.broker.server import allowed_uids
from cairn.errors import BrokerRefused, CairnError, NotFound, SystemdError
from cairn.netpolicy import (
    NETWORK_MODES,
    PROXY_PORT,
    NetworkMode,
    is_allowlist_entry,
    proxy_environment,
)
from cairn.protocol.broker import (
    CHECK_OUTPUT_LIMIT,
    AgentStarted,
    AgentStopped,
    CheckResult,
    EvidenceIndex,
    ImportDone,
    RawBytes,
)
from cairn.protocol.launch import (
    MODEL_API_ENV,
    MODEL_ENV,
    PROFILE_SHA256_ENV,
    EvaluatorSpec,
    LaunchDescription,
    ModelRoute,
    ProfileSpec,
    VerifierSpec,
)
from cairn.protocol.measurement import EvaluatorRun, MeasurementEnvironment, parse_metric_output
from cairn.protocol.settlement import ApplyResult
from cairn.systemd import Systemd, UnitState, cgroup_is_empty
from cairn.unitprops import (
    CAPSULE,
    AgentUnitSpec,
    HelperUnitSpec,
    agent_unit_name,
    agent_unit_properties,
    helper_unit_properties,
    proxy_service_properties,
    proxy_socket_properties,
    proxy_unit_name,
)
from cairn.validation import first_error

log = logging.getLogger(__name__)

PYTHON = "/usr/bin/python3"
IMPORT_TIMEOUT = 6 * 3600.0
# How long a helper an earlier broker left running gets to stop (TimeoutStopSec is 90 s).
LEFTOVER_STOP_TIMEOUT = 120.0
LEFTOVER_GONE_TIMEOUT = 10.0
APPLY_TIMEOUT = 3600.0
INDEX_LIMIT = 4 << 20  # evidence/index.json, written by the coordinator (user cairn)
# Results the run owner's helper units write. Root parses a candidate's result and an
# apply's (it acts on their paths) and records any other as raw bytes in a receipt: a
# receipt travels in the broker's reply (16 MiB, cairn/brokerclient.py), with the verb's
# other receipts, so what it records is bounded well below that.
RESULT_LIMIT = 64 << 20  # a candidate's or an apply's result.json, parsed by root
RAW_RESULT_LIMIT = 4 << 20  # a revert's or a check-applied's result.json, recorded
STATS_LIMIT = 1 << 20  # the import's stats.json, recorded (cairn/importer.py stays below)


def module_argv(module: str, *args: str) -> list[str]:
    return [PYTHON, "-I", "-m", module, *args]


def start_unit(name: str) -> None:
    with Systemd() as sd:
        job = sd.start_unit(name)
        _as_background(sd.wait_started(job))


def _as_background(state: UnitState | None) -> None:
    """A run unit just started yields the CPU where sessions share it (cairn/background.py);
    its children inherit the session, so this covers the unit."""
    if state is not None and state.main_pid > 0:
        yield_session(state.main_pid)


class HelperUnit(TypedDict):
    """A helper unit that ran to its end: its name and invocation ID."""

    unit: str
    invocation_id: str


class ChannelNotReady(Exception):
    """The intent's agent socket is not bound yet (its lane is still preparing it): the
    intent stays pending, and the lane's own launch-v1 carries it out."""


def _owned_subdir(parent: Path, name: str, desc: LaunchDescription) -> Path:
    path = parent / name
    path.mkdir(exist_ok=True)
    os.chown(path, desc.owner_uid, desc.owner_gid)
    return path


def _review_entry(desc: LaunchDescription, descriptor: object, key: str) -> object:
    agents = desc.review.get("agents")
    entry = (
        agents.get(descriptor) if isinstance(agents, dict) and isinstance(descriptor, str) else None
    )
    return entry.get(key) if isinstance(entry, dict) else None


def agent_network(desc: LaunchDescription, descriptor: object) -> NetworkMode:
    """The network mode the run's review gave the operation's agent descriptor."""
    network = _review_entry(desc, descriptor, "network")
    for mode in NETWORK_MODES:
        if network == mode:
            return mode
    raise BrokerRefused(f"agent descriptor {descriptor!r} is not in the run's review")


def profile_route(desc: LaunchDescription, profile: ProfileSpec) -> ModelRoute | None:
    """The route a profile's provider names in the pinned description, if any."""
    return desc.routes.get(profile.provider) if profile.provider else None


def agent_profile(desc: LaunchDescription, descriptor: object) -> ProfileSpec:
    """The frozen profile the run's review gave the operation's agent descriptor."""
    name = _review_entry(desc, descriptor, "profile")
    profile = desc.profiles.get(name) if isinstance(name, str) else None
    if profile is None:
        raise BrokerRefused(f"agent descriptor {descriptor!r} has no profile frozen at launch")
    return profile


def run_allowlist(desc: LaunchDescription) -> list[str]:
    """Every domain the run's review admits for its ``allowlist`` agents and its frozen
    evaluators' files admit for them, lower-cased: one proxy serves the run.

    An entry is checked exactly as review checked it (:func:`is_allowlist_entry`).
    """
    found: list[object] = [raw for evaluator in desc.evaluators
                           for raw in evaluator.allowlist or ()]
    agents = desc.review.get("agents")
    for entry in agents.values() if isinstance(agents, dict) else ():
        if isinstance(entry, dict) and entry.get("network") == "allowlist":
            found.extend(entry.get("allowlist", []))
    entries: set[str] = set()
    for raw in found:
        if not is_allowlist_entry(raw):
            raise BrokerRefused(f"allowlist entry {raw!r} of the run's review is not a domain")
        entries.add(raw.lower())
    return sorted(entries)


def ensure_proxy(desc: LaunchDescription) -> str:
    """Start the run's allowlist proxy socket unless it listens already; its unit name.

    systemd makes the socket's network namespace (only ``lo``); the proxy process it
    activates stays in the host's namespace and connects out to reviewed domains only.
    """
    name = proxy_unit_name(desc.run_id)
    allow = [arg for entry in run_allowlist(desc) for arg in ("--allow", entry)]
    with Systemd() as sd:
        state = sd.unit_state(name)
        if state is None or state.active_state in ("inactive", "failed"):
            if state is not None:
                sd.reset_failed(name)
            job = sd.start_transient_socket(
                name,
                proxy_socket_properties(desc.run_id, PROXY_PORT),
                proxy_service_properties(desc.run_id, module_argv("cairn.proxy", *allow)),
            )
            sd.wait_started(job)
    return name


def remove_proxy(run_id: str) -> bool:
    """Stop the run's proxy socket and service; True if either was running."""
    socket_unit = proxy_unit_name(run_id)
    found = False
    with Systemd() as sd:
        for name in (socket_unit.removesuffix(".socket") + ".service", socket_unit):
            state = sd.unit_state(name)
            if state is not None and state.active_state not in ("inactive", "failed"):
                sd.stop_unit(name)
                found = True
    return found


def set_egress_skipped(run_id: str, skipped: bool) -> None:
    """Make (``skipped``) or remove the run's flag that ``cairn-egress@<run>.service`` has
    as ``ConditionPathExists=!``: with it PID 1 skips the unit and starts no process.
    Without it (a run with model providers, or one launched before the flag existed) the
    egress starts, so a missing flag costs time, never a model call."""
    flags = paths.egress_skipped_dir()
    if skipped:
        untrusted.write_new(flags, run_id, b"", mode=0o644, uid=os.getuid(), gid=os.getgid())
    else:
        (flags / run_id).unlink(missing_ok=True)


def start_agent(
    desc: LaunchDescription,
    op_id: str,
    network: NetworkMode,
    attempt: int,
    workspace: Path,
    checkpoints: dict[str, Path],
    scratch: Path,
    *,
    profile_sha256: str,
    route: ModelRoute | None = None,
    profile_files: Path | None = None,
) -> AgentStarted:
    """Start one agent attempt as the run owner inside its mount namespace. The worker
    runs only a profile that hashes to ``profile_sha256`` (root's, in its environment),
    is told the model and API of its profile's ``route`` and finds ``profile_files`` (a
    command profile's directory in /etc/cairn) bound read-only.

    If the attempt's unit already exists (the broker died after starting it, before its
    receipt was stored), it is adopted rather than started twice.
    """
    op_dir = paths.run_state_dir(desc.run_id) / "ops" / op_id
    evidence = op_dir / "evidence"
    outputs = op_dir / f"outputs.{attempt}"
    channel = paths.agent_channel_dir(desc.run_id, op_id)
    for path in (evidence, outputs, channel):
        if path.is_symlink() or (path is not channel and not path.exists()):
            raise BrokerRefused(f"{path} is missing or a symlink; the coordinator prepares it")
    if not _socket_in(channel, "agent.sock"):
        raise ChannelNotReady(f"{op_id}: the coordinator is not listening for this agent yet")
    scratch.mkdir(parents=True, exist_ok=True)
    os.chmod(scratch, 0o755)  # noqa: S103  (each attempt's state below is owned and closed)
    state = _owned_subdir(scratch, f"state.{attempt}", desc)
    incoming = [(b, str(checkpoints[b])) for b in evidence_index(evidence) if b in checkpoints]
    # Sealed release (issue 9): the agent runs only the verified capsule's worker.
    release = verified_capsule(desc.capsule_hash)
    environment = {**_failpoint_env(), PROFILE_SHA256_ENV: profile_sha256}
    if route is not None:
        environment.update({MODEL_ENV: route.model, MODEL_API_ENV: route.api})
    join_unit = None
    if network == "allowlist":
        join_unit = ensure_proxy(desc)
        environment.update(proxy_environment())
    spec = AgentUnitSpec(
        run_id=desc.run_id,
        op_id=op_id,
        uid=desc.owner_uid,
        gid=desc.owner_gid,
        exec_argv=[PYTHON, "-I", "-B", f"{CAPSULE}/{release.entry}"],
        capsule=release.path,
        profile_files=None if profile_files is None else str(profile_files),
        workspace=str(workspace),
        evidence_dir=str(evidence),
        incoming=incoming,
        outputs=str(outputs),
        state=str(state),
        channel_dir=str(channel),
        memory_max=desc.limits.memory_max,
        tasks_max=desc.limits.tasks_max,
        cpu_quota_percent=desc.limits.cpu_quota_percent,
        runtime_max_sec=desc.limits.runtime_max_sec,
        io_weight=desc.limits.io_weight,
        network=network,
        join_unit=join_unit,
        environment=environment,
        log_fields={"CAIRN_RUN": desc.run_id, "CAIRN_OP": op_id},
        **_model_relay(desc, op_id),
    )
    name = agent_unit_name(desc.run_id, op_id, attempt)
    with Systemd() as sd:
        state_now = sd.unit_state(name)
        if state_now is not None:
            log.warning("adopting %s, started before a broker restart", name)
        elif _note_start(scratch, attempt):
            job = sd.start_transient_service(name, agent_unit_properties(spec))
            state_now = sd.wait_started(job)
        else:  # started before a broker restart and already gone: never run it twice
            log.warning("%s was started before a broker restart and has ended", name)
        _as_background(state_now)
    return AgentStarted(
        unit=name,
        invocation_id=state_now.invocation_id if state_now else "",
        control_group=state_now.control_group if state_now else "",
        attempt=attempt,
        capsule=release.hash,
        op_id=op_id,
    )


def evidence_index(evidence: Path) -> list[str]:
    """The operations whose checkpoints the agent gets, from the coordinator's
    ``index.json``, parsed once into a typed value (a refusal if it is not one)."""
    raw = untrusted.read_bytes(evidence, "index.json", owner=allowed_uids(), limit=INDEX_LIMIT)
    try:
        return list(EvidenceIndex.model_validate_json(raw).incoming)
    except ValidationError as exc:
        where, message = first_error(exc)
        raise BrokerRefused(f"{evidence}/index.json is invalid: {where}: {message}") from None


def _note_start(scratch: Path, attempt: int) -> bool:
    """Record, durably and before the unit exists, that this attempt's unit is being
    started; False if it was already (a broker killed before storing the receipt, whose
    agent may have finished and been collected since: its effect is in W once)."""
    try:
        fd = os.open(scratch / f"started.{attempt}",
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        return False
    os.close(fd)
    fd = os.open(scratch, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)  # the entry, before any unit exists
    finally:
        os.close(fd)
    return True


def _model_relay(desc: LaunchDescription, op_id: str) -> dict[str, Any]:
    """Bind the op's model socket when the coordinator serves one (the op's profile uses a
    model); command profiles also get loopback TCP for their shim."""
    if not _socket_in(paths.agent_channel_dir(desc.run_id, op_id), "model.sock"):
        return {}
    command = any(p.kind == "command" and p.provider for p in desc.profiles.values())
    return {"model_relay": True, "loopback_tcp": command}


def _socket_in(channel: Path, name: str) -> bool:
    """Whether ``channel/name`` is itself a socket: agents write in their channel
    directory (bound at /run/cairn/agent), so a link there is not followed."""
    try:
        return stat.S_ISSOCK(untrusted.lstat(channel, name).st_mode)
    except untrusted.UntrustedFileError:
        return False


def _failpoint_env() -> dict[str, str]:
    """Pass test failpoints on to agents (empty in production)."""
    value = os.environ.get(failpoints.ENV, "")
    return {failpoints.ENV: value} if value else {}


def stop_agent(desc: LaunchDescription, op_id: str, attempt: int) -> AgentStopped:
    """Stop one agent attempt (a cancelled run or lane) and wait until its cgroup is empty;
    say whether it had written its result first."""
    name = agent_unit_name(desc.run_id, op_id, attempt)
    with Systemd() as sd:
        state = sd.unit_state(name)
        control_group = state.control_group if state is not None else ""
        if state is not None and state.active_state not in ("inactive", "failed"):
            sd.stop_unit(name)
            deadline = time.monotonic() + 120
            while (now := sd.unit_state(name)) is not None and now.active_state not in (
                "inactive",
                "failed",
            ):
                if time.monotonic() > deadline:
                    raise BrokerRefused(f"{name} did not stop")
                time.sleep(0.2)
    if not cgroup_is_empty(control_group):
        raise BrokerRefused(f"{name} left processes in {control_group}")
    return AgentStopped(
        unit=name, stopped=True, result_file=result_file_written(desc, op_id, attempt)
    )


def result_file_written(desc: LaunchDescription, op_id: str, attempt: int) -> bool:
    """Whether the agent left a ``finish.json``: a regular file of the run owner, found
    without following a link or opening it (the agent wrote it; this runs as root)."""
    outputs = paths.run_state_dir(desc.run_id) / "ops" / op_id / f"outputs.{attempt}"
    return untrusted.is_regular_file(outputs, "finish.json", owner=desc.owner_uid)


def require_ended(units: list[str], what: str) -> None:
    """Refuse unless PID 1 says none of ``units`` is running (one that is stopping gets a
    few seconds); the journal's word that a run ended is cairn's, not root's."""
    with Systemd() as sd:
        for unit in units:
            state = sd.unit_state(unit)
            if state is not None and state.active_state == "deactivating":
                try:
                    state = sd.wait_inactive(unit, timeout=30)
                except CairnError:
                    state = sd.unit_state(unit)
            if state is not None and state.active_state not in ("inactive", "failed"):
                raise BrokerRefused(f"{unit} is still {state.active_state}; {what}")


def require_quiesced(unit: str, control_group: str) -> None:
    """Refuse unless the unit is inactive (or collected) and its cgroup is empty."""
    with Systemd() as sd:
        state = sd.unit_state(unit)
        if state is not None and state.active_state not in ("inactive", "failed"):
            raise BrokerRefused(f"{unit} is still {state.active_state}; no checkpoint yet")
        if state is not None and state.control_group:
            control_group = state.control_group
    if not cgroup_is_empty(control_group):
        raise BrokerRefused(f"{unit} left processes in {control_group}; no checkpoint yet")


def _run_to_end(
    spec: HelperUnitSpec, name: str, timeout: float, *, sync_journal: bool = False
) -> UnitState:
    """Start a helper unit and wait until it is inactive. ``sync_journal``: have journald
    take in all the unit printed while the unit is still pinned, so every line carries
    its ``_SYSTEMD_INVOCATION_ID`` (journald reads it off the loaded unit; a line taken
    in after the unit was collected has none, and a read by invocation would miss it)."""
    with Systemd() as sd:
        _end_leftover(sd, name)
        job = sd.start_transient_service(name, helper_unit_properties(spec))
        _as_background(sd.wait_started(job))
        state = sd.wait_inactive(name, timeout)
        if sync_journal:
            synced = proc.run(["journalctl", "--sync"], check=False)
            if synced.returncode != 0:
                log.warning("journalctl --sync failed (status %d): %s", synced.returncode,
                            synced.stderr.decode(errors="replace").strip()[-300:])
        sd.unref(name)
    return state


def end_leftover(name: str) -> None:
    """Stop the helper unit ``name`` if an earlier broker started it and died before it
    ended (a crash mid-verb), and wait until it has; a retried verb then owns the name and
    whatever that unit was writing."""
    with Systemd() as sd:
        _end_leftover(sd, name)


def _end_leftover(sd: Systemd, name: str) -> None:
    state = sd.unit_state(name)
    if state is None:
        return
    if not state.finished:
        log.warning("%s was left %s by an earlier broker; stopping it", name, state.active_state)
        sd.stop_unit(name)
        try:
            sd.wait_inactive(name, LEFTOVER_STOP_TIMEOUT)
        except NotFound:
            return  # stopped and collected
    sd.reset_failed(name)  # a failed transient unit is collected only once reset
    deadline = time.monotonic() + LEFTOVER_GONE_TIMEOUT
    while sd.unit_state(name) is not None:  # until PID 1 has collected it: the name is free
        if time.monotonic() > deadline:
            raise BrokerRefused(
                f"{name} has ended but stays loaded, so it cannot be started again",
                hint=f"'systemctl reset-failed {name}', then retry the run",
            )
        time.sleep(0.1)


def run_helper(spec: HelperUnitSpec, name: str, timeout: float) -> HelperUnit:
    """Start a helper unit and wait until it is gone; return its final state."""
    state = _run_to_end(spec, name, timeout)
    if state.result != "success":
        raise SystemdError(
            f"{name} failed ({state.result}, status {state.exec_main_status})",
            hint=f"see 'journalctl -u {name}'",
        )
    return {"unit": name, "invocation_id": state.invocation_id}


# How long a succeeded evaluator's output may take to reach the journal.
OUTPUT_WAIT_SEC = 10.0


def _run_command(
    desc: LaunchDescription,
    command: VerifierSpec | EvaluatorSpec,
    workspace: Path,
    what: str,
    name: str,
) -> tuple[UnitState, bytes]:
    """Run a host-configured command over ``workspace`` (a disposable writable snapshot)
    as the project's owner, without network (an evaluator whose file allows domains: only
    those, through the run's proxy), and wait for it; return its final state and
    the last 200 lines it printed, read from the journal by the unit's own invocation or
    unique name (:func:`_unit_output`), never from a file the command could write. Root
    does not decode them: the command is the owner's."""
    proxied = isinstance(command, EvaluatorSpec) and command.allowlist is not None
    spec = HelperUnitSpec(
        description=f"Cairn {what} {command.name} of run {desc.run_id}",
        uid=desc.owner_uid,
        gid=desc.owner_gid,
        exec_argv=command.argv,
        binds=[(str(workspace), "/workspace")],
        working_directory="/workspace",
        environment={**command.environment, **(proxy_environment() if proxied else {})},
        join_unit=ensure_proxy(desc) if proxied else None,
        memory_max=desc.limits.memory_max,
        tasks_max=512,
        cpu_quota_percent=100 * max(1, os.cpu_count() or 1),
        runtime_max_sec=command.timeout_sec,
        log_fields={"CAIRN_RUN": desc.run_id},
    )
    since = int(time.time()) - 1
    state = _run_to_end(spec, name, command.timeout_sec + 60, sync_journal=True)
    measured = isinstance(command, EvaluatorSpec) and state.result == "success"
    wait = OUTPUT_WAIT_SEC if measured else 0.0
    output = _unit_output(name, state.invocation_id, since, wait)
    for _ in range(8):  # journald may still be taking in the last lines: until it settles
        time.sleep(0.25)
        again = _unit_output(name, state.invocation_id, since, 0.0)
        if again == output:
            break
        output = again
    return state, output


def _unit_output(name: str, invocation_id: str, since: int, wait: float) -> bytes:
    """What unit ``name`` printed, from the journal: by its invocation or by the unit's
    unique name since it started, whichever holds more. A line journald takes in after
    the unit was collected has no invocation ID, so a read by invocation alone missed the
    last lines of a check under load. Asked again for ``wait`` seconds while there is
    nothing: an evaluator that succeeded printed its metric line, journald may only be
    slow to take it in."""
    deadline = time.monotonic() + wait
    while True:
        output = max(
            (
                proc.run(["journalctl", "--no-pager", "-o", "cat", "-n", "200", *match],
                         check=False).stdout
                for match in ([f"_SYSTEMD_INVOCATION_ID={invocation_id}"],
                              [f"_SYSTEMD_UNIT={name}", f"--since=@{since}"])
            ),
            key=lambda out: out.count(b"\n"),
        )
        if output.strip() or time.monotonic() >= deadline:
            return output
        time.sleep(0.25)


def run_check(
    desc: LaunchDescription, verifier: VerifierSpec, workspace: Path, attempt: int
) -> CheckResult:
    """Run one host-configured check over ``workspace`` (a disposable writable snapshot of
    F). Pass or fail comes from systemd (the exit status of the administrator's argv);
    what it printed is recorded as bytes, never parsed here."""
    name = f"cairn-check-{desc.run_id}-{verifier.name}-{attempt}.service"
    state, output = _run_command(desc, verifier, workspace, "check", name)
    return CheckResult(
        name=verifier.name,
        unit=name,
        invocation_id=state.invocation_id,
        passed=state.result == "success",
        result=state.result,
        exit_status=state.exec_main_status,
        output_raw=RawBytes.of(output, limit=CHECK_OUTPUT_LIMIT),
    )


def run_evaluator(
    desc: LaunchDescription, evaluator: EvaluatorSpec, workspace: Path, name: str, warmup: bool
) -> tuple[EvaluatorRun, bytes]:
    """One run of an evaluator over ``workspace`` (a disposable writable snapshot of W):
    how it ended, the metric values of its one JSON line (None when it failed or printed
    none: root stops the measurement there, so it parses that line, strictly, at the
    edge) and the last bytes of its output, unparsed."""
    state, output = _run_command(desc, evaluator, workspace, "evaluator", name)
    output = output[-CHECK_OUTPUT_LIMIT:]
    values = parse_metric_output(output) if state.result == "success" else None
    run = EvaluatorRun(
        unit=name,
        invocation_id=state.invocation_id,
        warmup=warmup,
        result=state.result,
        exit_status=state.exec_main_status,
        values=values,
    )
    return run, output


def measurement_environment(evaluator: EvaluatorSpec) -> MeasurementEnvironment:
    """The evaluator's configuration hash, the kernel release and the CPU model."""
    cpu = os.uname().machine
    try:
        with open("/proc/cpuinfo", "rb") as info:
            for line in info.read(1 << 20).decode(errors="replace").splitlines():
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model") and value.strip():
                    cpu = value.strip()[:256]
                    break
    except OSError:
        pass
    return MeasurementEnvironment(
        evaluator=evaluator.name,
        config_sha256=evaluator.config_sha256,
        kernel=os.uname().release[:256],
        cpu=cpu,
    )


def progress_bind(run_id: str, phase: str) -> list[tuple[str, str]]:
    """The bind of the run's ``progress/<phase>`` directory at ``/progress`` when the
    coordinator prepared one (a directory of the coordinator's user, reached from the
    state directory without following a link); otherwise none, and the helper reports
    no progress."""
    rel = f"runs/{run_id}/progress/{phase}"
    try:
        st = untrusted.lstat(paths.state_dir(), rel)
    except untrusted.UntrustedFileError:
        return []
    if not stat.S_ISDIR(st.st_mode) or st.st_uid not in allowed_uids():
        return []
    return [(str(paths.state_dir() / rel), "/progress")]


def import_unit_name(run_id: str) -> str:
    return f"cairn-import-{run_id}.service"


def run_import(desc: LaunchDescription, project: Path, staging: Path) -> ImportDone:
    """Copy the project into ``staging`` as its owner (never capturing what they can't
    read); its statistics are the owner's bytes, recorded and never parsed here."""
    result_dir = staging.parent / "import-result"
    result_dir.mkdir(exist_ok=True)
    os.chown(result_dir, desc.owner_uid, desc.owner_gid)
    progress = progress_bind(desc.run_id, "import")
    argv = ["/source", "/target", "--stats", "/result/stats.json"]
    spec = HelperUnitSpec(
        description=f"Cairn import of {project} for run {desc.run_id}",
        uid=desc.owner_uid,
        gid=desc.owner_gid,
        exec_argv=module_argv(
            "cairn.importer", *argv, *(["--progress", "/progress"] if progress else [])
        ),
        binds=[(str(staging), "/target"), (str(result_dir), "/result"), *progress],
        read_only_binds=[(str(project), "/source")],
        memory_max=desc.limits.memory_max,
        tasks_max=64,
        cpu_quota_percent=100,
        runtime_max_sec=int(IMPORT_TIMEOUT),
        log_fields={"CAIRN_RUN": desc.run_id},
    )
    unit = run_helper(spec, import_unit_name(desc.run_id), IMPORT_TIMEOUT)
    stats = untrusted.read_bytes(result_dir, "stats.json", owner=desc.owner_uid, limit=STATS_LIMIT)
    return ImportDone(**unit, stats_raw=RawBytes.of(stats))


def run_apply(
    desc: LaunchDescription,
    attempt: int,
    q: Path,
    f: Path,
    subpath: str,
    accepted: list[str],
    work: Path,
    step: Literal["apply", "revert", "check-applied"] = "apply",
    applied: Path | None = None,
) -> dict[str, Any]:
    """Apply F to the live project as its owner with the three-way check; return the
    unit's name and invocation ID with the apply result. A revert passes F as ``q`` and Q
    as ``f``: the same check then writes Q back where the live project still holds F.
    ``check-applied`` writes nothing: the live project is bound read-only and the result
    (an ``AppliedCheck``) says what it holds at each accepted path and each path of the
    apply's receipts in ``applied`` (the apply's work directory, read-only).

    Only an apply's result is parsed here (an ``ApplyResult``: check-applied later acts
    on its paths); a revert's and a check's are recorded as raw bytes (``result_raw``)."""
    check = step == "check-applied"
    work.mkdir(parents=True, exist_ok=True)
    os.chown(work, desc.owner_uid, desc.owner_gid)
    # work/ is the owner's: replace, never write through, whatever an earlier attempt left
    plan = json.dumps(accepted).encode()
    untrusted.write_new(work, "plan.json", plan, mode=0o644, uid=desc.owner_uid, gid=desc.owner_gid)
    (work / "result.json").unlink(missing_ok=True)
    progress = [] if check else progress_bind(desc.run_id, "apply")
    live = [(desc.project.root, "/live")]
    receipts = "/applied/receipts.jsonl" if check else "/apply/receipts.jsonl"
    spec = HelperUnitSpec(
        description=f"Cairn {step} of run {desc.run_id}",
        uid=desc.owner_uid,
        gid=desc.owner_gid,
        exec_argv=module_argv(
            "cairn.worker.apply",
            "--q",
            "/q",
            "--f",
            "/f",
            "--live",
            "/live",
            "--plan",
            "/apply/plan.json",
            "--receipts",
            receipts,
            "--result",
            "/apply/result.json",
            *(["--progress", "/progress"] if progress else []),
            *(["--check"] if check else []),
        ),
        environment=_failpoint_env(),
        binds=[*([] if check else live), (str(work), "/apply"), *progress],
        read_only_binds=[
            (str(q / subpath) if subpath else str(q), "/q"),
            (str(f / subpath) if subpath else str(f), "/f"),
            *(live if check else []),
            *([(str(applied), "/applied")] if check and applied is not None else []),
        ],
        memory_max=desc.limits.memory_max,
        tasks_max=64,
        cpu_quota_percent=100,
        runtime_max_sec=int(APPLY_TIMEOUT),
        log_fields={"CAIRN_RUN": desc.run_id},
    )
    unit = run_helper(spec, f"cairn-{step}-{desc.run_id}-{attempt}.service", APPLY_TIMEOUT)
    if step != "apply":
        raw = untrusted.read_bytes(
            work, "result.json", owner=desc.owner_uid, limit=RAW_RESULT_LIMIT
        )
        return {**unit, "result_raw": RawBytes.of(raw).model_dump()}
    raw = untrusted.read_bytes(work, "result.json", owner=desc.owner_uid, limit=RESULT_LIMIT)
    try:
        result = ApplyResult.model_validate_json(raw, strict=True)
    except ValidationError as exc:
        where, message = first_error(exc)
        raise BrokerRefused(f"{unit['unit']} wrote an invalid result: {where}: {message}") from None
    return {**unit, "result": result.model_dump(mode="json")}
