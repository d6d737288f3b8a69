"""Shell completion: commands, options and definitions from the CLI itself, and the
caller's live run IDs from cairnd (here a stand-in daemon on a real Unix socket that
answers as cairnd would), through ``cairn __complete`` and through the shipped bash script."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clirunner import CliRunner

from cairn import paths
from cairn.cli.commands import app
from cairn.cli.completion import FILE, SCRIPTS, complete, short_ids
from cairn.protocol.daemon import DaemonReply

REPO = Path(__file__).resolve().parents[2]
SHELLS = REPO / "cairn" / "cli" / "shells"
LIVE = "flow_3fa9c0d1" + "0" * 24
TWIN = "flow_3fa9c0d2" + "0" * 24
OLD = "flow_7b21" + "e" * 28


def run(run_id: str, created_at: float, state: str = "running") -> dict[str, Any]:
    return {"run_id": run_id, "state": state, "definition": "builtin:implement",
            "created_at": created_at}


class FakeDaemon:
    """Answers the daemon socket as cairnd would: its schedules to a schedule listing, its
    runs to anything else; records what it was asked."""

    def __init__(self, path: Path, runs: list[dict[str, Any]]) -> None:
        self.runs = runs
        self.schedules = [{
            "schedule_id": "0123456789ab", "name": "nightly", "status": "enabled",
            "revision": 1, "confirmed_revision": 1, "awaiting_confirmation": False,
            "definition": "builtin:implement", "project": "/src/demo",
            "calendar": "*-*-* 02:00:00 UTC", "timezone": "UTC", "catch_up": "none",
            "overlap": "skip", "min_spacing_sec": 0, "max_runs": 10, "runs_used": 0,
            "valid_until": "2030-01-01T00:00:00Z", "launch_failures": 0, "blocked_reason": None,
            "timer_unit": "cairn-schedule@0123456789ab.timer", "timer": "[Timer]\n",
            "last_occurrence": None,
        }]
        self.asked: list[bytes] = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                line = b""
                while not line.endswith(b"\n"):
                    chunk = conn.recv(1 << 16)
                    if not chunk:
                        break
                    line += chunk
                self.asked.append(line)
                result = self.schedules if b'"op":"schedule-list"' in line else self.runs
                conn.sendall(DaemonReply(ok=True, result=result).model_dump_json().encode())

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDaemon]:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    paths.daemon_socket().parent.mkdir(parents=True)
    fake = FakeDaemon(
        paths.daemon_socket(), [run(OLD, 1.0, "succeeded"), run(LIVE, 3.0), run(TWIN, 2.0)]
    )
    yield fake
    fake.close()


ROOT = app


def values(words: list[str]) -> list[str]:
    return [line.split("\t")[0] for line in complete(ROOT, words)]


def test_commands_and_subcommands_are_offered_without_hidden_aliases() -> None:
    assert values(["cairn", "l"]) == ["launch", "list", "logs"]
    assert values(["cairn", "schedule", "re"]) == ["resume", "repair"]
    for hidden in ("ps", "__complete"):
        assert hidden not in values(["cairn", ""])
    assert "inspect" not in values(["cairn", "schedule", ""])


def test_options_are_offered_with_their_help() -> None:
    lines = complete(ROOT, ["cairn", "logs", "3fa9", "--p"])
    assert lines == ["--priority\tOnly this level and more severe (err, warning, … or 0-7), "
                     "or a range such as err..warning."]


def test_definitions_are_the_builtins_and_workflow_files() -> None:
    assert complete(ROOT, ["cairn", "launch", "builtin:"]) == [
        "builtin:execute-plan\tbuiltin workflow", "builtin:goal\tbuiltin workflow",
        "builtin:implement\tbuiltin workflow", "builtin:optimize\tbuiltin workflow",
        "builtin:research\tbuiltin workflow", "builtin:review\tbuiltin workflow", FILE
    ]
    assert complete(ROOT, ["cairn", "schedule", "create", "nightly", ""])[-1] == FILE


def test_live_run_ids_come_from_cairnd_by_short_id(daemon: FakeDaemon) -> None:
    lines = complete(ROOT, ["cairn", "show", ""])
    assert lines == [
        "@last\tyour newest run",
        "3fa9c0d1\trunning builtin:implement",
        "3fa9c0d2\trunning builtin:implement",
        "7b21eeee\tsucceeded builtin:implement",
    ]
    # cairnd was asked for the runs this caller may see, and nothing else
    assert len(daemon.asked) == 1 and b'"op":"ps"' in daemon.asked[0]
    assert b'"all_users":true' in daemon.asked[0]
    assert values(["cairn", "logs", "-f", "7b"]) == ["7b21eeee"]
    # once flow_ is typed, the full ID
    assert values(["cairn", "watch", "flow_3fa9c0d1"]) == [LIVE]
    assert values(["cairn", "doctor", "@"]) == ["@last"]


def test_schedule_ids_come_from_cairnd(daemon: FakeDaemon) -> None:
    assert complete(ROOT, ["cairn", "schedule", "show", ""]) == ["0123456789ab\tnightly enabled"]
    assert complete(ROOT, ["cairn", "schedule", "pause", "9"]) == []


def test_through_the_hidden_command(daemon: FakeDaemon) -> None:
    result = CliRunner().invoke(app, ["__complete", "--", "cairn", "cancel", "3fa"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "3fa9c0d1\trunning builtin:implement", "3fa9c0d2\trunning builtin:implement"
    ]


def test_without_cairnd_only_at_last_is_offered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    assert complete(ROOT, ["cairn", "show", ""]) == ["@last\tyour newest run"]


def test_after_another_host_commands_complete_and_local_runs_are_not_offered(
    daemon: FakeDaemon,
) -> None:
    for host in (["-H", "alice@build2"], ["-Halice@build2"], ["--host=build2"],
                 ["--host", "build2"]):
        assert values(["cairn", *host, "l"]) == ["launch", "list", "logs"]
        assert complete(ROOT, ["cairn", *host, "show", ""]) == ["@last\tyour newest run"]
        assert complete(ROOT, ["cairn", *host, "schedule", "show", ""]) == []
        launchable = values(["cairn", *host, "launch", "builtin:"])
        assert "builtin:implement" in launchable and FILE not in launchable  # HOST's files
    assert daemon.asked == []  # this host's cairnd knows nothing of build2's runs
    assert complete(ROOT, ["cairn", "-H", "bu"]) == []  # the host: the shell's own
    assert complete(ROOT, ["cairn", "--host", ""]) == []


def test_short_ids_are_unique_prefixes_of_at_least_eight_digits() -> None:
    near = "flow_" + "3fa9c0d1ab" + "0" * 22
    short = short_ids([LIVE, TWIN, OLD, near])
    assert short == {LIVE: "3fa9c0d10", near: "3fa9c0d1a", TWIN: "3fa9c0d2", OLD: "7b21eeee"}
    assert short_ids([]) == {}


def test_the_bash_script_offers_a_live_run_id(daemon: FakeDaemon, tmp_path: Path) -> None:
    """The shipped script, in bash, running this checkout's cairn as the shell would."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "cairn").write_text(f"#!/bin/sh\nexec {sys.executable} -m cairn.cli \"$@\"\n")
    (bin_dir / "cairn").chmod(0o755)
    printed = subprocess.run([sys.executable, "-m", "cairn.cli", "completion", "bash"],
                             capture_output=True, check=True, timeout=60).stdout
    assert printed == (SHELLS / "cairn.bash").read_bytes()
    (tmp_path / "cairn.bash").write_bytes(printed)
    script = (
        f"source {tmp_path / 'cairn.bash'}\n"
        'COMP_LINE="cairn logs -f 3f"; COMP_POINT=${#COMP_LINE}; _cairn\n'
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "CAIRN_ROOT": os.environ["CAIRN_ROOT"],
           "LANG": "C.UTF-8"}
    out = subprocess.run(["bash", "--norc", "-c", script], env=env, capture_output=True,
                         check=True, timeout=60, text=True)
    assert out.stdout.splitlines() == ["3fa9c0d1", "3fa9c0d2"]


