"""Root records what the owner's helper units wrote and it only stores as raw bytes and
their sha256, never parsing them; cairn's side (cairn/rawbytes.py) checks the hash and
parses. What root acts on (an apply's paths, the evidence index, a metric line) it parses
once, strictly, at the edge.

The hostile bytes: oversized, invalid UTF-8, terminal escapes, a JSON bomb, wrong types.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_untrusted import (  # the owner's helper units, faked without systemd
    APPLIED,
    CANDIDATE,
    OWNER,
    RUN,
    desc,
    host,
    no_units,
    owned,
    plant,
    prepared_agent,
    run_candidate,
    short_host,
    start,
    within,
)

from cairn import untrusted
from cairn.broker import units, verbs
from cairn.errors import BrokerRefused
from cairn.importer import Stats
from cairn.protocol.broker import (
    AppliedChecked,
    ApplyDone,
    CheckResult,
    MeasurementTaken,
    ProposalVerified,
    QPrepared,
    RawBytes,
    Receipt,
    TrialChecked,
)
from cairn.protocol.importstats import ImportStats
from cairn.protocol.launch import EvaluatorSpec, LaunchDescription, VerifierSpec
from cairn.protocol.measurement import MeasurementEnvironment
from cairn.rawbytes import (
    InvalidRecordedBytes,
    applied_check,
    apply_result,
    check_output,
    import_stats,
    measurement_error,
    raw_bytes,
    raw_model,
    readable_verification,
    trial_check,
)
from cairn.systemd import UnitState

__all__ = ["desc", "host", "no_units", "short_host"]  # fixtures, used by name

BOMB = b'{"status": "applied", "applied": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
HOSTILE_BYTES = {
    "invalid-utf8": b'{"status": "applied", "applied": ["\xff\xfe"]}',
    "terminal-escapes": b'{"status": "applied", "applied": ["\x1b]0;pwned\x07\x1b[2J"]}',
    "json-bomb": BOMB,
    "wrong-types": b'{"status": "applied", "applied": "a", "conflicts": {"path": 1}}',
    "coerced": b'{"as_applied": ["a"], "reverted": [1]}',
    "not-json": b"\x00\x01 not json at all",
}


def recorded(raw: object) -> bytes:
    assert isinstance(raw, RawBytes)
    data = base64.b64decode(raw.b64, validate=True)
    assert hashlib.sha256(data).hexdigest() == raw.sha256 and len(data) == raw.size
    return data


# --- root records, never parses ------------------------------------------------------


@pytest.mark.parametrize("step", ["revert", "check-applied"])
@pytest.mark.parametrize("kind", sorted(HOSTILE_BYTES))
def test_root_records_a_reverts_and_a_checks_result_as_bytes_unparsed(
    desc: LaunchDescription, host: Path, no_units: list[Callable[[], None]], step: Any,
    kind: str,
) -> None:
    work = host / "scratch" / step
    work.mkdir(parents=True)
    content = HOSTILE_BYTES[kind]
    no_units.append(lambda: write_owned(work, "result.json", content))
    done = units.run_apply(desc, 1, host / "q", host / "f", "", ["a"], work, step=step)
    assert "result" not in done
    body = (ApplyDone if step == "revert" else AppliedChecked).model_validate(done)
    assert recorded(body.result_raw) == content
    reader = apply_result if isinstance(body, ApplyDone) else applied_check
    with pytest.raises(InvalidRecordedBytes, match=r"the result of cairn-.* is not a valid"):
        reader(body)  # type: ignore[arg-type]


def test_a_reverts_result_over_its_bound_is_refused_before_it_is_read(
    desc: LaunchDescription, host: Path, no_units: list[Callable[[], None]]
) -> None:
    work = host / "scratch" / "revert"
    work.mkdir(parents=True)
    no_units.append(lambda: plant(work, "result.json", "oversized", host, json.dumps(APPLIED)))
    with pytest.raises(untrusted.UntrustedFileError, match="larger than"):
        within(5, lambda: units.run_apply(
            desc, 1, host / "q", host / "f", "", ["a"], work, step="revert"))


def test_root_records_the_import_stats_as_bytes_and_cairn_parses_them(
    desc: LaunchDescription, host: Path, no_units: list[Callable[[], None]]
) -> None:
    staging = host / "pool" / "Q.import"
    staging.mkdir(parents=True)
    result = staging.parent / "import-result"
    for content, parsed in ((b'{"files": 3, "skipped": []}', 3), (BOMB, None),
                            (b'{"files": "3"}', None), (b'{"files": 3, "owner": "x"}', None)):
        no_units.clear()
        (result / "stats.json").unlink(missing_ok=True)
        no_units.append(functools.partial(write_owned, result, "stats.json", content))
        done = units.run_import(desc, host / "project", staging)
        assert recorded(done.stats_raw) == content and done.stats is None
        prepared = QPrepared.model_validate(
            {"q": SUBVOLUME, "subpath": "", "imported": True, "project_ino": 1,
             "import": done.model_dump()}
        )
        if parsed is None:
            with pytest.raises(InvalidRecordedBytes, match="statistics of cairn-import-"):
                import_stats(prepared)
        else:
            stats = import_stats(prepared)
            assert stats is not None and stats.files == parsed


def test_import_stats_over_their_bound_are_refused(
    desc: LaunchDescription, host: Path, no_units: list[Callable[[], None]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    staging = host / "pool" / "Q.import"
    staging.mkdir(parents=True)
    result = staging.parent / "import-result"
    monkeypatch.setattr(units, "STATS_LIMIT", 64)
    no_units.append(lambda: write_owned(result, "stats.json", b'{"files": 3}' + b" " * 64))
    with pytest.raises(untrusted.UntrustedFileError, match="larger than 64"):
        units.run_import(desc, host / "project", staging)


def write_owned(directory: Path, name: str, content: bytes) -> None:
    directory.mkdir(exist_ok=True)
    (directory / name).write_bytes(content)
    owned(directory / name, OWNER)


def finished(name: str, result: str = "success", status: int = 0) -> UnitState:
    return UnitState(
        name=name, load_state="loaded", active_state="inactive", sub_state="dead", job_id=0,
        result=result, exec_main_code=1, exec_main_status=status, control_group="",
        invocation_id="0" * 32, main_pid=0,
    )


@pytest.fixture
def printed(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A check's or evaluator's unit without systemd: how it ends and what the journal
    holds of what it printed."""
    said: dict[str, Any] = {"output": b"", "result": "success", "status": 0}

    def run_to_end(spec: Any, name: str, timeout: float, *, sync_journal: bool = False) -> Any:
        return finished(name, said["result"], said["status"])

    monkeypatch.setattr(units, "_run_to_end", run_to_end)
    monkeypatch.setattr(units, "_unit_output", lambda *_a: said["output"])
    # injected time: the wait for journald reads this clock and its pause returns at once
    pause = {"sle" + "ep": lambda _seconds: None}
    clock = SimpleNamespace(time=lambda: 1e9, monotonic=lambda: 0.0, **pause)
    monkeypatch.setattr(units, "time", clock)
    return said


