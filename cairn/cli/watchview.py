"""How ``cairn watch`` and ``cairn show`` render progress and agent notes: a progress bar
redrawn in place on a terminal, one plain line per report otherwise."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any, TextIO

from cairn.terminal import printable

BAR_WIDTH = 30
UNITS = {"import": "entries", "apply": "paths"}


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _fraction(data: dict[str, Any]) -> float | None:
    total = data.get("total")
    if not isinstance(total, int) or total <= 0:
        return None
    return min(1.0, max(0, int(data.get("done", 0))) / total)


def progress_text(data: dict[str, Any]) -> str:
    """``import 41200/100000 entries (41%), 12.0 MiB/40.0 MiB``."""
    phase = printable(data.get("phase", "?"))
    done, total = printable(data.get("done", 0)), data.get("total")
    text = f"{phase} {done}" + (f"/{printable(total)}" if total is not None else "")
    text += f" {UNITS.get(phase, 'items')}"
    fraction = _fraction(data)
    if fraction is not None:
        text += f" ({fraction:.0%})"
    if data.get("bytes_total"):
        text += f", {_size(int(data.get('bytes_done', 0)))}/{_size(int(data['bytes_total']))}"
    return text


def progress_bar(data: dict[str, Any], width: int = BAR_WIDTH) -> str:
    """``[#########.....................] import 41200/100000 entries (41%), …``."""
    fraction = _fraction(data) or 0.0
    filled = int(fraction * width)
    return f"[{'#' * filled}{'.' * (width - filled)}] {progress_text(data)}"


def clock(at: float) -> str:
    return datetime.datetime.fromtimestamp(at).strftime("%H:%M:%S")


class EventPrinter:
    """Print watch events to ``out``: progress as a bar redrawn in place when ``tty``,
    otherwise (and every other event) as lines; ``render`` renders the other events."""

    def __init__(self, out: TextIO, *, tty: bool, render: Callable[[dict[str, Any]], str]) -> None:
        self.out = out
        self.tty = tty
        self.render = render
        self.bar_shown = False

    def event(self, event: dict[str, Any]) -> None:
        name = event.get("event")
        if name == "progress" and self.tty:
            self.out.write(f"\r\x1b[K{progress_bar(event['data'])}")
            self.out.flush()
            self.bar_shown = True
            return
        if name == "progress":
            line = f"{clock(event['at'])} progress {progress_text(event['data'])}"
        elif name == "agent-note":
            dropped = event["data"].get("dropped")
            more = f" ({dropped} notes dropped so far)" if dropped else ""
            text = printable(event["data"].get("text"))
            line = f"{clock(event['at'])} note {printable(event.get('op_id'))}: {text}"
            line += more
        else:
            line = self.render(event)
        self.line(line)

    def line(self, text: str) -> None:
        """A whole line, below a bar that stays as it was last drawn."""
        self.end_bar()
        self.out.write(text + "\n")
        self.out.flush()

    def end_bar(self) -> None:
        if self.bar_shown:
            self.out.write("\n")
            self.bar_shown = False


def progress_lines(progress: dict[str, dict[str, Any]]) -> list[str]:
    """``cairn show``: the latest report of each phase."""
    return [
        f"progress: {progress_text(data)} at {clock(data['at'])}"
        for _phase, data in sorted(progress.items())
    ]