def test_the_scripts_ask_the_hidden_command_and_are_shipped() -> None:
    shipped = {
        "cairn.bash": "usr/share/bash-completion/completions/cairn",
        "_cairn": "usr/share/zsh/vendor-completions/_cairn",
        "cairn.fish": "usr/share/fish/vendor_completions.d/cairn.fish",
    }
    rules = (REPO / "packaging" / "debian" / "rules").read_text()
    spec = (REPO / "packaging" / "rpm" / "cairn.spec").read_text()
    for name, installed in shipped.items():
        assert "cairn __complete --" in (SHELLS / name).read_text(), name
        assert f"cairn/cli/shells/{name} debian/cairn/{installed}\n" in rules
        assert f"install -Dpm0644 cairn/cli/shells/{name} " in spec
    assert sorted(p.name for p in SHELLS.iterdir()) == sorted(shipped)
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["tool"]["setuptools"]["package-data"]["cairn.cli"] == ["shells/*"]
    for installed in ("%{_datadir}/bash-completion/completions/cairn",
                      "%{_datadir}/zsh/site-functions/_cairn",
                      "%{_datadir}/fish/vendor_completions.d/cairn.fish"):
        assert spec.count(installed) == 2, installed  # installed, and listed in %files


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_prints_each_shells_script(shell: str) -> None:
    result = CliRunner().invoke(app, ["completion", shell])
    assert result.exit_code == 0
    assert result.stdout == (SHELLS / SCRIPTS[shell]).read_text()


def test_completion_of_another_shell_is_refused_in_one_line() -> None:
    result = subprocess.run([sys.executable, "-m", "cairn.cli", "completion", "tcsh"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "'tcsh' is not one of bash, zsh, fish" in result.stderr