CHECK = VerifierSpec(name="tests", argv=["/usr/bin/make", "test"], timeout_sec=60,
                     config_sha256="a" * 64)
HOSTILE_OUTPUT = (b"\x1b]0;owned\x07\x1b[2J\xff\xfe not UTF-8 \xc3" + BOMB[:4096]
                  + b"\n" + b"x" * (40 << 10) + b"\nFAILED: 3 tests\n")


def test_root_records_a_checks_output_as_its_last_bytes(
    desc: LaunchDescription, printed: dict[str, Any]
) -> None:
    printed.update(output=HOSTILE_OUTPUT, result="exit-code", status=2)
    check = units.run_check(desc, CHECK, Path("/nonexistent"), 1)
    assert not check.passed and check.exit_status == 2 and check.output == ""
    assert recorded(check.output_raw) == HOSTILE_OUTPUT[-(16 << 10):]
    assert check.output_raw is not None and check.output_raw.truncated
    text = check_output(check)  # decoded on cairn's side, escapes left for printable()
    assert text.endswith("FAILED: 3 tests\n")
    verified = ProposalVerified(checks=[check], passed=False)
    settled = readable_verification(verified)
    assert set(settled["checks"][0]) == {"name", "unit", "invocation_id", "passed", "result",
                                         "exit_status", "output"}
    assert settled["checks"][0]["output"] == text


def test_a_check_printing_invalid_utf8_and_escapes_is_recorded_byte_for_byte(
    desc: LaunchDescription, printed: dict[str, Any]
) -> None:
    printed.update(output=b"\x1b[31m\xff\xfe\n")
    check = units.run_check(desc, CHECK, Path("/nonexistent"), 1)
    assert recorded(check.output_raw) == b"\x1b[31m\xff\xfe\n"
    assert check_output(check) == "\x1b[31m\ufffd\ufffd\n"


EVALUATOR = EvaluatorSpec(name="bench", argv=["/usr/bin/bench"], timeout_sec=60, warmups=0,
                          samples=1, config_sha256="a" * 64)


