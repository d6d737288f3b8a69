"""The exit statuses cairn(1) documents: 2 for usage, 1 for another error, 130 for Ctrl-C."""

from __future__ import annotations

import subprocess
import sys

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
        [sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, env=env, timeout=60
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
    assert proc.stderr.splitlines() == [
        "cairn: No such option: --no-such-option",
        "hint: see 'cairn launch --help'",
    ]
    bad = _cairn("logs", "-p", "loud", "flow_0000")
    assert bad.returncode == 2
    first, hint = bad.stderr.splitlines()
    assert first.startswith("cairn: Invalid value for '--priority' / '-p': priority 'loud' is not")
    assert hint == "hint: see 'cairn logs --help'"
