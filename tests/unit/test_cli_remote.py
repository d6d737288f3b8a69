"""``cairn -H [USER@]HOST``: the command line read before click, the destination checked
before ssh sees it, the remote command quoted for the remote shell, and cairn replaced by
ssh so that its exit status is the command's. A stand-in ``ssh`` records what it was
given here; tests/system/test_remote_hosts.py runs the real one between two machines."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from cairn.cli import remote
from cairn.errors import UsageError


@pytest.mark.parametrize(
    ("argv", "host", "rest"),
    [
        (["-H", "alice@m2", "list"], "alice@m2", ["list"]),
        (["-Hm2", "list", "-q"], "m2", ["list", "-q"]),
        (["--host", "m2", "logs", "-f", "@last"], "m2", ["logs", "-f", "@last"]),
        (["--host=m2"], "m2", []),
        (["list", "-H", "m2"], None, ["list", "-H", "m2"]),
        ([], None, []),
    ],
)
def test_a_leading_host_is_split_off(argv: list[str], host: str | None, rest: list[str]) -> None:
    assert remote.split_host(argv) == (host, rest)


def test_a_host_flag_without_a_host_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="needs a host"):
        remote.split_host(["-H"])


@pytest.mark.parametrize(
    "host", ["", "-oProxyCommand=touch /tmp/x", "-p2222", "a b", "m2\n", "m2\x1b[2J", "h" * 256]
)
def test_a_destination_ssh_would_misread_is_refused(host: str) -> None:
    assert remote.host_problem(host) is not None


@pytest.mark.parametrize("host", ["m2", "alice@m2", "alice@10.0.0.2", "::1", "ssh://alice@m2:2222"])
def test_a_destination_ssh_takes_is_accepted(host: str) -> None:
    assert remote.host_problem(host) is None


def test_the_remote_shell_gets_each_word_back_unchanged() -> None:
    words = ["launch", "builtin:goal", "--arg", "objective=$(touch /tmp/p); rm -rf ~", "--arg",
             "n='1'\n2", "--project", "/home/alice/my project"]
    argv = remote.ssh_argv("alice@m2", words, terminal=False)
    assert argv[:5] == ["ssh", "-T", "-x", "--", "alice@m2"] and len(argv) == 6
    assert shlex.split(argv[5]) == ["cairn", *words]
    assert remote.ssh_argv("m2", ["watch", "@last"], terminal=True)[1] == "-t"


STAND_IN = """#!/bin/sh
printf '%s\\n' "$@" > "$RECORD"
cat > "$RECORD.stdin"
exit 7
"""


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    """A directory for PATH with the stand-in ssh."""
    found = tmp_path / "bin"
    found.mkdir()
    (found / "ssh").write_text(STAND_IN)
    (found / "ssh").chmod(0o755)
    return found


def test_cairn_becomes_ssh_and_exits_with_its_status(tmp_path: Path, bin_dir: Path) -> None:
    record = tmp_path / "argv"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "RECORD": str(record), "SSH_AUTH_SOCK": "/a.sock"}
    proc = subprocess.run(
        [sys.executable, "-m", "cairn.cli", "-H", "alice@m2", "show", "@last", "--json"],
        input=b"piped", capture_output=True, env=env, timeout=60, check=False,
    )
    assert proc.returncode == 7, proc.stderr
    argv = record.read_text().splitlines()
    assert argv == ["-T", "-x", "--", "alice@m2", "cairn show @last --json"]
    assert (tmp_path / "argv.stdin").read_bytes() == b"piped"  # stdin is ssh's


def test_a_refused_host_never_reaches_ssh(tmp_path: Path, bin_dir: Path) -> None:
    record = tmp_path / "argv"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "RECORD": str(record)}
    proc = subprocess.run(
        [sys.executable, "-m", "cairn.cli", "-H", "-oProxyCommand=touch /tmp/x", "list"],
        capture_output=True, env=env, timeout=60, check=False, text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[0] == (
        "cairn: '-oProxyCommand=touch /tmp/x' is not a host: it would be an option of ssh"
    )
    assert not record.exists()
    later = subprocess.run(
        [sys.executable, "-m", "cairn.cli", "list", "-H", "m2"],
        capture_output=True, env=env, timeout=60, check=False, text=True,
    )
    assert later.returncode == 2 and "-H comes first" in later.stderr
    assert not record.exists()


def test_without_ssh_the_error_says_what_to_install(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path), "HOME": os.environ.get("HOME", "/root")}
    proc = subprocess.run(
        [sys.executable, "-m", "cairn.cli", "-H", "m2", "list"],
        capture_output=True, env=env, timeout=60, check=False, text=True,
    )
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "cairn: cannot run ssh for -H m2: No such file or directory",
        "hint: install the OpenSSH client (openssh-client)",
    ]
