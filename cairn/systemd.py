"""A blocking client for systemd's manager on the system bus (jeepney).

One :class:`Systemd` object owns one bus connection. The root broker uses it to start
transient units and the coordinator template; the coordinator uses the read-only calls to
watch a unit. Signals are only wake-ups: every decision is taken from ``GetAll`` replies,
and a signal is accepted only from the unique bus name that owns ``org.freedesktop.systemd1``.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

from jeepney import (
    DBusAddress,
    HeaderFields,
    MatchRule,
    Message,
    MessageGenerator,
    message_bus,
    new_method_call,
)
from jeepney.io.blocking import DBusConnection, open_dbus_connection
from jeepney.io.common import FilterHandle
from jeepney.wrappers import DBusErrorResponse, unwrap_msg
from pydantic import BaseModel, ConfigDict, ValidationError

from cairn.errors import NotFound, SystemdError, UsageError

log = logging.getLogger(__name__)

Prop = tuple[str, str, object]
"""One unit property as sent to ``StartTransientUnit``: (name, D-Bus signature, value)."""

AuxUnit = tuple[str, Sequence[Prop]]

SD_BUS_NAME = "org.freedesktop.systemd1"
SD_PATH = "/org/freedesktop/systemd1"
MANAGER_IF = "org.freedesktop.systemd1.Manager"
UNIT_IF = "org.freedesktop.systemd1.Unit"
PROPERTIES_IF = "org.freedesktop.DBus.Properties"
DEFAULT_SYSTEM_BUS = "unix:path=/run/dbus/system_bus_socket"
CGROUP_ROOT = Path("/sys/fs/cgroup")

UNIT_NAME_RE = re.compile(r"^[A-Za-z0-9:_.\-@]+\.(service|socket|scope|slice|timer)$")
UNIT_NAME_MAX_BYTES = 255

# Per-type interface that carries ControlGroup/Result (and ExecMain* for services).
_TYPE_INTERFACES = {
    "service": "org.freedesktop.systemd1.Service",
    "scope": "org.freedesktop.systemd1.Scope",
    "socket": "org.freedesktop.systemd1.Socket",
    "slice": "org.freedesktop.systemd1.Slice",
    "timer": "org.freedesktop.systemd1.Timer",
}

CALL_TIMEOUT = 30.0
# Signals wake the waiters; this re-read interval only bounds the damage of a lost signal
# (for example when systemd re-executes and its bus name changes owner).
RECHECK_INTERVAL = 5.0


def validate_unit_name(name: str) -> str:
    """Return ``name`` if it is a safe unit name of a type Cairn manages; else raise UsageError."""
    if len(name.encode()) > UNIT_NAME_MAX_BYTES or not UNIT_NAME_RE.fullmatch(name):
        raise UsageError(
            f"invalid unit name {name!r}: use [A-Za-z0-9:_.-@] with a .service, .socket, .scope, "
            f".slice or .timer suffix, at most {UNIT_NAME_MAX_BYTES} bytes"
        )
    return name


def unit_object_path(name: str) -> str:
    """The manager's object path for unit ``name`` (systemd's ``bus_label_escape``)."""
    out: list[str] = []
    for i, ch in enumerate(name):
        if ("a" <= ch <= "z") or ("A" <= ch <= "Z") or (i > 0 and "0" <= ch <= "9"):
            out.append(ch)
        else:
            out.extend(f"_{b:02x}" for b in ch.encode())
    return "/org/freedesktop/systemd1/unit/" + ("".join(out) or "_")


class UnitState(BaseModel):
    """A unit's state as read from the manager in one pair of ``GetAll`` calls."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid")

    name: str
    load_state: str
    active_state: str
    sub_state: str
    job_id: int
    result: str
    exec_main_code: int
    exec_main_status: int
    control_group: str
    invocation_id: str
    main_pid: int

    @property
    def finished(self) -> bool:
        """Inactive or failed with no job queued: the run is over (as ``systemd-run --wait``)."""
        return self.active_state in ("inactive", "failed") and self.job_id == 0


class DBusCallFailed(SystemdError):
    """A D-Bus method call got an error reply; ``dbus_name`` is the error's name."""

    def __init__(
        self, message: str, *, dbus_name: str, detail: str, hint: str | None = None
    ) -> None:
        super().__init__(message, hint=hint)
        self.dbus_name = dbus_name
        self.detail = detail


NO_SUCH_UNIT = "org.freedesktop.systemd1.NoSuchUnit"


