"""The package installs and its units come up under a real systemd; machines leave no trace."""

from __future__ import annotations

import configparser
import importlib.util
import json
import re
import subprocess
from pathlib import Path

from machine import Machine

from cairn.proc import run

UNIT_DIR = "/usr/lib/systemd/system"
SHIPPED_UNITS = (
    "cairn.socket",
    "cairn.service",
    "cairn-broker.socket",
    "cairn-broker.service",
    "cairn-coordinator@.service",
    "cairn-retention.service",
    "cairn-retention.timer",
)
RUN_ID = "flow_" + "0" * 32
REPO = Path(__file__).resolve().parents[2]

# Import the installed broker the way its unit starts it (python3 -I) and print every
# cairn module that loaded, with the length of its source file.
BROKER_IMPORTS = """
import json, sys
import cairn.broker.__main__, cairn.broker.verbs
loaded = {n: m.__file__ for n, m in sys.modules.items() if n == "cairn" or n.startswith("cairn.")}
print(json.dumps({n: len(open(f).read().splitlines()) for n, f in loaded.items()}))
"""


def _out(result: subprocess.CompletedProcess[bytes]) -> str:
    return result.stdout.decode().strip()


def test_sockets_listen_with_their_owners_and_modes(machine: Machine) -> None:
    active = machine.exec(["systemctl", "is-active", "cairn.socket", "cairn-broker.socket"])
    assert _out(active).split() == ["active", "active"]
    stat = machine.exec(
        ["stat", "-c", "%F %a %U:%G", "/run/cairn/cairnd.sock", "/run/cairn/broker.sock"]
    )
    assert _out(stat).splitlines() == ["socket 666 root:root", "socket 660 root:cairn"]


def test_shipped_units_pass_systemd_analyze_verify(machine: Machine) -> None:
    for unit in SHIPPED_UNITS:
        assert machine.exec(["test", "-f", f"{UNIT_DIR}/{unit}"], check=False).returncode == 0
    # A template is verified through an instance of it.
    names = [u for u in SHIPPED_UNITS if not u.endswith("@.service")]
    names.append(f"cairn-coordinator@{RUN_ID}.service")
    # --man=no: the machine has no man-db; the pages are checked in tests/unit/test_man_pages.py
    result = machine.exec(["systemd-analyze", "verify", "--man=no", *names], check=False)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stderr.decode().strip() == ""


def test_users_groups_and_directories(machine: Machine) -> None:
    passwd = _out(machine.exec(["getent", "passwd", "cairn"])).split(":")
    assert passwd[5] == "/var/lib/cairn"
    assert passwd[6].endswith("nologin")
    assert _out(machine.exec(["getent", "group", "cairn-admin"])).startswith("cairn-admin:")
    journal_members = _out(machine.exec(["getent", "group", "systemd-journal"])).split(":")[3]
    assert "cairn" in journal_members.split(",")
    stat = machine.exec(
        [
            "stat",
            "-c",
            "%n %a %U:%G",
            "/var/lib/cairn",
            "/var/lib/cairn/journal",
            "/var/lib/cairn/runs",
            "/var/lib/cairn/broker",
            "/run/cairn",
            "/run/cairn/agents",
            "/run/cairn/egress",
            "/run/cairn/egress-skipped",
            "/etc/cairn",
        ]
    )
    assert _out(stat).splitlines() == [
        "/var/lib/cairn 755 root:root",
        "/var/lib/cairn/journal 750 cairn:cairn",
        "/var/lib/cairn/runs 750 cairn:cairn",
        "/var/lib/cairn/broker 750 root:cairn",
        "/run/cairn 755 root:cairn",
        "/run/cairn/agents 700 cairn:cairn",
        "/run/cairn/egress 711 root:root",
        "/run/cairn/egress-skipped 700 root:root",
        "/etc/cairn 755 root:root",
    ]


def test_users_can_use_the_package_but_not_the_broker(machine: Machine) -> None:
    assert machine.exec(["test", "-x", "/usr/bin/cairn"], check=False).returncode == 0
    imported = machine.exec(
        ["python3", "-I", "-c", "import cairn, cairn.daemon, cairn.broker; print(cairn.__file__)"],
        user="alice",
    )
    assert _out(imported) == "/usr/lib/python3/dist-packages/cairn/__init__.py"
    connect = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n"
        "    s.connect(sys.argv[1])\n"
        "except PermissionError:\n"
        "    print('denied')\n"
        "else:\n"
        "    print('connected')\n"
    )
    broker = machine.exec(["python3", "-c", connect, "/run/cairn/broker.sock"], user="alice")
    assert _out(broker) == "denied"


