"""The control worker's OS sandbox (ARCHITECTURE §4.2): as if review had a hole, hostile
code runs in the real worker and every way out must fail.

The test runs as root on the development host, so file permissions do not stop anything:
a refused open of a file the test itself created (mode 0600, owned by the test) is
Landlock's doing, a refused socket or exec is the seccomp filter's.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cairn.proc import make_env
from cairn.protocol.control import CallRequest, CallResult, StartWorkflow
from cairn.workflow import runtime, sandbox

ARCH = os.uname().machine

# --- the filter as a table: interpret the compiled program ------------------------


def run_bpf(program: list[sandbox.Insn], nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    """A classic-BPF interpreter for the four instructions the filter uses."""
    data = struct.pack("<IIQ6Q", nr, arch, 0, *(args + (0,) * (6 - len(args))))
    pc, acc = 0, 0
    for _ in range(len(program)):
        code, jt, jf, k = program[pc]
        if code == sandbox.LD_ABS:
            acc = struct.unpack_from("<I", data, k)[0]
            pc += 1
        elif code == sandbox.RET:
            return k
        else:
            taken = {
                sandbox.JEQ: acc == k,
                sandbox.JGE: acc >= k,
                sandbox.JSET: bool(acc & k),
            }[code]
            pc += 1 + (jt if taken else jf)
    raise AssertionError("the program ran off its end")


PID = 4242
OTHER = 1


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_every_row_of_the_filter_does_what_it_says(arch: str) -> None:
    program = sandbox.compile_filter(arch, PID)
    audit = sandbox.AUDIT_ARCH[arch]
    column = 1 if arch == "x86_64" else 2
    assert len(program) < 4096 and all(jt < 256 and jf < 256 for _c, jt, jf, _k in program)
    allow, eperm = sandbox.RET_ALLOW, sandbox.EPERM
    listed = set()
    for row in sandbox.FILTER:
        nr, rule = row[column], row[3]
        if nr is None:
            continue
        assert isinstance(nr, int)
        listed.add(nr)

        def verdict(*args: int, nr: int = nr) -> int:
            return run_bpf(program, nr, audit, args)

        if rule == sandbox.DENY:
            assert verdict() == eperm, row
        elif rule == sandbox.ENOSYS:
            assert verdict() == sandbox.RET_ERRNO | 38, row
        elif rule == sandbox.SELF:
            assert (verdict(PID), verdict(OTHER), verdict(0)) == (allow, eperm, eperm), row
        elif rule == sandbox.SELF_OR_0:
            assert (verdict(PID), verdict(0), verdict(OTHER)) == (allow, allow, eperm), row
        elif rule == sandbox.THREADS:
            thread = 0x3D0F00  # glibc's pthread_create flags
            assert verdict(thread) == allow, row
            assert verdict(0x11) == eperm, row  # fork(): SIGCHLD only
            assert verdict(thread | 0x40000000) == eperm, row  # CLONE_NEWNET
        elif rule == sandbox.NO_ADDRESS:
            assert verdict(3, 0, 0, 0, 0) == allow, row
            assert verdict(3, 0, 0, 0, 0x7FFF0000) == eperm, row
            assert verdict(3, 0, 0, 0, 1 << 40) == eperm, row  # high word only
        elif rule == sandbox.NO_TTY_INJECTION:
            assert verdict(2, 0x5401) == allow, row  # TCGETS
            assert verdict(2, sandbox.TIOCSTI) == eperm, row
            assert verdict(2, sandbox.TIOCLINUX) == eperm, row
        else:
            raise AssertionError(f"untested rule {rule}")
    for nr in set(range(0, 480)) - listed:  # read, write, mmap, socketpair, ...
        assert run_bpf(program, nr, audit) == allow, nr
    foreign = sandbox.AUDIT_ARCH["aarch64" if arch == "x86_64" else "x86_64"]
    for other_arch in (foreign, 0x40000003):  # the other one, i386
        assert run_bpf(program, 0, other_arch) == sandbox.RET_KILL_PROCESS
    if arch == "x86_64":  # the x32 ABI shares the architecture value
        assert run_bpf(program, 0x40000000 | 41, audit) == sandbox.RET_KILL_PROCESS


def test_table_names_each_call_once_and_keeps_what_python_needs() -> None:
    names = [row[0] for row in sandbox.FILTER]
    assert len(names) == len(set(names))
    for needed in ("socketpair", "read", "write", "openat", "mmap", "getrandom", "prctl"):
        assert needed not in names


@pytest.mark.parametrize(
    ("arch", "header", "pattern"),
    [
        ("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h", r"#define __NR_(\w+)\s+(\d+)"),
        ("aarch64", "/usr/include/asm-generic/unistd.h", r"#define __NR(?:3264)?_(\w+)\s+(\d+)"),
    ],
)
def test_numbers_match_the_kernel_headers(arch: str, header: str, pattern: str) -> None:
    path = Path(header)
    if not path.exists():
        pytest.skip(f"{header} not installed")
    known = {m[1]: int(m[2]) for m in re.finditer(pattern, path.read_text())}
    column = 1 if arch == "x86_64" else 2
    checked = 0
    for row in sandbox.FILTER:
        if row[0] in known:  # calls newer than the headers were checked by hand
            assert row[column] == known[row[0]], row
            checked += 1
    assert checked > 100


# --- hostile code in the real worker ----------------------------------------------

NUMBERS = {row[0]: row[1 if ARCH == "x86_64" else 2] for row in sandbox.FILTER}

HOSTILE = r'''
import ctypes
import errno
import json
import os
import socket
import sys
import threading

from cairn.workflow import Field, Model, agent, workflow

SECRET = "@SECRET@"
SCRATCH = "@SCRATCH@"
STREAM = "@STREAM@"
DGRAM = "@DGRAM@"
ABSTRACT = "@ABSTRACT@"
NR = @NUMBERS@
PARENT = os.getppid()
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def raw(name, *args):
    if libc.syscall(ctypes.c_long(NR[name]), *[ctypes.c_long(a) for a in args]) < 0:
        raise OSError(ctypes.get_errno(), name)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def write_new():
    with open(SCRATCH + "/new", "w") as f:
        f.write("x")


def append():
    with open(SECRET, "a") as f:
        f.write("x")


def unix(kind, address):
    s = socket.socket(socket.AF_UNIX, kind)
    s.connect(address)


def inet():
    socket.socket(socket.AF_INET, socket.SOCK_STREAM).connect(("127.0.0.1", 9))


def sendto_path():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.sendto(b"leak", DGRAM)


def socketpair_roundtrip():
    a, b = socket.socketpair()
    a.send(b"ping")
    assert b.recv(4) == b"ping"


def fork():
    if os.fork() == 0:
        os._exit(0)


def thread():
    t = threading.Thread(target=lambda: None)
    t.start()
    t.join()


def lazy_imports():
    import decimal, fractions, textwrap, string, collections, functools, itertools
    import math, re, typing
    from pydantic import create_model
    model = create_model("Lazy", amount=(decimal.Decimal, ...))
    assert model(amount="1.5").amount == decimal.Decimal("1.5")


PROBES = {
    "read the test's secret file": lambda: read(SECRET),
    "append to it": append,
    "create a file": write_new,
    "mkdir": lambda: os.mkdir(SCRATCH + "/d"),
    "unlink the secret": lambda: os.unlink(SECRET),
    "rename the secret": lambda: os.rename(SECRET, SCRATCH + "/moved"),
    "chmod the secret": lambda: os.chmod(SECRET, 0o666),
    "list /": lambda: os.listdir("/"),
    "read /etc/passwd": lambda: read("/etc/passwd"),
    "read /etc/cairn": lambda: os.listdir("/etc/cairn"),
    "read /var/lib/cairn": lambda: os.listdir("/var/lib/cairn"),
    "list /proc/self/fd": lambda: os.listdir("/proc/self/fd"),
    "open the parent's memory": lambda: read(f"/proc/{PARENT}/mem"),
    "AF_UNIX stream connect": lambda: unix(socket.SOCK_STREAM, STREAM),
    "AF_UNIX abstract connect": lambda: unix(socket.SOCK_STREAM, ABSTRACT),
    "AF_UNIX datagram to a path": sendto_path,
    "AF_INET connect": inet,
    "AF_NETLINK socket": lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW),
    "execv": lambda: os.execv("/bin/true", ["true"]),
    "fork": fork,
    "kill the parent": lambda: os.kill(PARENT, 0),
    "ptrace the parent": lambda: raw("ptrace", 16, PARENT, 0, 0),  # PTRACE_ATTACH
    "process_vm_readv": lambda: raw("process_vm_readv", PARENT, 0, 0, 0, 0, 0),
    "prlimit the parent": lambda: raw("prlimit64", PARENT, 7, 0, 0),
    "unshare a user namespace": lambda: raw("unshare", 0x10000000),
    "io_uring_setup": lambda: raw("io_uring_setup", 1, 0),
    "bpf": lambda: raw("bpf", 0, 0, 0),
    "memfd_create": lambda: raw("memfd_create", 0, 0),
    "keyctl": lambda: raw("keyctl", 0, 0),
    "open_by_handle_at": lambda: raw("open_by_handle_at", -100, 0, 0),
    "shmget": lambda: raw("shmget", 0, 4096, 0o1600),
    # what the worker may still do
    "signal itself": lambda: os.kill(os.getpid(), 0),
    "socketpair": socketpair_roundtrip,
    "start a thread": thread,
    "import lazily": lazy_imports,
}


def probe():
    results = {}
    for name, attempt in PROBES.items():
        try:
            attempt()
            results[name] = "allowed"
        except OSError as exc:
            results[name] = errno.errorcode.get(exc.errno, str(exc.errno))
        except Exception as exc:
            results[name] = type(exc).__name__
    return json.dumps(results)


if "@WHEN@" == "import":
    raise RuntimeError(probe())


class Goal(Model):
    goal: str = Field(min_length=1)


class Note(Model):
    text: str


plan = agent(profile="builtin:planner", output=Note)


@workflow(description="hostile", input=Goal, output=Note)
async def run(flow, args: Goal) -> Note:
    first = await flow.agent(plan, prompt=args.goal)
    raise RuntimeError(probe())
'''

REFUSED = {"EACCES", "EPERM"}
EXPECTED_ALLOWED = {"signal itself", "socketpair", "start a thread", "import lazily"}
ABSENT_HERE = {"read /etc/cairn", "read /var/lib/cairn"}  # ENOENT where not installed


def exchange(
    source: str, wrapper: str | None = None
) -> tuple[list[CallRequest], dict[str, Any], int]:
    """Run ``source`` in a worker started the coordinator's way (or by ``wrapper`` code
    that ends by running the worker module); answer every agent call."""
    if wrapper is None:
        worker = runtime.spawn(make_env())
    else:
        worker = subprocess.Popen(
            [sys.executable, "-I", "-c", wrapper], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env=make_env(), process_group=0,
        )
    assert worker.stdin and worker.stdout
    assert os.getpgid(worker.pid) == worker.pid  # a process group of its own
    assert os.getsid(worker.pid) == os.getsid(0)  # the coordinator's session: its CPU share
    worker.stdin.write(StartWorkflow(source=source, filename="wf.py", args={"goal": "g"})
                       .model_dump_json() + "\n")
    worker.stdin.flush()
    calls: list[CallRequest] = []
    try:
        while True:
            line = worker.stdout.readline()
            if not line:
                return calls, {}, worker.wait(timeout=10)
            message = json.loads(line)
            if message["type"] != "call":
                return calls, message, worker.wait(timeout=10)
            call = CallRequest.model_validate(message)
            calls.append(call)
            value = {"output": {"text": "t"}, "handoff": "h", "op_id": f"root-{call.seq}"}
            worker.stdin.write(CallResult(seq=call.seq, value=value).model_dump_json() + "\n")
            worker.stdin.flush()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


@pytest.fixture
def targets(tmp_path: Path) -> Any:
    secret = tmp_path / "journal.sqlite"
    secret.write_text("every run's journal")
    secret.chmod(0o600)
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o777)
    stream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stream.bind(str(tmp_path / "agent.sock"))
    stream.listen(8)
    stream.setblocking(False)
    dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dgram.bind(str(tmp_path / "log.sock"))
    dgram.setblocking(False)
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract_name = f"\0cairn-sandbox-test-{os.getpid()}"
    abstract.bind(abstract_name)
    abstract.listen(8)
    abstract.setblocking(False)
    yield {
        "SECRET": str(secret), "SCRATCH": str(scratch), "STREAM": str(tmp_path / "agent.sock"),
        "DGRAM": str(tmp_path / "log.sock"), "ABSTRACT": abstract_name,
    }
    for listener in (stream, abstract):
        with pytest.raises(BlockingIOError):  # nobody got through
            listener.accept()
    with pytest.raises(BlockingIOError):
        dgram.recv(64)
    for s in (stream, dgram, abstract):
        s.close()
    assert secret.read_text() == "every run's journal"
    assert secret.stat().st_mode & 0o777 == 0o600
    assert os.listdir(scratch) == []


def hostile(when: str, places: dict[str, str]) -> str:
    source = HOSTILE.replace("@WHEN@", when).replace("@NUMBERS@", repr(NUMBERS))
    for key, value in places.items():
        source = source.replace(f"@{key}@", value.replace("\0", "\\0"))
    return source


RUN_WORKER = "import runpy\nrunpy.run_module('cairn.workflow.runtime', run_name='__main__')\n"


def as_if_abi(abi: int) -> str:
    """Wrapper code: the worker believes the kernel speaks Landlock ABI ``abi``."""
    pretend = f"from cairn.workflow import sandbox\nsandbox.landlock_abi = lambda: {abi}\n"
    return pretend + RUN_WORKER


@pytest.mark.parametrize(
    ("when", "abi"),
    [("import", None), ("workflow", None), ("import", 1), ("import", 4), ("import", 6)],
)
def test_hostile_code_in_the_worker_cannot_get_out(
    when: str, abi: int | None, targets: dict[str, str]
) -> None:
    """ABI 1, 4 and 6 stand for older kernels (Debian 13's 6.12 speaks 6): the seccomp
    filter still refuses what those ABIs leave to it (signals, abstract sockets, TCP)."""
    if abi is not None and abi > sandbox.landlock_abi():
        pytest.skip(f"this kernel speaks Landlock ABI {sandbox.landlock_abi()}")
    assert Path(targets["SECRET"]).read_text()  # readable to this (root) process
    wrapper = None if abi is None else as_if_abi(abi)
    calls, end, status = exchange(hostile(when, targets), wrapper)
    assert len(calls) == (1 if when == "workflow" else 0)
    assert end["type"] == "failure" and end["kind"] == "RuntimeError", end
    results = json.loads(end["error"])
    allowed = {name for name, outcome in results.items() if outcome == "allowed"}
    assert allowed == EXPECTED_ALLOWED, results
    for name, outcome in results.items():
        if name in EXPECTED_ALLOWED:
            continue
        if name in ABSENT_HERE and outcome == "ENOENT":
            continue
        assert outcome in REFUSED, (name, outcome)
    assert status == 1


def test_a_foreign_system_call_convention_kills_the_worker(targets: dict[str, str]) -> None:
    if ARCH != "x86_64":
        pytest.skip("the x32 convention exists on x86_64 only")
    source = hostile("import", targets).replace(
        'if "import" == "import":', 'if libc.syscall(0x40000000 | 39) or True:'
    )
    _calls, end, status = exchange(source)
    assert end == {} and status == -signal.SIGSYS


def test_without_landlock_the_worker_refuses_to_start() -> None:
    """Fail closed: a seccomp filter that refuses Landlock (as an older systemd's
    @system-service does) leaves the worker with a one-line reason and status 78."""
    wrapper = (
        "import ctypes, runpy\n"
        "from cairn.workflow import sandbox\n"
        "prog = [(sandbox.LD_ABS, 0, 0, 0), (sandbox.JEQ, 0, 1, 444),"
        " (sandbox.RET, 0, 0, sandbox.EPERM), (sandbox.RET, 0, 0, sandbox.RET_ALLOW)]\n"
        "sandbox._prctl(38, ctypes.c_ulong(1), 'nnp')\n"
        "sandbox.install_filter(prog)\n"
    ) + RUN_WORKER
    worker = subprocess.run(
        [sys.executable, "-I", "-c", wrapper], input="", capture_output=True,
        text=True, env=make_env(), timeout=30, check=False,
    )
    assert worker.returncode == runtime.EXIT_NO_SANDBOX
    (line,) = worker.stderr.splitlines()
    assert "Landlock is refused by a seccomp filter" in line and "SystemCallFilter=" in line
    message = json.loads(worker.stdout)
    assert message["type"] == "failure" and message["kind"] == "SandboxUnavailable"
