"""The exit statuses cairn(1) documents: 2 for usage, 1 for another error, 130 for Ctrl-C."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

CHILD = """
import os, signal, sys
from cairn import cli
from cairn.cli.commands import app

@app.command("interrupt-me")
def interrupt_me() -> None:
    os.kill(os.getpid(), signal.SIGINT)
    signal.pause()

sys.argv = ["cairn", *sys.argv[1:]]
cli.main()
"""


def _cairn(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "XDG_RUNTIME_DIR": "/nonexistent", "LC_ALL": "C.UTF-8"}
    return subprocess.run(
        [sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, env=env, timeout=60,
        check=False,
    )


def test_ctrl_c_exits_130_without_a_traceback() -> None:
    proc = _cairn("interrupt-me")
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr and "Aborted" not in proc.stderr


def test_a_usage_error_exits_2() -> None:
    proc = _cairn("launch", "--no-such-option")
    assert proc.returncode == 2, proc.stderr


def test_a_usage_error_is_one_line_and_a_hint() -> None:
    proc = _cairn("launch", "--no-such-option")
    # click words it "No such option: --x" up to 8.2, "No such option '--x'." after
    first, hint = proc.stderr.splitlines()
    assert first.startswith("cairn: No such option") and "--no-such-option" in first
    assert hint == "hint: see 'cairn launch --help'"
    bad = _cairn("logs", "-p", "loud", "flow_0000")
    assert bad.returncode == 2
    first, hint = bad.stderr.splitlines()
    assert first.startswith("cairn: Invalid value for '--priority' / '-p': priority 'loud' is not")
    assert hint == "hint: see 'cairn logs --help'"


def test_a_mistyped_command_is_answered_with_the_closest_one() -> None:
    for argv, said, hint in (
        (["lanuch"], "No such command 'lanuch'. Did you mean 'launch'?", "cairn"),
        (["schedule", "lst"], "No such command 'lst'. Did you mean 'list'?", "cairn schedule"),
        (["workflow", "reveiw"], "No such command 'reveiw'. Did you mean 'review'?",
         "cairn workflow"),
        (["storage", "dff"], "No such command 'dff'. Did you mean 'df'?", "cairn storage"),
        (["zzzz"], "No such command 'zzzz'.", "cairn"),  # nothing close: no guess
    ):
        proc = _cairn(*argv)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.splitlines() == [f"cairn: {said}", f"hint: see '{hint} --help'"]


def test_ctrl_c_while_a_launch_waits_for_cairnd_exits_130(tmp_path: Path) -> None:
    """The launch path (cairn.cli.launching, without click) stopped while cairnd has not
    answered: status 130 and no traceback, as under click."""
    (tmp_path / "run/cairn").mkdir(parents=True)
    connected = threading.Event()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(tmp_path / "run/cairn/cairnd.sock"))
        listener.listen(1)

        def silent_cairnd() -> None:
            conn, _ = listener.accept()
            connected.set()
            with conn:
                while conn.recv(1 << 16):
                    pass  # reads the request, never answers

        thread = threading.Thread(target=silent_cairnd)
        thread.start()
        env = {"PATH": "/usr/bin:/bin", "CAIRN_ROOT": str(tmp_path), "LC_ALL": "C.UTF-8"}
        # Ctrl-C as at a terminal, where SIGINT is never ignored: a test run started in the
        # background (CI) ignores it, Python keeps an ignored SIGINT ignored, and the child
        # would inherit that.
        child = subprocess.Popen(
            [sys.executable, "-c", "import signal; "
             "signal.signal(signal.SIGINT, signal.default_int_handler); "
             "import sys; from cairn import cli; sys.argv = "
             f"['cairn', 'launch', 'builtin:implement', '--project', {str(tmp_path)!r}]; "
             "cli.main()"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            assert connected.wait(timeout=60), "the launch never reached cairnd"
            child.send_signal(signal.SIGINT)
            try:
                _, stderr = child.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                pytest.fail(f"Ctrl-C did not end the launch: {_where(child.pid)}")
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        thread.join(timeout=30)
    assert child.returncode == 130, stderr
    assert "Traceback" not in stderr and "Aborted" not in stderr


def _where(pid: int) -> str:
    """What a stuck process is doing: its state, signal masks and kernel wait channel."""
    proc = Path(f"/proc/{pid}")
    try:
        status = [line for line in (proc / "status").read_text().splitlines()
                  if line.startswith(("State", "SigBlk", "SigIgn", "SigCgt", "SigPnd", "ShdPnd"))]
        return "; ".join([*status, "wchan " + (proc / "wchan").read_text(),
                          "stack " + (proc / "stack").read_text().replace("\n", " | ")])
    except OSError as exc:
        return f"no /proc/{pid}: {exc}"


def test_a_group_named_alone_prints_its_help_and_exits_0() -> None:
    for argv in ([], ["schedule"]):
        proc = _cairn(*argv)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(f"Usage: cairn {' '.join(argv)}".rstrip() + " [OPTIONS]")
        assert "Commands:" in proc.stdout and proc.stderr == ""


def test_help_is_h_too() -> None:
    proc = _cairn("list", "-h")
    assert proc.returncode == 0 and proc.stdout.startswith("Usage: cairn list [OPTIONS]")