def _error_text(err: DBusErrorResponse) -> str:
    detail = err.data[0] if err.data and isinstance(err.data[0], str) else ""
    detail = " ".join(detail.split())  # keep the message on one line
    return f"{err.name}: {detail}" if detail else str(err.name)


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise SystemdError(f"systemd sent {type(value).__name__} where a string was expected")
    return value


def _cgroup_v2_populated(events: Path) -> bool | None:
    """``populated`` from a cgroup v2 ``cgroup.events``; None if the cgroup is gone."""
    try:
        text = events.read_text()
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "populated":
            return value.strip() != "0"
    raise SystemdError(f"{events} has no 'populated' line; check the cgroup v2 mount")


def _cgroup_v1_populated(top: Path) -> bool | None:
    """Whether any cgroup.procs in the v1 subtree ``top`` names a process; None if gone."""
    if not top.is_dir():
        return None
    for dirpath, _dirs, files in os.walk(top):
        if "cgroup.procs" not in files:
            continue
        try:
            if Path(dirpath, "cgroup.procs").read_text().strip():
                return True
        except FileNotFoundError:
            continue  # a child cgroup was pruned while we walked
    return False


def cgroup_is_empty(control_group: str, *, root: Path = CGROUP_ROOT) -> bool:
    """True if no process is left in ``control_group`` or below it.

    ``control_group`` is a unit's ``ControlGroup`` recorded while it was active ("" means
    systemd already pruned it). On cgroup v2 the subtree's ``cgroup.events`` decides; on a
    hybrid or v1 host every hierarchy systemd tracks (``unified`` and ``name=systemd``)
    must agree, so a process in either one counts.
    """
    if not control_group:
        return True
    if not control_group.startswith("/") or ".." in control_group.split("/"):
        raise UsageError(f"invalid control group path {control_group!r}")
    rel = control_group.lstrip("/")
    if (root / "cgroup.controllers").exists():
        return not _cgroup_v2_populated(root / rel / "cgroup.events")
    checked = False
    if (root / "unified" / "cgroup.controllers").exists():
        checked = True
        if _cgroup_v2_populated(root / "unified" / rel / "cgroup.events"):
            return False
    if (root / "systemd" / "cgroup.procs").exists():
        checked = True
        if _cgroup_v1_populated(root / "systemd" / rel):
            return False
    if not checked:
        raise SystemdError(f"no systemd cgroup hierarchy under {root}; is cgroupfs mounted?")
    return True


