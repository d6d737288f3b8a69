"""Agent unit start → worker ready, inside a booted test machine (systemd 257).

Cairn's side is :meth:`cairn.systemd.Systemd.start_transient_service` with the full agent
property set of :func:`cairn.unitprops.agent_unit_properties` (run owner, sandbox, bind
mounts, limits, private network), timed until the process inside connects to the bound
``/run/cairn/agent/agent.sock`` and says hello, which is the moment the real worker asks for its
instruction. The comparisons are ``systemd-run --wait true`` from the same machine and
the same agent unit without its isolation from other processes (``PrivatePIDs=``, private
``/run`` and ``/dev/shm``), started alternately with the isolated one. The
broker's QUIESCE proof (``require_quiesced``: unit state plus cgroup emptiness) is timed
on each stopped unit too, as the part of the boundary that needs systemd.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from measure import Cell

from cairn import proc

log = logging.getLogger(__name__)

INSIDE = r'''
import json, os, socket, subprocess, sys, threading, time
from cairn.broker.units import require_quiesced
from cairn.systemd import Systemd
from cairn.unitprops import AGENT_SOCKET, AgentUnitSpec, agent_unit_name, agent_unit_properties

repeat = int(sys.argv[1])
run_id = "flow_" + "be" * 16
hello = ("import socket; s = socket.socket(socket.AF_UNIX); "
         "s.connect('/run/cairn/agent/agent.sock'); s.sendall(b'hello')")
base = "/var/tmp/cairn-bench"
out = {"ready": [], "job": [], "quiesce": [], "bare": [], "systemd_run": [],
       "ready_shared": []}
# Where the start job's time goes: the same unit without one group of its properties at a
# time (started in turn with the full unit), to hello.
WITHOUT = {
    "private network namespace": {"PrivateNetwork"},
    "system call filter": {"SystemCallFilter", "SystemCallArchitectures",
                           "SystemCallErrorNumber"},
    "mount sandbox (ProtectSystem, ProtectHome, masks, inaccessible paths)":
        {"ProtectSystem", "ProtectHome", "TemporaryFileSystem", "InaccessiblePaths"},
    "PrivateDevices": {"PrivateDevices"},
    "PrivateTmp, PrivateIPC": {"PrivateTmp", "PrivateIPC"},
    "kernel and /proc protections": {
        "ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs",
        "ProtectControlGroups", "ProtectClock", "ProtectHostname", "ProtectProc"},
    "ExecStopPost (service result record)": {"ExecStopPostEx"},
    "resource limits and accounting": {
        "RuntimeMaxUSec", "MemoryAccounting", "MemoryMax", "MemorySwapMax",
        "TasksAccounting", "TasksMax", "CPUAccounting", "CPUQuotaPerSecUSec",
        "IOAccounting", "IOWeight"},
}
out["without"] = {name: [] for name in WITHOUT}


def without_isolation(props):
    """The same unit without what separates it from the owner's other processes."""
    shared = []
    for name, sig, value in props:
        if name == "PrivatePIDs":
            continue
        if name == "TemporaryFileSystem":
            value = [(path, opts) for path, opts in value if path not in ("/run", "/dev/shm")]
        shared.append((name, sig, value))
    return shared


