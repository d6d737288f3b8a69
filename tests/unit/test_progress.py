"""Progress reports and agent notes on their way from untrusted helpers to the journal,
and how ``cairn watch`` / ``cairn show`` render them. Time is injected everywhere."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from cairn.cli.watchview import EventPrinter, progress_bar, progress_lines, progress_text
from cairn.importer import Progress, copy_tree, count_tree
from cairn.progress import PROGRESS_FILE, ProgressWriter, Throttle
from cairn.progress_relay import (
    NOTE_LIMIT,
    REPORT_LIMIT,
    NoteGate,
    ProgressRelay,
    prepare_progress_dir,
    read_report,
)
from cairn.protocol.progress import ProgressReport

ME = os.geteuid()


class FakeClock:
    def __init__(self, step: float = 0.0) -> None:
        self.now = 1000.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_a_report_is_bounded_and_closed() -> None:
    assert ProgressReport(done=3, total=10).event_data("import") == {
        "phase": "import", "done": 3, "total": 10, "bytes_done": 0, "bytes_total": None
    }
    for bad in (
        {"done": -1},
        {"done": 1 << 60},
        {"done": 1, "phase": "apply"},  # the reader names the phase, never the file
        {"done": 1, "event": "run-succeeded"},
        {"done": "many"},
    ):
        with pytest.raises(ValidationError):
            ProgressReport.model_validate(bad)


def test_throttle_passes_once_per_interval() -> None:
    clock = FakeClock()
    throttle = Throttle(0.5, clock)
    assert throttle.ready()
    clock.now += 0.2
    assert not throttle.ready()
    clock.now += 0.3
    assert throttle.ready()
    assert not throttle.ready()


def test_the_writer_replaces_the_file_at_most_every_interval(tmp_path: Path) -> None:
    clock = FakeClock()
    writer = ProgressWriter(tmp_path, interval=0.5, clock=clock)
    written = []
    for i in range(20):  # 20 reports, 0.1 s apart: 2 s
        clock.now += 0.1
        if writer.report(i):
            written.append(i)
    assert written == [0, 5, 10, 15]
    assert read_report(tmp_path, ME) == ProgressReport(done=15)
    writer.final(20, 20)
    assert read_report(tmp_path, ME) == ProgressReport(done=20, total=20)
    assert sorted(os.listdir(tmp_path)) == [PROGRESS_FILE]  # no temporary file left


def test_read_report_refuses_links_junk_and_size(tmp_path: Path) -> None:
    assert read_report(tmp_path, ME) is None
    target = tmp_path / "elsewhere.json"
    target.write_text(ProgressReport(done=1).model_dump_json())
    (tmp_path / PROGRESS_FILE).symlink_to(target)
    assert read_report(tmp_path, ME) is None
    (tmp_path / PROGRESS_FILE).unlink()
    (tmp_path / PROGRESS_FILE).write_text('{"done": 1, "text": "x"}')
    assert read_report(tmp_path, ME) is None
    (tmp_path / PROGRESS_FILE).write_text('{"done": 1' + " " * REPORT_LIMIT + "}")
    assert read_report(tmp_path, ME) is None
    (tmp_path / PROGRESS_FILE).write_text('{"done": 1}')
    assert read_report(tmp_path, ME) == ProgressReport(done=1)
    assert read_report(tmp_path, ME + 1) is None  # another owner's file


def test_prepare_progress_dir_starts_empty_and_never_follows_a_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("k")
    first = prepare_progress_dir(tmp_path / "state", "import")
    (first / PROGRESS_FILE).write_text('{"done": 9}')
    (first / "link").symlink_to(outside)
    (first / "sub").mkdir()
    again = prepare_progress_dir(tmp_path / "state", "import")
    assert again == first and os.listdir(again) == []
    assert (outside / "keep").read_text() == "k"
    assert oct(again.stat().st_mode & 0o777) == oct(0o777)


def test_the_relay_records_changes_at_most_every_interval(tmp_path: Path) -> None:
    clock = FakeClock()
    recorded: list[dict[str, Any]] = []
    relay = ProgressRelay(tmp_path, "import", ME, recorded.append, interval=0.5, clock=clock)
    assert not relay.check()  # nothing written yet
    (tmp_path / PROGRESS_FILE).write_text('{"done": 1, "total": 4}')
    assert relay.check()
    assert not relay.check()  # unchanged
    (tmp_path / PROGRESS_FILE).write_text('{"done": 2, "total": 4}')
    clock.now += 0.1
    assert not relay.check()  # changed, but too soon
    clock.now += 0.5
    assert relay.check()
    (tmp_path / PROGRESS_FILE).write_text('{"done": 4, "total": 4}')
    assert relay.check(force=True)  # the last report when the helper is done
    assert [r["done"] for r in recorded] == [1, 2, 4]
    assert {r["phase"] for r in recorded} == {"import"}


def test_the_relay_as_context_records_the_final_report(tmp_path: Path) -> None:
    recorded: list[dict[str, Any]] = []
    (tmp_path / PROGRESS_FILE).write_text('{"done": 7, "total": 7}')
    with ProgressRelay(tmp_path, "apply", ME, recorded.append, poll=3600):
        pass
    assert recorded == [
        {"phase": "apply", "done": 7, "total": 7, "bytes_done": 0, "bytes_total": None}
    ]


def test_notes_are_cut_to_size_and_rate_limited() -> None:
    clock = FakeClock()
    gate = NoteGate(rate=2.0, burst=3, clock=clock)
    admitted = [gate.admit(f"n{i}") for i in range(5)]
    assert admitted == ["n0", "n1", "n2", None, None] and gate.dropped == 2
    clock.now += 0.5  # one token back
    assert gate.admit("later") == "later"
    assert gate.admit("too soon") is None
    clock.now += 10
    long = gate.admit("x" * (NOTE_LIMIT * 3))
    assert long is not None and len(long) == NOTE_LIMIT and long.endswith("…")


def test_import_progress_comes_by_the_clock_with_totals(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "d").mkdir(parents=True)
    dst.mkdir()
    for i in range(40):
        (src / "d" / f"f{i}").write_bytes(b"x" * i)
    os.link(src / "d" / "f3", src / "hard")
    assert count_tree(src) == (42, sum(range(40)))
    clock = FakeClock(step=0.05)  # every read of the clock: 50 ms later
    seen: list[Progress] = []
    stats = copy_tree(src, dst, progress=seen.append, interval=0.5, clock=clock)
    assert len(seen) >= 4
    assert all(r.total == 42 and r.bytes_total == sum(range(40)) for r in seen)
    assert [r.done for r in seen] == sorted(r.done for r in seen)
    assert seen[-1].done == 42 and seen[-1].bytes_done == stats.bytes
    # one clock read per entry, so at 50 ms per entry a report every 10 entries at most
    gaps = [b.done - a.done for a, b in zip(seen, seen[1:-1], strict=False)]
    assert gaps and all(gap >= 10 for gap in gaps)


def test_progress_renders_as_text_and_bar() -> None:
    data = {"phase": "import", "done": 25, "total": 100, "bytes_done": 1 << 20,
            "bytes_total": 4 << 20}
    assert progress_text(data) == "import 25/100 entries (25%), 1.0 MiB/4.0 MiB"
    assert progress_bar(data, width=8) == "[##......] " + progress_text(data)
    assert progress_text({"phase": "apply", "done": 3, "total": None}) == "apply 3 paths"
    lines = progress_lines({"import": {**data, "at": 0.0}})
    assert len(lines) == 1 and lines[0].startswith("progress: import 25/100")


def _event(name: str, data: dict[str, Any], op_id: str | None = None) -> dict[str, Any]:
    return {"event": name, "data": data, "op_id": op_id, "at": 0.0, "cursor": 1}


def test_watch_draws_a_bar_on_a_terminal_and_lines_otherwise() -> None:
    events = [
        _event("progress", {"phase": "import", "done": 1, "total": 4}),
        _event("progress", {"phase": "import", "done": 4, "total": 4}),
        _event("agent-note", {"text": "reading \x1b[2Jsrc", "dropped": 0}, "op_1"),
    ]
    tty, plain = io.StringIO(), io.StringIO()
    for out, is_tty in ((tty, True), (plain, False)):
        printer = EventPrinter(out, tty=is_tty, render=json.dumps)
        for event in events:
            printer.event(event)
        printer.line("done")
    assert tty.getvalue().count("\r\x1b[K[") == 2
    assert "] import 4/4 entries (100%)\n" in tty.getvalue()
    lines = plain.getvalue().splitlines()
    assert "\r" not in plain.getvalue() and len(lines) == 4
    assert lines[0].endswith("progress import 1/4 entries (25%)")
    assert lines[2].endswith("note op_1: reading \\x1b[2Jsrc")  # shown escaped, as text
    assert lines[3] == "done"


def test_show_finds_the_latest_report_of_each_phase(tmp_path: Path) -> None:
    from cairn.journal.readwrite import Journal

    journal = Journal(tmp_path / "journal.db", create=True, clock=FakeClock(step=1.0))
    run, other = "flow_" + "a" * 32, "flow_" + "b" * 32
    for done in (1, 2, 3):
        journal.append_event(run, "progress", ProgressReport(done=done).event_data("import"))
    journal.append_event(run, "agent-note", {"text": "between"})
    journal.append_event(run, "progress", ProgressReport(done=5).event_data("apply"))
    journal.append_event(other, "progress", ProgressReport(done=99).event_data("import"))
    latest = journal.latest_progress(run)
    assert sorted(latest) == ["apply", "import"]
    assert latest["import"].data["done"] == 3 and latest["apply"].data["done"] == 5
    assert journal.latest_progress("flow_" + "c" * 32) == {}


def test_the_broker_binds_only_the_coordinators_progress_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if ME != 0:
        pytest.skip("needs root to make a directory of another owner")
    from cairn.broker.units import progress_bind

    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    run = "flow_" + "d" * 32
    runs = tmp_path / "var/lib/cairn/runs"
    assert progress_bind(run, "import") == []  # the coordinator prepared none
    directory = prepare_progress_dir(runs / run, "import")
    assert progress_bind(run, "import") == [(str(directory), "/progress")]
    os.chown(directory, 65534, 65534)  # not the coordinator's (nor root's)
    assert progress_bind(run, "import") == []
    directory.rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    directory.symlink_to(elsewhere)  # a link is never followed into a bind
    assert progress_bind(run, "import") == []
    directory.unlink()
    (runs / "other").mkdir()
    (runs / run).rename(runs / "other" / run)
    (runs / run).symlink_to(runs / "other" / run)  # nor a link above it
    prepare_progress_dir(runs / "other" / run, "apply")
    assert progress_bind(run, "apply") == []


def test_the_agent_socket_keeps_only_admitted_notes_and_at_most_max_notes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pydantic import BaseModel

    from cairn.coordinator import agentsock
    from cairn.protocol.agent import AgentInstruction
    from cairn.protocol.launch import ProfileSpec

    class Out(BaseModel):
        summary: str

    monkeypatch.setattr(agentsock, "MAX_NOTES", 3)
    gate = NoteGate(rate=0.0, burst=4, clock=FakeClock())
    instruction = AgentInstruction(
        run_id="flow_" + "0" * 32, op_id="op-1", attempt=1, prompt="p", title="t",
        descriptor="d", output_schema=Out.model_json_schema(),
        profile=ProfileSpec(name="test:x", kind="scripted"),
    )
    sock = agentsock.AgentSocket(
        tmp_path / "op-1.sock", owner_uid=ME, instruction=instruction, output_model=Out,
        on_note=gate.admit,
    )
    try:
        for i in range(6):
            reply = sock._answer(json.dumps({"type": "note", "text": f"n{i}"}).encode())
            assert reply.ok
        forged = sock._answer(b'{"type": "note", "text": "x", "event": "run-succeeded"}')
        assert not forged.ok and "malformed" in (forged.error or "")
    finally:
        sock.close()
    assert sock.notes == ["n0", "n1", "n2"]  # four admitted, three kept
    assert gate.dropped == 2