class Systemd:
    """One blocking connection to PID 1's manager over the system bus.

    Use as a context manager. Transient units started here carry ``AddRef=true``, which
    pins them to this connection until :meth:`unref` (or until the connection closes), so
    their results stay readable after they finish.
    """

    def __init__(self, address: str | None = None) -> None:
        bus = address or os.environ.get("DBUS_SYSTEM_BUS_ADDRESS") or DEFAULT_SYSTEM_BUS
        try:
            self._conn: DBusConnection = open_dbus_connection(bus=bus, auth_timeout=5.0)
        except (OSError, TimeoutError) as e:
            raise SystemdError(
                f"cannot connect to the system bus at {bus}: {e}",
                hint="check that dbus is running (systemctl status dbus)",
            ) from e
        self._manager = DBusAddress(SD_PATH, bus_name=SD_BUS_NAME, interface=MANAGER_IF)
        self._signals: deque[Message] = deque()
        self._subscribed = False
        self._watches: dict[str, list[str]] = {}
        self._job_results: dict[str, tuple[str, str]] = {}
        self._last_cgroup: dict[str, str] = {}
        self._owner = ""
        self._filter: FilterHandle | None = None
        try:
            (owner,) = self._call(message_bus, "GetNameOwner", "s", (SD_BUS_NAME,))
            self._owner = _str(owner)
            # Local filter on the UNIQUE name: anyone may emit a signal claiming any path.
            self._filter = self._conn.filter(
                MatchRule(type="signal", sender=self._owner), queue=self._signals
            )
        except BaseException:
            self._conn.close()
            raise

    def __enter__(self) -> Systemd:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection; systemd drops this connection's unit references with it."""
        if self._filter is not None:
            self._filter.close()
            self._filter = None
        self._conn.close()

    # -- bus plumbing ----------------------------------------------------------------

    def _call(
        self,
        address: DBusAddress | MessageGenerator,
        method: str,
        signature: str | None = None,
        body: tuple[object, ...] = (),
        *,
        timeout: float = CALL_TIMEOUT,
    ) -> tuple[object, ...]:
        """Call ``method`` and return the reply body; an error reply raises DBusCallFailed."""
        msg = new_method_call(address, method, signature, body)
        try:
            reply = self._conn.send_and_get_reply(msg, timeout=timeout)
        except TimeoutError as e:
            raise SystemdError(
                f"{method} got no reply within {timeout:g}s",
                hint="check that systemd and dbus are responsive",
            ) from e
        except OSError as e:
            raise SystemdError(f"lost the system bus connection during {method}: {e}") from e
        self._record_signals()
        try:
            return tuple(unwrap_msg(reply))
        except DBusErrorResponse as e:
            detail = _error_text(e)
            raise DBusCallFailed(
                f"{method} failed: {detail}", dbus_name=str(e.name), detail=detail
            ) from e

    def _manager_call(
        self, method: str, signature: str | None = None, body: tuple[object, ...] = ()
    ) -> tuple[object, ...]:
        return self._call(self._manager, method, signature, body)

    def _record_signals(self) -> bool:
        """Consume queued signals; remember JobRemoved for watched units. True if any came."""
        got = bool(self._signals)
        while self._signals:
            msg = self._signals.popleft()
            fields = msg.header.fields
            if (
                fields.get(HeaderFields.path) == SD_PATH
                and fields.get(HeaderFields.interface) == MANAGER_IF
                and fields.get(HeaderFields.member) == "JobRemoved"
            ):
                _id, job, unit, result = msg.body
                if unit in self._watches:
                    self._job_results[job] = (unit, result)
        return got

    def _pump(self, timeout: float) -> None:
        """Block until a signal from systemd arrives or ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        try:
            while not self._record_signals():
                self._conn.recv_messages(timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            pass
        except OSError as e:
            raise SystemdError(f"lost the system bus connection: {e}") from e

    def _add_match(self, rule: MatchRule) -> str:
        text: str = rule.serialise()
        self._call(message_bus, "AddMatch", "s", (text,))
        return text

    def _watch(self, name: str) -> bool:
        """Install bus-side match rules for ``name`` (before any start). False if already set."""
        if name in self._watches:
            return False
        if not self._subscribed:
            self._manager_call("Subscribe")
            self._subscribed = True
        job_rule = MatchRule(
            type="signal",
            sender=SD_BUS_NAME,
            path=SD_PATH,
            interface=MANAGER_IF,
            member="JobRemoved",
        )
        job_rule.add_arg_condition(2, name)
        props_rule = MatchRule(
            type="signal",
            sender=SD_BUS_NAME,
            path=unit_object_path(name),
            interface=PROPERTIES_IF,
            member="PropertiesChanged",
        )
        rules = self._watches[name] = []
        rules.append(self._add_match(job_rule))
        rules.append(self._add_match(props_rule))
        return True

    def _unwatch(self, name: str) -> None:
        for text in self._watches.pop(name, []):
            try:
                self._call(message_bus, "RemoveMatch", "s", (text,))
            except DBusCallFailed as e:
                log.debug("RemoveMatch failed for %s: %s", name, e.detail)
        for job in [j for j, (unit, _r) in self._job_results.items() if unit == name]:
            del self._job_results[job]

    def _get_all(self, path: str, interface: str) -> dict[str, object]:
        props = DBusAddress(path, bus_name=SD_BUS_NAME, interface=PROPERTIES_IF)
        (values,) = self._call(props, "GetAll", "s", (interface,))
        if not isinstance(values, dict):
            raise SystemdError(f"GetAll({interface}) returned {type(values).__name__}")
        return {str(k): v[1] for k, v in values.items()}

    def _unit_path(self, name: str) -> str | None:
        """``GetUnit``: the loaded unit's path, or None. Never loads a stub for an unknown name."""
        try:
            (path,) = self._manager_call("GetUnit", "s", (name,))
        except DBusCallFailed as e:
            if e.dbus_name == NO_SUCH_UNIT:
                return None
            raise SystemdError(f"GetUnit({name}) failed: {e.detail}") from e
        return _str(path)

    # -- starting ----------------------------------------------------------------------

    def start_transient_service(self, name: str, props: Sequence[Prop]) -> str:
        """Start transient service ``name`` (mode ``fail``) and return its start job's path.

        Match rules and ``Subscribe`` are in place before the call, so the job's end is never
        missed; pass the returned path to :meth:`wait_started`. This method adds
        ``AddRef=true`` itself (the pin belongs to this connection), so ``props`` must not
        carry ``AddRef``. systemd refusals (``UnitExists``, ``InvalidArgs``,
        ``PropertyReadOnly`` …) raise SystemdError naming the D-Bus error.
        """
        validate_unit_name(name)
        if not name.endswith(".service"):
            raise UsageError(f"{name} is not a .service unit")
        return self._start_transient(name, props, ())

    def start_transient_socket(
        self, name: str, props: Sequence[Prop], service_props: Sequence[Prop]
    ) -> str:
        """Start transient socket ``name`` with its service (same name, ``.service``) as an
        auxiliary unit, activated by the first connection; return the socket's start job."""
        validate_unit_name(name)
        if not name.endswith(".socket"):
            raise UsageError(f"{name} is not a .socket unit")
        service = name.removesuffix(".socket") + ".service"
        return self._start_transient(name, props, [(service, service_props)])

    def _start_transient(self, name: str, props: Sequence[Prop], aux: Sequence[AuxUnit]) -> str:
        if any(p[0] == "AddRef" for p in props):
            raise UsageError("AddRef is set by Systemd.start_transient_service; drop it from props")
        for aux_name, _aux_props in aux:
            validate_unit_name(aux_name)
        wire = [(n, (sig, v)) for n, sig, v in props] + [("AddRef", ("b", True))]
        wire_aux = [(a, [(n, (sig, v)) for n, sig, v in ps]) for a, ps in aux]
        added = self._watch(name)
        try:
            (job,) = self._manager_call(
                "StartTransientUnit", "ssa(sv)a(sa(sv))", (name, "fail", wire, wire_aux)
            )
        except DBusCallFailed as e:
            if added:
                self._unwatch(name)
            hint = None
            if e.dbus_name == "org.freedesktop.systemd1.UnitExists":
                hint = "use a new unit name for every attempt"
            elif e.dbus_name in (
                "org.freedesktop.DBus.Error.PropertyReadOnly",
                "org.freedesktop.DBus.Error.UnknownProperty",
            ):
                hint = "this systemd version does not support a requested property"
            raise DBusCallFailed(
                f"systemd refused to start {name}: {e.detail}",
                dbus_name=e.dbus_name,
                detail=e.detail,
                hint=hint,
            ) from e
        log.info("started transient unit %s (job %s)", name, job)
        return _str(job)

    def start_unit(self, name: str) -> str:
        """Start an installed unit (e.g. a template instance; job mode ``replace``) and
        return its start job's path."""
        validate_unit_name(name)
        added = self._watch(name)
        try:
            (job,) = self._manager_call("StartUnit", "ss", (name, "replace"))
        except DBusCallFailed as e:
            if added:
                self._unwatch(name)
            raise DBusCallFailed(
                f"systemd refused to start {name}: {e.detail}",
                dbus_name=e.dbus_name,
                detail=e.detail,
            ) from e
        return _str(job)

    def wait_started(self, job: str, timeout: float = 90.0) -> UnitState | None:
        """Wait for ``JobRemoved`` of ``job``; if its result is ``done``, return the unit's
        state read then (None if it is already collected), else raise.

        Only jobs of units started through this object are tracked. The state is the one
        read for the outcome: a caller needs no second read (three calls to PID 1, which
        answers them slowly while many runs start)."""
        deadline = time.monotonic() + timeout
        while job not in self._job_results:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SystemdError(
                    f"start job {job} did not finish within {timeout:g}s",
                    hint="inspect it with systemctl list-jobs",
                )
            self._pump(remaining)
        unit, result = self._job_results.pop(job)
        state = self.unit_state(unit)
        if result != "done":
            detail = ""
            if state is not None:
                detail = f" (unit result {state.result}, exit status {state.exec_main_status})"
            raise SystemdError(
                f"start job of {unit} ended with '{result}'{detail}",
                hint=f"see journalctl -u {unit}",
            )
        if state is not None and state.control_group:
            self._last_cgroup[unit] = state.control_group
        return state

    # -- reading -----------------------------------------------------------------------

    def unit_state(self, name: str) -> UnitState | None:
        """The unit's current state, or None if systemd has no such unit loaded.

        Uses ``GetUnit``, so asking about a collected or unknown unit never loads a
        ``not-found`` stub whose defaults would look like a clean exit.
        """
        validate_unit_name(name)
        path = self._unit_path(name)
        if path is None:
            return None
        try:
            unit = self._get_all(path, UNIT_IF)
            typed = self._get_all(path, _TYPE_INTERFACES[name.rsplit(".", 1)[1]])
        except DBusCallFailed as e:
            raise SystemdError(f"reading {name} failed: {e.detail}") from e
        if unit.get("LoadState") == "not-found":
            return None  # collected between GetUnit and GetAll
        job = unit.get("Job", (0, "/"))
        invocation = unit.get("InvocationID", b"")
        try:
            return UnitState.model_validate(
                {
                    "name": name,
                    "load_state": unit.get("LoadState"),
                    "active_state": unit.get("ActiveState"),
                    "sub_state": unit.get("SubState"),
                    "job_id": job[0] if isinstance(job, tuple) and job else job,
                    "result": typed.get("Result", ""),
                    "exec_main_code": typed.get("ExecMainCode", 0),
                    "exec_main_status": typed.get("ExecMainStatus", 0),
                    "control_group": typed.get("ControlGroup", ""),
                    "invocation_id": invocation.hex() if isinstance(invocation, bytes) else "",
                    "main_pid": typed.get("MainPID", 0),
                }
            )
        except ValidationError as e:
            raise SystemdError(f"systemd sent unexpected properties for {name}: {e}") from e

    def wait_inactive(self, name: str, timeout: float) -> UnitState:
        """Wait until ``name`` is inactive or failed with no job, and return that state.

        ``control_group`` in the result is the last non-empty value seen (systemd clears it
        once the unit stops), so it can be handed to :func:`cgroup_is_empty`. Raises
        NotFound if the unit is not loaded (collected before its result could be read) and
        SystemdError on timeout.
        """
        added = self._watch(name)
        try:
            deadline = time.monotonic() + timeout
            while True:
                state = self.unit_state(name)
                if state is None:
                    raise NotFound(
                        f"unit {name} is not loaded, so its result is gone",
                        hint=f"read it from the journal: journalctl -u {name}",
                    )
                if state.control_group:
                    self._last_cgroup[name] = state.control_group
                if state.finished:
                    cg = state.control_group or self._last_cgroup.get(name, "")
                    return state.model_copy(update={"control_group": cg})
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SystemdError(
                        f"{name} is still {state.active_state} after {timeout:g}s",
                        hint=f"stop it with systemctl stop {name}",
                    )
                self._pump(min(remaining, RECHECK_INTERVAL))
        finally:
            if added:
                self._unwatch(name)
                self._last_cgroup.pop(name, None)

    # -- stopping and releasing ----------------------------------------------------------

    def stop_unit(self, name: str) -> None:
        """Queue a stop job (mode ``replace``); an unknown unit is already stopped."""
        validate_unit_name(name)
        try:
            self._manager_call("StopUnit", "ss", (name, "replace"))
        except DBusCallFailed as e:
            if e.dbus_name == NO_SUCH_UNIT:
                return
            raise SystemdError(f"stopping {name} failed: {e.detail}") from e

    def unref(self, name: str) -> None:
        """Drop this connection's pin on ``name`` so systemd may collect it; stop watching it."""
        validate_unit_name(name)
        self._unwatch(name)
        self._last_cgroup.pop(name, None)
        path = self._unit_path(name)
        if path is None:
            return
        try:
            self._call(DBusAddress(path, bus_name=SD_BUS_NAME, interface=UNIT_IF), "Unref")
        except DBusCallFailed as e:
            if e.dbus_name == NO_SUCH_UNIT:
                return
            raise SystemdError(f"Unref({name}) failed: {e.detail}") from e

    def reset_failed(self, name: str) -> None:
        """``ResetFailedUnit``; a unit that is not loaded has nothing to reset."""
        validate_unit_name(name)
        try:
            self._manager_call("ResetFailedUnit", "s", (name,))
        except DBusCallFailed as e:
            if e.dbus_name == NO_SUCH_UNIT:
                return
            raise SystemdError(f"ResetFailedUnit({name}) failed: {e.detail}") from e


def wait_unit_gone(
    sd: Systemd,
    unit: str,
    timeout: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    pause: Callable[[float], None] = time.sleep,
) -> bool:
    """Whether ``unit`` is inactive (or gone) within ``timeout`` seconds. Asked at once,
    then after 10 ms, doubling to 200 ms: a worker ends milliseconds after it delivered
    the finish, and every boundary waits for this (as ``cairn doctor`` does for a
    coordinator that ended its run and is still exiting)."""
    deadline = clock() + timeout
    step = 0.01
    while True:
        state = sd.unit_state(unit)
        if state is None or state.active_state in ("inactive", "failed"):
            return True
        if clock() >= deadline:
            return False
        pause(min(step, max(0.0, deadline - clock())))
        step = min(step * 2, 0.2)
