"""What a short ``cairn`` command costs its own process: user+system CPU of one whole
``cairn`` start to exit, per command, against a stand-in cairnd on a socket under a
temporary ``CAIRN_ROOT`` (it answers at once, and attests the launch as cairnd would show
it the description it froze). Under load every launch waits its turn for a core, so this
CPU is what a burst of launches costs (tests/bench/admission_figures.py times the burst).

    python3 tests/bench/cli_figures.py [SAMPLES]

Runs each command SAMPLES times (default 15) with this interpreter and prints one JSON
line: the median and the minimum CPU seconds of each.
"""

from __future__ import annotations

import array
import json
import os
import pwd
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

RUN = "flow_" + "c1" * 16

COMMANDS: dict[str, list[str]] = {
    "cairn --version": ["--version"],
    "cairn --help": ["--help"],
    "cairn list": ["list"],
    "cairn show RUN": ["show", RUN],
    "cairn launch (queued)": ["launch", "builtin:implement", "--args", '{"objective": "x"}'],
}


def _description(project: str) -> bytes:
    from cairn.protocol.launch import LaunchDescription, ProjectSpec

    account = pwd.getpwuid(os.getuid())
    desc = LaunchDescription(
        run_id=RUN, owner_uid=account.pw_uid, owner_gid=account.pw_gid,
        owner_name=account.pw_name, definition="builtin:implement", source="print(1)",
        source_filename="implement.py", review_hash="sha256:" + "a" * 64, review={},
        args={"objective": "x"}, profiles={}, cairn_version="bench", created_at=1.0,
        project=ProjectSpec(root=project, owner_uid=account.pw_uid, on_pool_fs=False),
    )
    return desc.model_dump_json().encode() + b"\n"


def _answer(conn: socket.socket, project: str) -> None:
    """One request: read its line (and the fds passed with it), answer as cairnd would."""
    with conn:
        fds = array.array("i")
        line = b""
        while not line.endswith(b"\n"):
            data, ancdata, _flags, _addr = conn.recvmsg(1 << 16, socket.CMSG_SPACE(16))
            if not data:
                return
            line += data
            for _level, _type, payload in ancdata:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        op = json.loads(line)["op"]
        result: Any = []
        if op == "launch":
            with socket.socket(fileno=fds[-1]) as channel:
                channel.sendall(_description(project))
                channel.recv(1 << 16)  # the attestation line
            result = {"run_id": RUN, "state": "queued", "position": 3}
        elif op == "show":  # every key the CLI's ShowReply requires, as for a queued run
            result = {"run": {"run_id": RUN, "state": "queued", "position": 3,
                              "definition": "builtin:implement", "project": project},
                      "operations": [], "units": [],
                      "storage": {"deleted": False, "deleted_at": None, "subvolumes": 0},
                      "settlement": None, "settlement_summary": None, "replayed_from": None,
                      "worklists": [], "experiments": [], "model": None, "question": None,
                      "divergence": None, "integrity": {}, "latest_event": None,
                      "events_shown": "", "progress": {}}
        for fd in fds[:-1] if op == "launch" else fds:
            os.close(fd)
        conn.sendall(json.dumps({"ok": True, "result": result}).encode() + b"\n")


def _serve(sock: socket.socket, project: str) -> None:
    while True:
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        _answer(conn, project)


def cpu_of(argv: list[str], env: dict[str, str], cwd: str) -> float:
    """User+system CPU seconds of one ``cairn ARGV`` (its exit status must be 0)."""
    proc = subprocess.Popen([sys.executable, "-m", "cairn.cli", *argv], env=env, cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _pid, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    proc.stderr.close()
    if proc.returncode != 0:
        raise SystemExit(f"cairn {' '.join(argv)} failed ({proc.returncode}): {err}")
    return usage.ru_utime + usage.ru_stime


def figures(samples: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="cairn-cli-bench-") as tmp:
        root = Path(tmp)
        project = root / "project"
        project.mkdir()
        (root / "run" / "cairn").mkdir(parents=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(root / "run" / "cairn" / "cairnd.sock"))
        sock.listen(16)
        threading.Thread(target=_serve, args=(sock, str(project)), daemon=True).start()
        env = {**os.environ, "CAIRN_ROOT": str(root), "COLUMNS": "100"}
        cpu: dict[str, list[float]] = {name: [] for name in COMMANDS}
        for _ in range(samples):  # interleaved: a slow moment spreads over every command
            for name, argv in COMMANDS.items():
                cpu[name].append(cpu_of(argv, env, str(project)))
        sock.close()
    return {
        "python": sys.version.split()[0],
        "samples": samples,
        "cpu_median_s": {n: round(statistics.median(v), 3) for n, v in cpu.items()},
        "cpu_min_s": {n: round(min(v), 3) for n, v in cpu.items()},
    }


if __name__ == "__main__":
    print(json.dumps(figures(int(sys.argv[1]) if len(sys.argv) > 1 else 15), indent=1))