def _documented_closure() -> set[str]:
    """The modules docs/architecture.md says root loads (the unit tier keeps that table
    equal to the source tree's closure)."""
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text.split("### What the root broker loads", 1)[1].split("\n### ", 1)[0]
    files = re.findall(r"^\| `([^`]+)` \|", section, re.MULTILINE)
    return {f.removesuffix(".py").removesuffix("/__init__").replace("/", ".") for f in files}


def test_the_installed_broker_loads_only_what_was_measured(machine: Machine) -> None:
    """What root runs from the package is what the unit tier measured from the tree: none of
    the modules the broker's import contract forbids, and no library module besides those
    docs/architecture.md lists (whose branch coverage ./dev test gates)."""
    loaded = json.loads(_out(machine.exec(["/usr/bin/python3", "-I", "-c", BROKER_IMPORTS])))
    assert "cairn.broker.verbs" in loaded and "cairn.journal.reader" in loaded
    contract = configparser.ConfigParser()
    contract.read(REPO / ".importlinter")
    forbidden = contract["importlinter:contract:broker"]["forbidden_modules"].split()
    assert not [m for m in loaded for f in forbidden if m == f or m.startswith(f + ".")]
    library = {m for m in loaded if m != "cairn.broker" and not m.startswith("cairn.broker.")}
    assert library and library <= _documented_closure(), library - _documented_closure()


# Import one process's entry module as its unit starts it and print every module loaded;
# argv[1] is the capsule's lib/ for the agent worker (started from it with -B), else "".
RUN_PROCESS_IMPORTS = """
import importlib, json, sys
if sys.argv[1]:
    sys.path.insert(0, sys.argv[1])
importlib.import_module(sys.argv[2])
print(json.dumps({n: getattr(m, "__file__", None) for n, m in sys.modules.items()}))
"""
CAPSULE_LIB = "/usr/lib/cairn/releases/current/lib"