@pytest.mark.parametrize("line", [
    BOMB[:4000],
    b'{"cairn_metrics": ' + b"{" * 1000 + b"}" * 1000 + b"}",
    b'{"cairn_metrics": {"runtime": true}}',
    b'{"cairn_metrics": {"runtime": "1"}}',
    b'{"cairn_metrics": {"\xff": 1}}',
])
def test_an_evaluators_hostile_metric_line_is_no_value_and_no_crash(
    desc: LaunchDescription, printed: dict[str, Any], line: bytes
) -> None:
    printed.update(output=b"noise\x1b[2J\n" + line + b"\n")
    run, output = units.run_evaluator(desc, EVALUATOR, Path("/nonexistent"), "u.service", False)
    assert run.values is None and output == printed["output"]


def test_a_measurement_that_failed_records_the_output_and_cairn_reads_it() -> None:
    tail = b"\x1b[2Jsegfault \xff\n"
    taken = MeasurementTaken(
        op_id="root-3", environment=ENVIRONMENT, runs=[], samples=[],
        error="u.service ended success (status 0) with no metric line",
        output_raw=RawBytes.of(tail),
    )
    receipt = Receipt(intent_id="measure.root-3.1", run_id=RUN, kind="measure-checkpoint",
                      data=taken.wire(), at=1.0)
    assert "segfault" not in json.dumps(receipt.data["error"])  # root's text is its own
    error = measurement_error(receipt.body(MeasurementTaken))
    assert error.endswith("its output ends:\n\x1b[2Jsegfault \ufffd\n")


@pytest.mark.parametrize("written", [
    b'{"refused": [{"path": "/etc/shadow", "reason": "x"}], "refused_count": 1}',
    b'{"refused": [], "refused_count": "1"}',  # no coercion
    b'{"refused": [], "refused_count": 0, "more": 1}',
    b"\x1b[2J",
])
def test_a_trials_check_is_parsed_by_cairn_and_only_if_it_is_one(written: bytes) -> None:
    def taken(raw: RawBytes) -> MeasurementTaken:
        return MeasurementTaken(
            op_id="root-3", environment=ENVIRONMENT, runs=[], samples=[{"s": 1.0}],
            trial=TrialChecked(unit="cairn-trial-x.service", invocation_id="i",
                               result_raw=raw))

    good = b'{"refused": [{"path": "bench.py", "reason": "outside the write paths"}], ' \
        b'"refused_count": 7}'
    checked = trial_check(taken(RawBytes.of(good)))
    assert checked is not None and checked.refused_count == 7
    with pytest.raises(InvalidRecordedBytes, match="the result of cairn-trial-x.service"):
        trial_check(taken(RawBytes.of(written)))
    forged = RawBytes.of(good).model_copy(update={"sha256": "0" * 64})
    with pytest.raises(InvalidRecordedBytes, match="do not match their sha256"):
        trial_check(taken(forged))
    legacy = MeasurementTaken(op_id="root-3", environment=ENVIRONMENT, runs=[], samples=[])
    assert trial_check(legacy) is None and "trial" not in legacy.wire()


# --- the edge: what root acts on is parsed once, strictly ---------------------------------


@pytest.mark.parametrize("content", [
    HOSTILE_BYTES["wrong-types"], HOSTILE_BYTES["json-bomb"], HOSTILE_BYTES["invalid-utf8"],
    b'{"status": "applied", "applied": [], "already_applied": [], "conflicts": [], "x": 1}',
    b'{"status": 1}',
])
def test_an_applys_result_root_acts_on_is_refused_unless_it_is_one(
    desc: LaunchDescription, host: Path, no_units: list[Callable[[], None]], content: bytes
) -> None:
    work = host / "scratch" / "apply"
    work.mkdir(parents=True)
    no_units.append(lambda: write_owned(work, "result.json", content))
    with pytest.raises(BrokerRefused, match=r"cairn-apply-.* wrote an invalid result"):
        units.run_apply(desc, 1, host / "q", host / "f", "", ["a"], work)


def test_a_candidates_result_is_parsed_without_coercion(
    desc: LaunchDescription, host: Path, no_units: list[Callable[[], None]]
) -> None:
    work = host / "scratch" / "candidate"
    work.mkdir(parents=True)
    coerced = json.dumps({**CANDIDATE, "bytes_accepted": "1"}).encode()
    no_units.append(lambda: write_owned(work, "result.json", coerced))
    with pytest.raises(BrokerRefused, match="wrote an invalid result: bytes_accepted"):
        run_candidate(desc, host, work)