variants = [None, "shared", *WITHOUT]
for i in range(len(variants) * repeat):
    variant = variants[i % len(variants)]
    op = f"root-{i + 1}"
    d = f"{base}/{op}"
    for sub in ("workspace", "evidence", "outputs", "state", "channel"):
        os.makedirs(f"{d}/{sub}", exist_ok=True)
        if sub not in ("evidence", "channel"):
            os.chown(f"{d}/{sub}", 1001, 1001)
    os.chmod(base, 0o755)
    sock_path = f"{d}/channel/agent.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(sock_path)
    os.chmod(sock_path, 0o666)
    server.listen(1)
    server.settimeout(60)
    said = {}

    def accept():
        conn, _ = server.accept()
        said["hello"] = conn.recv(16)
        said["at"] = time.perf_counter()
        conn.close()

    spec = AgentUnitSpec(
        run_id=run_id, op_id=op, uid=1001, gid=1001,
        exec_argv=["/usr/bin/python3", "-I", "-S", "-c", hello],
        workspace=f"{d}/workspace", evidence_dir=f"{d}/evidence", outputs=f"{d}/outputs",
        state=f"{d}/state", channel_dir=f"{d}/channel", memory_max=2 << 30, tasks_max=512,
        cpu_quota_percent=100, runtime_max_sec=600, network="none",
        log_fields={"CAIRN_RUN": run_id, "CAIRN_OP": op},
    )
    name = agent_unit_name(run_id, op, 1)
    props = agent_unit_properties(spec)
    if variant == "shared":
        props = without_isolation(props)
    elif variant is not None:
        props = [p for p in props if p[0] not in WITHOUT[variant]]
    listener = threading.Thread(target=accept)
    listener.start()
    with Systemd() as sd:
        t0 = time.perf_counter()
        job = sd.start_transient_service(name, props)
        sd.wait_started(job)
        t1 = time.perf_counter()
        listener.join(60)
        final = sd.wait_inactive(name, 60)
        t2 = time.perf_counter()
        require_quiesced(name, final.control_group)
        t3 = time.perf_counter()
        sd.unref(name)
    server.close()
    if said.get("hello") != b"hello":
        raise SystemExit(f"{name} never said hello ({final.result})")
    if variant == "shared":
        out["ready_shared"].append(said["at"] - t0)
        continue
    if variant is not None:
        out["without"][variant].append(said["at"] - t0)
        continue
    out["job"].append(t1 - t0)
    out["ready"].append(said["at"] - t0)
    out["quiesce"].append(t3 - t2)
bare = [("Type", "s", "exec"),
        ("ExecStart", "a(sasb)", [("/bin/true", ["/bin/true"], False)]),
        ("CollectMode", "s", "inactive-or-failed")]
for i in range(repeat):
    name = f"cairn-bench-bare-{i}.service"
    with Systemd() as sd:
        t0 = time.perf_counter()
        sd.wait_started(sd.start_transient_service(name, bare))
        sd.wait_inactive(name, 60)
        out["bare"].append(time.perf_counter() - t0)
        sd.unref(name)
for i in range(repeat):
    t0 = time.perf_counter()
    subprocess.run(["systemd-run", "--wait", "--quiet", "true"], check=True)
    out["systemd_run"].append(time.perf_counter() - t0)
print(json.dumps(out))
'''


def package(repo: Path) -> Path:
    """``$CAIRN_DEB`` or a fresh build of this tree."""
    prebuilt = os.environ.get("CAIRN_DEB")
    if prebuilt:
        return Path(prebuilt)
    built = proc.run([repo / "packaging" / "build-deb.sh"], timeout=900)
    return Path(built.stdout.decode().strip().splitlines()[-1])


def unit_figures(repo: Path, *, repeat: int, cells: list[Cell]) -> None:
    sys.path.insert(0, os.fspath(repo / "tests" / "system"))
    from machine import Machine  # the system tier's harness

    deb = package(repo)
    with Machine(deb) as machine:
        result = machine.exec(["python3", "-I", "-c", INSIDE, str(repeat)],
                              timeout=120 + 60 * repeat, check=False)
        if result.returncode != 0:
            raise AssertionError("unit benchmark failed in the machine:\n"
                                 + result.stderr.decode(errors="replace")[-3000:])
        data = json.loads(result.stdout.decode().strip().splitlines()[-1])
    for key, method, cairn in (
        ("ready", "transient agent unit over D-Bus, to hello", True),
        ("job", "of which: start job done (exec)", True),
        ("ready_shared", "same, without PrivatePIDs and private /run, /dev/shm", True),
        ("bare", "same client, bare unit running true, to exit", True),
        ("systemd_run", "systemd-run --wait true", False),
        ("quiesce", "QUIESCE proof (unit state + cgroup empty)", True),
    ):
        cells.append(Cell(figure="unit" if key != "quiesce" else "quiesce", size=None,
                          variant="", method=method, cairn=cairn, samples=data[key]))
        log.info("%s: median %.4fs", method, cells[-1].median)
    for name, samples in data["without"].items():
        cells.append(Cell(figure="unit", size=None, variant="", cairn=True,
                          method=f"same, without {name}", samples=samples))
