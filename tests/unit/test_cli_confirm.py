"""Commands that cannot be undone ask a person at a terminal first (``[y/N]``; anything
but y stops them with nothing changed) and never a script: ``--yes`` goes on unasked, and
without a terminal and without ``--yes`` the command is refused before it changes
anything. Each command runs as a real process on a pseudo-terminal, against a stand-in
cairnd that records what reached it."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp_standin import StandInDaemon

from cairn import paths
from cairn.definitions import user
from cairn.protocol.definitions import InstalledDefinition
from cairn.workflow.review import review_source

CHILD = "import sys; from cairn import cli; sys.argv = ['cairn', *sys.argv[1:]]; cli.main()"
RUN = "flow_" + "3fa9" * 8
PROMPT = b"[y/N] "


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[StandInDaemon]:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    paths.daemon_socket().parent.mkdir(parents=True)
    done = {"run_id": RUN, "action": "cancel", "outcome": "cancelled", "woken": False}
    stand_in = StandInDaemon(paths.daemon_socket(), {
        "cancel": done,
        "revert": {"run_id": RUN, "unit": "cairn-apply-1.service", "status": "applied",
                   "applied": ["a"], "already_applied": [], "conflicts": [],
                   "xattrs_not_kept": [], "links_not_kept": []},
        "rm": {"run_id": RUN, "already_gone": False, "subvolumes": 3, "reclaim_pending": 0,
               "free_bytes": None},
        "show": {"run": {"run_id": RUN, "state": "succeeded"}, "operations": [], "units": [],
                 "storage": {"deleted": False, "deleted_at": None, "subvolumes": 0},
                 "settlement": {"status": "applied", "apply": {
                     "status": "applied", "applied": ["a.txt", "b/\x1b[2Jc"]}},
                 "settlement_summary": {
                     "status": "applied", "label": "applied", "complete": True,
                     "accepted": 2, "applied": 2, "already_applied": 0, "refused": 0,
                     "ignored": 0, "conflicts": 0, "reverted": False},
                 "replayed_from": None, "worklists": [], "experiments": [], "model": None,
                 "question": None, "divergence": None,
                 "integrity": {"ok": True, "issues": []}, "latest_event": None,
                 "events_shown": "all 0 events", "progress": {}},
        "schedule-inspect": {
            "schedule_id": "0123456789ab", "name": "nightly", "status": "active",
            "revision": 1, "confirmed_revision": 1, "awaiting_confirmation": False,
            "definition": "builtin:implement", "project": "/src/demo",
            "calendar": "*-*-* 02:00:00 UTC", "timezone": "UTC", "catch_up": "none",
            "overlap": "skip", "min_spacing_sec": 0, "max_runs": 10, "runs_used": 0,
            "valid_until": "2030-01-01T00:00:00Z", "launch_failures": 0, "blocked_reason": None,
            "timer_unit": "cairn-schedule@0123456789ab.timer", "timer": None,
            "last_occurrence": None, "review_hash": "sha256:0", "args": {}, "profiles": [],
            "challenge": None, "next_elapses": [], "occurrences": [],
            "occurrences_omitted": False,
        },
        "prune": {"dry_run": False, "rule": {"older_than": None, "keep": 5},
                  "delete": [{"run_id": RUN, "reason": "older"}], "kept": [], "deleted": [],
                  "failed": [], "reclaim_pending": 0, "free_bytes": None},
    })
    yield stand_in
    stand_in.close()


def environment(tmp_path: Path) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "CAIRN_ROOT": str(tmp_path), "LC_ALL": "C.UTF-8",
            "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config"),
            "XDG_RUNTIME_DIR": str(tmp_path / "user-runtime")}


def on_terminal(argv: list[str], answer: bytes | None, env: dict[str, str]) -> tuple[int, str]:
    """Run ``cairn ARGV`` on a pseudo-terminal; type ``answer`` when it asks."""
    master, slave = os.openpty()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, *argv], stdin=slave, stdout=slave,
                            stderr=slave, env=env)
    os.close(slave)
    seen = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 30)
            assert ready, f"cairn {' '.join(argv)} is stuck: {seen!r}"
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
            if seen.endswith(PROMPT) and answer is not None:
                os.write(master, answer)
                answer = None
    finally:
        os.close(master)
    return proc.wait(timeout=30), seen.decode(errors="replace").replace("\r\n", "\n")


def ops(daemon: StandInDaemon) -> list[tuple[str, bool]]:
    return [(r["op"], bool(r.get("dry_run"))) for r in daemon.asked]


@pytest.mark.parametrize(("argv", "question"), [
    (["cancel", RUN], f"Cancel run {RUN}? Its running agents are stopped"),
    (["revert", RUN], f"Revert what run {RUN} applied to its project?"),
    (["schedule", "rm", "0123456789ab"], "Delete schedule 0123456789ab and its timer?"),
    (["schedule", "delete", "0123456789ab"], "Delete schedule 0123456789ab and its timer?"),
])
def test_no_at_the_prompt_changes_nothing(
    argv: list[str], question: str, daemon: StandInDaemon, tmp_path: Path
) -> None:
    status, output = on_terminal(argv, b"n\n", environment(tmp_path))
    assert status == 1, output
    assert question in output and "[y/N] n\n" in output
    assert output.endswith(
        "cairn: not confirmed; nothing was changed (--yes does it without asking)\n")
    assert daemon.asked == []


def test_yes_at_the_prompt_goes_on(daemon: StandInDaemon, tmp_path: Path) -> None:
    status, output = on_terminal(["cancel", RUN], b"y\n", environment(tmp_path))
    assert status == 0, output
    assert output.endswith(f"{RUN}: cancelled\n")
    assert ops(daemon) == [("cancel", False)]


@pytest.mark.parametrize("flag", ["--yes", "-y"])
def test_with_yes_nothing_is_asked(flag: str, daemon: StandInDaemon, tmp_path: Path) -> None:
    status, output = on_terminal(["cancel", RUN, flag], None, environment(tmp_path))
    assert status == 0 and "[y/N]" not in output, output
    assert ops(daemon) == [("cancel", False)]


@pytest.mark.parametrize("argv", [
    ["cancel", RUN], ["revert", RUN], ["rm", RUN], ["prune"], ["schedule", "rm", "0123456789ab"],
])
def test_without_a_terminal_and_without_yes_it_is_refused_and_nothing_is_asked(
    argv: list[str], daemon: StandInDaemon, tmp_path: Path
) -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True,
                          env=environment(tmp_path), timeout=60, check=False,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr
    command = " ".join(["cairn", *argv[: 2 if argv[0] == "schedule" else 1]])
    assert proc.stderr.decode().splitlines() == [
        f"cairn: {command} cannot be undone and there is no terminal to ask; nothing was "
        "changed",
        "hint: give --yes (-y) to do it without asking",
    ]
    assert proc.stdout == b"" and daemon.asked == []


def test_without_a_terminal_yes_goes_on(daemon: StandInDaemon, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD, "cancel", RUN, "--yes"],
                          capture_output=True, env=environment(tmp_path), timeout=60,
                          check=False, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert b"[y/N]" not in proc.stderr + proc.stdout
    assert ops(daemon) == [("cancel", False)]


def test_rm_asks_after_checking_every_run_and_deletes_what_it_named(
    daemon: StandInDaemon, tmp_path: Path
) -> None:
    status, output = on_terminal(["rm", "3fa9"], b"no\n", environment(tmp_path))
    assert status == 1, output
    assert f"Delete the storage of 1 run(s): {RUN}? Their history stays" in output
    assert ops(daemon) == [("rm", True)]  # checked, not deleted
    status, output = on_terminal(["rm", "3fa9"], b"yes\n", environment(tmp_path))
    assert status == 0, output
    assert ops(daemon)[1:] == [("rm", True), ("rm", False)]
    assert daemon.asked[-1]["run_id"] == RUN  # the run the check resolved, not the prefix


def test_prune_asks_with_the_count_its_dry_run_found(
    daemon: StandInDaemon, tmp_path: Path
) -> None:
    status, output = on_terminal(["prune"], b"\n", environment(tmp_path))  # Enter: no
    assert status == 1, output
    whose = " of every user" if os.geteuid() == 0 else ""
    assert f"Delete the storage of 1 finished run(s){whose}?" in output
    assert ops(daemon) == [("prune", True)]
    status, output = on_terminal(["prune", "--dry-run"], None, environment(tmp_path))
    assert status == 0 and "[y/N]" not in output, output


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> InstalledDefinition:
    """user:fix-flaky, installed from its draft."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    source = user.draft_source("fix-flaky")
    path = tmp_path / "fix-flaky.py"
    path.write_text(source)
    return user.install(path, review_source(source, filename=path.name).review_hash)


