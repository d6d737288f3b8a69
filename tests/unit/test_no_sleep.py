"""The unit tier never waits on the wall clock: time is injected, and a test that needs
something to block uses something that blocks (a pipe, a FIFO, an event), not a pause.

This test searches every text file under tests/unit for the word, except this file."""

from __future__ import annotations

from pathlib import Path

UNIT = Path(__file__).resolve().parent
WORD = "sle" + "ep"


def test_the_unit_tier_never_pauses() -> None:
    found = []
    for path in sorted(UNIT.rglob("*")):
        if path == Path(__file__).resolve() or not path.is_file():
            continue
        if "__pycache__" in path.parts:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if WORD in line.lower():
                found.append(f"{path.relative_to(UNIT)}:{number}: {line.strip()}")
    assert not found, "the unit tier must not pause; inject time or block on a pipe:\n" + (
        "\n".join(found)
    )
