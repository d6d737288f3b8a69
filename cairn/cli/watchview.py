"""Following a run (``cairn watch``, ``cairn launch --watch``) and how it and ``cairn
show`` render events, progress and agent notes: a progress bar redrawn in place on a
terminal, one plain line per report otherwise."""

from __future__ import annotations

import datetime
import json
import sys
import time
from collections.abc import Callable, Mapping
from typing import NoReturn, TextIO

import click

from cairn.cli.client import object_or_empty, request, typed
from cairn.cli.options import render_waiting
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


def _as_int(value: object) -> int:
    """``int()`` of a number cairnd sent (a progress count, a cursor)."""
    if isinstance(value, (int, float, str)):
        return int(value)
    raise TypeError(f"{value!r} is not a number")


def _fraction(data: Mapping[str, object]) -> float | None:
    total = data.get("total")
    if not isinstance(total, int) or total <= 0:
        return None
    return min(1.0, max(0, _as_int(data.get("done", 0))) / total)


def progress_text(data: Mapping[str, object]) -> str:
    """``import 41200/100000 entries (41%), 12.0 MiB/40.0 MiB``."""
    phase = printable(data.get("phase", "?"))
    done, total = printable(data.get("done", 0)), data.get("total")
    text = f"{phase} {done}" + (f"/{printable(total)}" if total is not None else "")
    text += f" {UNITS.get(phase, 'items')}"
    fraction = _fraction(data)
    if fraction is not None:
        text += f" ({fraction:.0%})"
    if data.get("bytes_total"):
        done_bytes, total_bytes = _as_int(data.get("bytes_done", 0)), _as_int(data["bytes_total"])
        text += f", {_size(done_bytes)}/{_size(total_bytes)}"
    return text


def progress_bar(data: Mapping[str, object], width: int = BAR_WIDTH) -> str:
    """``[#########.....................] import 41200/100000 entries (41%), …``."""
    fraction = _fraction(data) or 0.0
    filled = int(fraction * width)
    return f"[{'#' * filled}{'.' * (width - filled)}] {progress_text(data)}"


def clock(at: object) -> str:
    """``HH:MM:SS`` of ``at``, seconds since the epoch as cairnd sends them."""
    if not isinstance(at, (int, float)):
        raise TypeError(f"a moment is a number of seconds, not {at!r}")
    return datetime.datetime.fromtimestamp(at).strftime("%H:%M:%S")


class EventPrinter:
    """Print watch events to ``out``: progress as a bar redrawn in place when ``tty``,
    otherwise (and every other event) as lines; ``render`` renders the other events."""

    def __init__(
        self, out: TextIO, *, tty: bool, render: Callable[[Mapping[str, object]], str]
    ) -> None:
        self.out = out
        self.tty = tty
        self.render = render
        self.bar_shown = False

    def event(self, event: Mapping[str, object]) -> None:
        name = event.get("event")
        data = object_or_empty(event.get("data"))
        if name == "progress" and self.tty:
            self.out.write(f"\r\x1b[K{progress_bar(data)}")
            self.out.flush()
            self.bar_shown = True
            return
        if name == "progress":
            line = f"{clock(event['at'])} progress {progress_text(data)}"
        elif name == "agent-note":
            dropped = data.get("dropped")
            more = f" ({dropped} notes dropped so far)" if dropped else ""
            text = printable(data.get("text"))
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


def progress_lines(progress: Mapping[str, Mapping[str, object]]) -> list[str]:
    """``cairn show``: the latest report of each phase."""
    return [
        f"progress: {progress_text(data)} at {clock(data['at'])}"
        for _phase, data in sorted(progress.items())
    ]


def follow(
    run_id: str, *, interval: float = 1.0, json_out: bool = False, events: bool = True
) -> NoReturn:
    """Print the run's events from its start and as they come (polling cairnd every
    ``interval`` seconds; without ``events`` none of them), what it waits for, and one
    line when it ends; exit 0 when it succeeded, 1 when it ended otherwise, 130 on
    Ctrl-C."""
    from cairn.protocol.daemon import WatchRequest
    from cairn.protocol.run_replies import WatchReply

    cursor = 0
    shown_waiting: list[Mapping[str, object]] = []
    out = EventPrinter(sys.stdout, tty=sys.stdout.isatty() and not json_out, render=render_event)
    try:
        while True:
            polled = time.monotonic()
            data = typed(WatchReply, request(WatchRequest(run_id=run_id, cursor=cursor)))
            run_id = data.run_id  # a prefix or @last names this run from now on
            for event in data.events if events else ():
                if json_out:
                    out.line(json.dumps(event))
                else:
                    out.event(event)
            cursor = data.cursor
            if data.more:
                continue
            waiting: list[Mapping[str, object]] = [w.model_dump(mode="json") for w in data.waiting]
            if waiting != shown_waiting:
                shown_waiting = waiting
                for item in shown_waiting:
                    out.line(f"waiting: {render_waiting(run_id, item)}")
            if data.finished:
                out.line(completion_line(data.model_dump(mode="json")))
                raise click.exceptions.Exit(0 if data.state == "succeeded" else 1)
            time.sleep(max(0.0, interval - (time.monotonic() - polled)))  # keep the cadence
    except KeyboardInterrupt:
        raise click.exceptions.Exit(130) from None


def render_event(event: Mapping[str, object]) -> str:
    at = clock(event["at"])
    where = f" {printable(event['op_id'])}" if event.get("op_id") else ""
    fields = object_or_empty(event["data"])
    data = " ".join(f"{printable(k)}={printable(fields[k])}" for k in sorted(fields))
    return f"{at} {printable(event['event'])}{where}" + (f" {data}" if data else "")


def completion_line(data: Mapping[str, object]) -> str:
    line = f"{data['run_id']} {data['state']}"
    if data.get("error"):
        line += f": {printable(data['error'])}"
    elif data.get("output") is not None:
        line += f": {json.dumps(data['output'], sort_keys=True)}"
    return line