def test_check_applied_refuses_an_apply_receipt_without_a_parsed_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Ctx:
        run_id = RUN
        journal = type("J", (), {"get_run": lambda _s, _r: type("R", (), {"state": "failed"})})()

        def receipt(self, _intent: str, model: type[Any]) -> Any:
            return ApplyDone(unit="u", invocation_id="i", result_raw=RawBytes.of(b"{}"))

    with pytest.raises(BrokerRefused, match="records no parsed result"):
        verbs.check_applied(Ctx())  # type: ignore[arg-type]


@pytest.mark.parametrize("index", [
    b'{"incoming": "root-1"}', b'{"incoming": [1]}', b'{"incoming": ["../../etc"]}',
    b'{"incoming": ' + b"[" * 5000 + b"]" * 5000 + b"}", b'{"incoming": ["\xff"]}',
])
def test_start_agent_refuses_an_index_that_is_not_one(
    desc: LaunchDescription, short_host: Path, index: bytes
) -> None:
    evidence, sock = prepared_agent(desc, short_host)
    with sock:
        (evidence / "index.json").unlink(missing_ok=True)
        (evidence / "index.json").write_bytes(index)
        with pytest.raises(BrokerRefused, match=r"index\.json is invalid"):
            within(5, lambda: start(desc, short_host))


# --- cairn's side: the hash, then the parse ------------------------------------------------


def test_bytes_that_do_not_match_their_hash_are_refused() -> None:
    raw = RawBytes.of(b'{"files": 1}')
    with pytest.raises(InvalidRecordedBytes, match="do not match their sha256"):
        raw_bytes(raw.model_copy(update={"b64": base64.b64encode(b'{"files": 9}').decode()}),
                  "x")
    with pytest.raises(InvalidRecordedBytes, match="records 12 bytes but holds 3"):
        raw_bytes(raw.model_copy(update={"b64": base64.b64encode(b"abc").decode()}), "x")
    with pytest.raises(InvalidRecordedBytes, match="not base64"):
        raw_bytes(raw.model_copy(update={"b64": "!!!!"}), "x")
    truncated = RawBytes.of(b'{"files": 1}  ', limit=12)
    assert truncated.truncated and truncated.size == 12
    with pytest.raises(InvalidRecordedBytes, match="only the last 12 bytes"):
        raw_model(truncated, ApplyDone, "x")


def test_receipts_from_before_still_read() -> None:
    legacy_check = CheckResult.model_validate(
        {"name": "t", "unit": "u", "invocation_id": "i", "passed": False, "result": "exit-code",
         "exit_status": 1, "output": "old tail"})
    assert check_output(legacy_check) == "old tail"
    legacy_revert = ApplyDone.model_validate(
        {"unit": "u", "invocation_id": "i", "result": {"status": "noop"}})
    assert apply_result(legacy_revert).status == "noop"
    legacy_check_applied = AppliedChecked.model_validate(
        {"unit": "u", "invocation_id": "i", "result": {"changed": ["a"]}})
    assert applied_check(legacy_check_applied).changed == ["a"]
    legacy_q = QPrepared.model_validate(
        {"q": SUBVOLUME, "subpath": "", "imported": True, "project_ino": 1,
         "import": {"unit": "cairn-import-r.service", "invocation_id": "i",
                    "stats": {"files": 3}}})
    stats = import_stats(legacy_q)
    assert stats is not None and stats.files == 3
    legacy_measure = MeasurementTaken(op_id="root-3", environment=ENVIRONMENT, runs=[],
                                      samples=[], error="ended; its output ends:\nold")
    assert measurement_error(legacy_measure) == "ended; its output ends:\nold"
    assert "output_raw" not in legacy_measure.wire()


SUBVOLUME = {"path": "/p", "subvol_id": 256, "uuid": "u", "fsid": "f", "read_only": True,
             "generation": 1}
ENVIRONMENT = MeasurementEnvironment(evaluator="bench", config_sha256="a" * 64, kernel="6",
                                     cpu="x")


def test_the_importers_stats_stay_below_what_root_records() -> None:
    stats = Stats()
    for i in range(5000):
        stats.skip("\x1b" * 4000 + str(i), "file not readable")
    data = stats.as_json().encode()
    assert len(data) < units.STATS_LIMIT and stats.skipped_count == 5000
    assert 0 < len(stats.skipped) < 5000
    read = ImportStats.model_validate_json(data, strict=True)  # as cairnd reads it
    assert read.skipped_count == 5000 and len(read.skipped) == len(stats.skipped)


def test_a_skipped_name_that_is_not_utf8_is_recorded_as_text() -> None:
    stats = Stats()
    stats.skip(os.fsdecode(b"pipe\xff"), "special file (FIFO)")
    read = ImportStats.model_validate_json(stats.as_json().encode(), strict=True)
    assert [(s.path, s.reason) for s in read.skipped] == [("pipe\\xff", "special file (FIFO)")]