def test_workflow_remove_asks_naming_the_installed_hash(
    tmp_path: Path, installed: InstalledDefinition
) -> None:
    env = environment(tmp_path)

    status, output = on_terminal(["workflow", "remove", "user:fix-flaky"], b"n\n", env)
    assert status == 1, output
    assert f"Remove user:fix-flaky ({installed.review_hash}) and its exposure?" in output
    assert user.installed("fix-flaky", purpose="kept").review_hash == installed.review_hash
    status, output = on_terminal(["workflow", "remove", "user:fix-flaky"], b"y\n", env)
    assert status == 0, output
    assert output.endswith(f"removed user:fix-flaky  {installed.review_hash}\n")
    status, output = on_terminal(["workflow", "remove", "user:nothing"], b"y\n", env)
    assert status == 2 and "[y/N]" not in output, output  # not installed: refused, not asked


def run_piped(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True,
                          env=env, timeout=60, check=False, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(("argv", "said", "asked"), [
    (["rm", RUN, "--dry-run"], f"would delete {RUN} (its history stays)", [("rm", True)]),
    (["cancel", RUN, "--dry-run"], f"would leave {RUN} as it is: it already ended succeeded",
     [("show", False)]),
    (["revert", RUN, "--dry-run"],
     f"would put back the content from before {RUN} of the 2 path(s) it applied (a.txt, "
     "b/\\x1b[2Jc), unless one changed since (then nothing is written)", [("show", False)]),
    (["schedule", "rm", "0123456789ab", "--dry-run"],
     "would delete schedule 0123456789ab (nightly, active) and its timer; the runs it "
     "launched stay", [("schedule-inspect", False)]),
])
def test_a_dry_run_says_what_would_go_without_a_terminal_or_yes_and_changes_nothing(
    argv: list[str], said: str, asked: list[tuple[str, bool]], daemon: StandInDaemon,
    tmp_path: Path,
) -> None:
    proc = run_piped(argv, environment(tmp_path))
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith(said), first
    assert proc.stdout.endswith("; nothing was changed (--dry-run)\n") or argv[0] == "rm"
    assert ops(daemon) == asked


def test_workflow_rm_dry_run_names_what_would_go_and_keeps_it(
    tmp_path: Path, installed: InstalledDefinition
) -> None:
    proc = run_piped(["workflow", "rm", "user:fix-flaky", "--dry-run"], environment(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (f"would remove user:fix-flaky ({installed.review_hash}) and its "
                           "exposure; nothing was changed (--dry-run)\n")
    assert user.installed("fix-flaky", purpose="kept").review_hash == installed.review_hash
