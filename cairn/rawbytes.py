"""What root recorded as raw bytes (:class:`cairn.protocol.broker.RawBytes`: a helper
unit's output, written as the run's owner), read on cairn's side: the size and sha256
checked, then decoded or parsed here, never by root
(/usr/share/doc/cairn/docs/architecture.md, *Root trust*).

A receipt from before root recorded raw bytes holds root's own parse; each reader here
takes either shape.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import TypedDict, TypeVar

from pydantic import BaseModel, ValidationError

from cairn.errors import CairnError
from cairn.protocol.broker import (
    RAW_LIMIT,
    AppliedChecked,
    ApplyDone,
    CheckResult,
    MeasurementTaken,
    ProposalVerified,
    QPrepared,
    RawBytes,
)
from cairn.protocol.importstats import ImportStats
from cairn.protocol.jsonvalue import JSONObject
from cairn.protocol.settlement import AppliedCheck, ApplyResult, TrialCheck
from cairn.validation import first_error

M = TypeVar("M", bound=BaseModel)


class InvalidRecordedBytes(CairnError):
    """Bytes a receipt records do not match their hash, or do not parse as what they
    should be."""

    code = "invalid-receipt"


def raw_bytes(raw: RawBytes, what: str) -> bytes:
    """The recorded bytes, if they are what root hashed."""
    try:
        data = base64.b64decode(raw.b64, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRecordedBytes(f"{what}: the receipt's bytes are not base64") from None
    if len(data) != raw.size or len(data) > RAW_LIMIT:
        raise InvalidRecordedBytes(
            f"{what}: the receipt records {raw.size} bytes but holds {len(data)}"
        )
    if hashlib.sha256(data).hexdigest() != raw.sha256:
        raise InvalidRecordedBytes(
            f"{what}: the receipt's bytes do not match their sha256",
            hint="the broker's receipts database (/var/lib/cairn/broker/receipts.db) has them",
        )
    return data


def raw_text(raw: RawBytes, what: str) -> str:
    """The recorded bytes as text: what a command printed may be any bytes, so an
    invalid UTF-8 sequence becomes U+FFFD (control characters stay; whoever shows the text
    escapes them, :func:`cairn.terminal.printable`)."""
    return raw_bytes(raw, what).decode("utf-8", errors="replace")


def raw_model(raw: RawBytes, model: type[M], what: str) -> M:
    """The recorded bytes parsed as strict JSON of ``model`` (UTF-8, bounded depth, no
    coercion); refused with the first problem otherwise."""
    data = raw_bytes(raw, what)
    if raw.truncated:
        raise InvalidRecordedBytes(f"{what}: only the last {raw.size} bytes were recorded")
    try:
        return model.model_validate_json(data, strict=True)
    except ValidationError as exc:
        where, message = first_error(exc)
        at = f"{where}: " if where else ""
        raise InvalidRecordedBytes(
            f"{what} is not a valid {model.__name__}: {at}{message}"
        ) from None


def check_output(check: CheckResult) -> str:
    """The last of what a host check printed."""
    if check.output_raw is None:
        return check.output  # recorded before root kept the bytes
    return raw_text(check.output_raw, f"the output of check {check.name}")


class ReadableVerification(TypedDict):
    """A verify-proposal receipt as :func:`readable_verification` makes it readable."""

    checks: list[JSONObject]
    passed: bool


def readable_verification(verified: ProposalVerified) -> ReadableVerification:
    """A verify-proposal receipt as the settlement records it: each check with its
    output as text (``output``), as ``cairn show`` and ``cairn diff`` read it."""
    checks: list[JSONObject] = []
    for check in verified.checks:
        fields = check.model_dump(mode="json", exclude={"output_raw"})
        checks.append({**fields, "output": check_output(check)})
    return {"checks": checks, "passed": verified.passed}


def measurement_error(taken: MeasurementTaken) -> str:
    """Why a measurement has no samples, with the end of the failed run's output."""
    if taken.output_raw is None:
        return taken.error  # recorded before root kept the bytes: the output is in it
    output = raw_text(taken.output_raw, f"the evaluator output of {taken.op_id}")
    return f"{taken.error}; its output ends:\n{output}"


def trial_check(taken: MeasurementTaken) -> TrialCheck | None:
    """What the check of a measured W found the settlement would refuse; None for a
    measurement without samples or recorded before W was checked."""
    if taken.trial is None:
        return None
    return raw_model(taken.trial.result_raw, TrialCheck, f"the result of {taken.trial.unit}")


def apply_result(done: ApplyDone) -> ApplyResult:
    """What an apply unit reported: parsed by root for an apply, recorded as bytes for a
    revert."""
    if done.result_raw is None:
        if done.result is None:
            raise InvalidRecordedBytes(f"the receipt of {done.unit} records no result")
        return done.result
    return raw_model(done.result_raw, ApplyResult, f"the result of {done.unit}")


def applied_check(done: AppliedChecked) -> AppliedCheck:
    """What a check-applied unit found in the live project."""
    if done.result_raw is None:
        if done.result is None:
            raise InvalidRecordedBytes(f"the receipt of {done.unit} records no result")
        return done.result
    return raw_model(done.result_raw, AppliedCheck, f"the result of {done.unit}")


def import_stats(prepared: QPrepared) -> ImportStats | None:
    """What the import unit of an imported Q counted; None for a snapshotted Q."""
    done = prepared.import_
    if done is None:
        return None
    if done.stats_raw is None:
        return ImportStats.model_validate(done.stats or {})
    return raw_model(done.stats_raw, ImportStats, f"the statistics of {done.unit}")
