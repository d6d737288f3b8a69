"""The subprocess helper's streaming form: read as it comes, stop early, fail loudly."""

from __future__ import annotations

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
