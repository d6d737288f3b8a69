"""show, diff and logs go through a pager on a terminal when longer than the screen
($PAGER, else less -FRX), and never into one for a pipe, with --no-pager, or when they fit;
a pager that is not there still leaves the text on the terminal. Each command runs as a
real process on a pseudo-terminal against a stand-in cairnd."""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp_standin import StandInDaemon
from test_cli_confirm import CHILD, RUN, environment, on_terminal

from cairn import paths

LONG = "".join(f"+line {n}\n" for n in range(60))


def diff_reply(body: str) -> dict[str, object]:
    summary = {"status": "applied", "label": "applied 1 path", "complete": True, "accepted": 1,
               "applied": 1, "already_applied": 0, "refused": 0, "ignored": 0,
               "conflicts": 0, "reverted": False}
    return {"run_id": RUN, "status": "applied", "summary": summary, "accepted": ["a"],
            "refused": [], "ignored": [],
            "apply": {"status": "applied", "applied": ["a"], "already_applied": [],
                      "conflicts": []},
            "diff": body}


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[StandInDaemon]:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    paths.daemon_socket().parent.mkdir(parents=True)
    stand_in = StandInDaemon(paths.daemon_socket(), {"diff": diff_reply(LONG)})
    yield stand_in
    stand_in.close()


def pager_env(tmp_path: Path, pager: str | None = None) -> dict[str, str]:
    paged = tmp_path / "paged.txt"
    command = pager if pager is not None else f"sh -c {shlex.quote(f'cat > {paged}')}"
    return {**environment(tmp_path), "PAGER": command, "LINES": "20", "TERM": "dumb"}


def test_a_long_diff_on_a_terminal_goes_through_the_pager(
    daemon: StandInDaemon, tmp_path: Path
) -> None:
    status, output = on_terminal(["diff", RUN], None, pager_env(tmp_path))
    assert status == 0, output
    paged = (tmp_path / "paged.txt").read_text()
    assert paged == f"# {RUN}: applied 1 path\n{LONG}"
    assert "+line 59" not in output  # the pager had it, not the terminal


@pytest.mark.parametrize("how", ["--no-pager", "fits", "no such pager", "unbalanced quotes"])
def test_otherwise_the_text_reaches_the_terminal_itself(
    daemon: StandInDaemon, tmp_path: Path, how: str
) -> None:
    pagers = {"no such pager": "no-such-pager-here", "unbalanced quotes": "less 'oops"}
    env = pager_env(tmp_path, pagers.get(how))
    if how == "fits":
        env["LINES"] = "100"
    argv = ["diff", RUN, *(["--no-pager"] if how == "--no-pager" else [])]
    status, output = on_terminal(argv, None, env)
    assert status == 0, output
    assert not (tmp_path / "paged.txt").exists()
    assert output.endswith(LONG)


def test_a_pipe_never_gets_a_pager(daemon: StandInDaemon, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD, "diff", RUN], capture_output=True,
                          env=pager_env(tmp_path), timeout=60, check=False,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode().endswith(LONG)
    assert not (tmp_path / "paged.txt").exists()