def _process_startup_rules() -> dict[str, frozenset[str]]:
    """``NOT_AT_START`` of the unit tier, which checks the source tree."""
    path = REPO / "tests" / "unit" / "test_process_startup.py"
    spec = importlib.util.spec_from_file_location("unit_process_startup", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rules: dict[str, frozenset[str]] = module.NOT_AT_START
    return rules


def test_each_process_of_a_run_loads_from_the_package_only_what_its_path_uses(
    machine: Machine,
) -> None:
    """The unit tier's start rules hold for the installed package and the distribution's
    own pydantic: each process a run starts, imported as its unit starts it, loads none of
    the modules its normal path does not use; the agent worker from the sealed capsule
    (``python3 -I -B``), whose lazily imported profiles are in the capsule too."""
    rules = _process_startup_rules()
    assert len(rules) >= 7
    for module, absent in sorted(rules.items()):
        in_capsule = module.startswith("cairn.worker.__main__")
        python = ["/usr/bin/python3", "-I", *(["-B"] if in_capsule else [])]
        lib = CAPSULE_LIB if in_capsule else ""
        loaded = json.loads(_out(machine.exec([*python, "-c", RUN_PROCESS_IMPORTS, lib, module])))
        assert module in loaded, module
        # the distribution's pydantic loads where the path needs it, and only there
        assert ("pydantic" in loaded) is ("pydantic" not in absent), module
        found = sorted(n for n in absent for m in loaded if m == n or m.startswith(f"{n}."))
        assert found == [], module
        if in_capsule:
            assert str(loaded["cairn"]).startswith(CAPSULE_LIB + "/")
    # What the llm and command profiles import when they run is in the capsule.
    for lazy in ("cairn.worker.llm", "cairn.worker.shim"):
        loaded = json.loads(_out(machine.exec(
            ["/usr/bin/python3", "-I", "-B", "-c", RUN_PROCESS_IMPORTS, CAPSULE_LIB, lazy]
        )))
        assert str(loaded[lazy]).startswith(CAPSULE_LIB + "/cairn/worker/"), lazy


def test_bound_pool_is_btrfs_inside(machine: Machine) -> None:
    assert _out(machine.exec(["stat", "-f", "-c", "%T", "/var/lib/cairn/pool"])) == "btrfs"
    machine.exec(["btrfs", "subvolume", "create", "/var/lib/cairn/pool/probe"])
    machine.exec(
        [
            "btrfs",
            "subvolume",
            "snapshot",
            "-r",
            "/var/lib/cairn/pool/probe",
            "/var/lib/cairn/pool/probe.ro",
        ]
    )
    listed = _out(machine.exec(["btrfs", "subvolume", "list", "/var/lib/cairn/pool"]))
    assert listed.count("path probe") == 2


def _loop_devices_backed_by(image_name: str) -> list[str]:
    listed = run(["losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE"]).stdout
    return [line for line in listed.decode().splitlines() if image_name in line]


def test_teardown_leaves_no_mounts_loops_or_files(deb: Path) -> None:
    machine = Machine(deb, with_pool=True, bind_loop_devices=True)
    try:
        machine.start()
        host_loops = machine.attached_loop_devices()
        assert len(host_loops) == 1
        # A machine-made loop pool, as `cairn storage init --loop` makes one, left mounted.
        machine.exec(["truncate", "-s", "256M", "/var/lib/cairn/inner-pool.img"])
        machine.exec(["mkfs.btrfs", "-q", "/var/lib/cairn/inner-pool.img"])
        machine.exec(["mkdir", "/mnt/inner"])
        machine.exec(["mount", "-o", "loop", "/var/lib/cairn/inner-pool.img", "/mnt/inner"])
        assert _out(machine.exec(["stat", "-f", "-c", "%T", "/mnt/inner"])) == "btrfs"
        assert _loop_devices_backed_by("inner-pool.img")
        nspawn = machine._nspawn
        assert nspawn is not None
    finally:
        machine.close()
    assert nspawn.poll() is not None
    attached = run(["losetup", "--list", "--noheadings", "--output", "NAME"]).stdout.decode()
    for dev in host_loops:
        assert dev not in attached.split()
    assert _loop_devices_backed_by("inner-pool.img") == []
    assert _loop_devices_backed_by(str(machine.tmp)) == []
    mounts = Path("/proc/mounts").read_text()
    assert str(machine.tmp) not in mounts
    assert not machine.tmp.exists()


# Each probe runs as the real unit (same user, sandbox and capabilities, only ExecStart
# replaced) and does what the process will need to do there, plus one thing it must not.
DAEMON_PROBE = """
import os, sqlite3, subprocess
db = sqlite3.connect("/var/lib/cairn/journal/journal.db")
db.execute("PRAGMA journal_mode=WAL")
db.execute("CREATE TABLE t (v INTEGER)")
db.execute("INSERT INTO t VALUES (42)")
db.commit()
os.makedirs("/var/lib/cairn/runs/probe-daemon")
out = subprocess.run(["journalctl", "--no-pager", "-n", "1", "-u", "cairn.socket"],
                     capture_output=True, text=True, check=True)
assert "No journal files" not in out.stdout + out.stderr, out
for forbidden in ("/var/lib/cairn/pool/x", "/var/lib/cairn/broker/x", "/etc/cairn/x"):
    try:
        open(forbidden, "w")
    except OSError:
        pass
    else:
        raise SystemExit(f"could write {forbidden}")
assert not os.path.exists("/home/alice"), "home directories are visible"
print("daemon-probe ok")
"""

BROKER_PROBE = """
import os, sqlite3, time, btrfsutil
from jeepney import DBusAddress, new_method_call, MessageType
from jeepney.io.blocking import open_dbus_connection
pool = "/var/lib/cairn/pool"
btrfsutil.create_subvolume(f"{pool}/w")
os.chown(f"{pool}/w", 1001, 1001)
btrfsutil.create_snapshot(f"{pool}/w", f"{pool}/s", read_only=True)
assert btrfsutil.get_subvolume_read_only(f"{pool}/s")
btrfsutil.delete_subvolume(f"{pool}/s")
btrfsutil.delete_subvolume(f"{pool}/w")
db = sqlite3.connect("file:/var/lib/cairn/journal/journal.db?mode=ro", uri=True)
assert db.execute("SELECT v FROM t").fetchone() == (42,)
with open("/var/lib/cairn/broker/receipts.probe", "w") as f:
    f.write("ok")
assert os.listdir("/home/alice/project") == ["file"]
try:
    open("/home/alice/project/new", "w")
except OSError:
    pass
else:
    raise SystemExit("could write into a project")
conn = open_dbus_connection(bus="SYSTEM")
manager = DBusAddress("/org/freedesktop/systemd1", bus_name="org.freedesktop.systemd1",
                      interface="org.freedesktop.systemd1.Manager")
props = [
    ("ExecStart", ("a(sasb)", [("/usr/bin/touch", ["/usr/bin/touch", "/home/alice/ran"], False)])),
    ("User", ("s", "alice")),
    ("Type", ("s", "oneshot")),
]
reply = conn.send_and_get_reply(new_method_call(
    manager, "StartTransientUnit", "ssa(sv)a(sa(sv))", ("cairn-probe.service", "fail", props, [])))
assert reply.header.message_type == MessageType.method_return, reply.body
print("broker-probe ok")
"""

COORDINATOR_PROBE = """
import os, socket, sqlite3
from jeepney import DBusAddress, new_method_call, MessageType
from jeepney.io.blocking import open_dbus_connection
db = sqlite3.connect("/var/lib/cairn/journal/journal.db")
db.execute("INSERT INTO t VALUES (43)")
db.commit()
os.makedirs("/var/lib/cairn/runs/probe-coordinator")
os.makedirs("/run/cairn/agents/probe")
s = socket.socket(socket.AF_UNIX)
s.bind("/run/cairn/agents/probe/agent.sock")
assert os.stat("/run/cairn/agents/probe/agent.sock").st_mode & 0o777 == 0o755
conn = open_dbus_connection(bus="SYSTEM")
unit = DBusAddress("/org/freedesktop/systemd1/unit/cairn_2esocket",
                   bus_name="org.freedesktop.systemd1",
                   interface="org.freedesktop.DBus.Properties")
reply = conn.send_and_get_reply(new_method_call(
    unit, "Get", "ss", ("org.freedesktop.systemd1.Unit", "ActiveState")))
assert reply.header.message_type == MessageType.method_return, reply.body
assert reply.body[0] == ("s", "active"), reply.body
assert os.getuid() != 0
try:
    open("/var/lib/cairn/pool/x", "w")
except OSError:
    pass
else:
    raise SystemExit("could write the pool")
print("coordinator-probe ok")
"""


def _run_probe(machine: Machine, unit: str, name: str, script: str) -> None:
    path = f"/usr/local/lib/cairn-probe/{name}.py"
    machine.exec(["install", "-D", "-m0644", "/dev/stdin", path], input=script.encode())
    dropin = f"/run/systemd/system/{unit}.d/probe.conf"
    conf = (
        f"[Service]\nType=oneshot\nRestart=no\nExecStart=\nExecStart=/usr/bin/python3 -I {path}\n"
    )
    machine.exec(["install", "-D", "-m0644", "/dev/stdin", dropin], input=conf.encode())
    machine.exec(["systemctl", "daemon-reload"])
    # cairnd already runs from boot (its reconciler): stop it so the probe is what starts
    machine.exec(["systemctl", "stop", unit], check=False, timeout=60)
    started = machine.exec(["systemctl", "start", unit], check=False, timeout=120)
    result = _out(machine.exec(["systemctl", "show", "--property=Result", "--value", unit]))
    log = machine.journal(unit=unit)
    assert started.returncode == 0 and result == "success", log
    assert f"{name}-probe ok" in log


def test_unit_sandboxes_allow_what_each_process_needs(machine: Machine) -> None:
    machine.exec(["install", "-d", "-o", "alice", "-g", "alice", "/home/alice/project"])
    machine.exec(["touch", "/home/alice/project/file"])

    _run_probe(machine, "cairn.service", "daemon", DAEMON_PROBE)
    _run_probe(machine, "cairn-broker.service", "broker", BROKER_PROBE)
    _run_probe(machine, f"cairn-coordinator@{RUN_ID}.service", "coordinator", COORDINATOR_PROBE)

    # The broker's transient unit ran as alice, outside the broker's read-only /home.
    wait_for_file = "for i in $(seq 100); do [ -e /home/alice/ran ] && break; sleep 0.1; done"
    machine.exec(["sh", "-c", wait_for_file])
    owner = machine.exec(["stat", "-c", "%U", "/home/alice/ran"], check=False)
    assert _out(owner) == "alice", machine.journal(unit="cairn-probe.service")
    receipts = machine.exec(["stat", "-c", "%a %U:%G", "/var/lib/cairn/broker/receipts.probe"])
    assert _out(receipts) == "640 root:root"
    subvolumes = _out(machine.exec(["btrfs", "subvolume", "list", "/var/lib/cairn/pool"]))
    assert subvolumes == ""


def test_user_manager_runs_for_a_lingering_user(machine: Machine) -> None:
    machine.enable_user_manager("alice")
    state = machine.exec(
        ["systemctl", "--user", "is-system-running", "--wait"], user="alice", check=False
    )
    assert _out(state) in ("running", "degraded")
    env = _out(machine.exec(["sh", "-c", "echo $XDG_RUNTIME_DIR"], user="alice"))
    assert env == "/run/user/1001"
