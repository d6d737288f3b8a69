"""The subprocess helper's streaming and bounded forms: read as it comes, stop early, hold no
more than asked, fail loudly."""

from __future__ import annotations

import subprocess
import time

import pytest

from cairn import proc
from cairn.errors import ProcessFailed


def test_reading_yields_stdout_as_it_comes_and_checks_the_exit() -> None:
    with proc.reading(["/bin/sh", "-c", "printf 'one\\ntwo\\n'"]) as out:
        assert out.read() == b"one\ntwo\n"


def test_leaving_early_ends_the_process_without_an_error() -> None:
    started = time.monotonic()
    with proc.reading(["/bin/sh", "-c", "echo first; exec tail -f /dev/null"]) as out:
        assert out.read(6) == b"first\n"
    assert time.monotonic() - started < 10  # killed, not waited for


def test_a_failing_command_read_to_the_end_raises_with_its_last_stderr_line() -> None:
    with (pytest.raises(ProcessFailed, match="it went wrong"),  # noqa: PT012 - read, then exit
          proc.reading(["/bin/sh", "-c", "echo partial; echo 'it went wrong' >&2; exit 3"]) as out):
        assert out.read() == b"partial\n"


def test_the_environment_is_the_minimal_one() -> None:
    with proc.reading(["/usr/bin/env"], env={"EXTRA": "1"}) as out:
        lines = set(out.read().decode().splitlines())
    assert "EXTRA=1" in lines and not any(line.startswith("HOME=") for line in lines)


def test_output_knows_its_end() -> None:
    with proc.reading(["/bin/sh", "-c", "printf abc"]) as out:
        assert out.read(2) == b"ab" and not out.ended
        assert out.read(2) == b"c" and out.ended


def test_a_bounded_run_returns_what_a_small_command_printed_and_its_status() -> None:
    done = proc.run_bounded(
        ["sh", "-c", "echo out; echo err >&2; exit 3"], limit=100, timeout=30
    )
    assert (done.returncode, done.stdout, done.stderr) == (3, b"out\n", b"err\n")


@pytest.mark.parametrize("stream", ["", ">&2"])
def test_a_bounded_run_kills_a_command_that_prints_more(stream: str) -> None:
    started = time.monotonic()
    # printing forever, on stdout or stderr: read to the bound, then killed
    with pytest.raises(proc.OutputTooLarge, match="printed more than 4096 bytes"):
        proc.run_bounded(["sh", "-c", f"yes {stream}"], limit=4096, timeout=30)
    assert time.monotonic() - started < 10


def test_a_bounded_run_kills_a_command_past_its_timeout() -> None:
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        proc.run_bounded(["tail", "-f", "/dev/null"], limit=100, timeout=0.5)
    assert time.monotonic() - started < 10
