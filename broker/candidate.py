"""The owner's candidate unit (``cairn.worker.candidate``), as root starts it: the
settlement's candidate (C = Q + the allowed changes of P) and a trial's check (the same
judgement over a measured W, nothing built). Root hands it the kernel's account of the
changes (the record of a tree search, else a send stream) and the frozen policy and never
reads what the agent wrote; it parses a candidate's result
at the edge (it acts on it) and records a trial's unparsed."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from cairn import storage, treesearch, untrusted
from cairn.broker import units
from cairn.errors import BrokerRefused, StorageError, SystemdError
from cairn.protocol.broker import RawBytes, SubvolumeReceipt, TrialChecked
from cairn.protocol.launch import LaunchDescription
from cairn.protocol.settlement import CandidateFailure, CandidateResult
from cairn.unitprops import HelperUnitSpec
from cairn.validation import first_error

log = logging.getLogger(__name__)

CANDIDATE_TIMEOUT = 3600.0


def trial_unit_name(run_id: str, op_id: str, attempt: int) -> str:
    return f"cairn-trial-{run_id}-{op_id}-{attempt}.service"


def candidate_unit_name(run_id: str) -> str:
    return f"cairn-candidate-{run_id}.service"


ChangeSource = tuple[Literal["record", "stream"], bytes]


def change_source(q: Path, p: Path) -> ChangeSource:
    """How read-only ``p`` differs from read-only ``q``, as the kernel tells it: the
    record of a tree search by generation (:mod:`cairn.treesearch`) where ``p`` descends
    from ``q`` by snapshots, else ``btrfs send --no-data``. Root passes either on
    unparsed."""
    record = treesearch.change_record(q, p)
    if record is not None:
        return "record", record
    return "stream", storage.metadata_stream(q, p)


def _stage_candidate_work(desc: LaunchDescription, work: Path, source: ChangeSource) -> None:
    """The candidate unit's ``work`` directory with the kernel's account of the changes
    and the frozen policy. work/ is the owner's: whatever an earlier attempt left is
    replaced, never written through."""
    work.mkdir(parents=True, exist_ok=True)
    os.chown(work, desc.owner_uid, desc.owner_gid)
    owner = {"uid": desc.owner_uid, "gid": desc.owner_gid}
    kind, data = source
    for stale in ("record", "stream", "result.json", "failure.json"):
        untrusted.remove(work, stale)
    untrusted.write_new(work, kind, data, mode=0o644, **owner)
    policy = desc.policy.model_dump_json().encode()
    untrusted.write_new(work, "policy.json", policy, mode=0o644, **owner)


def _candidate_spec(
    desc: LaunchDescription, what: str, q: Path, p: Path, c: Path | None, subpath: str,
    work: Path,
) -> HelperUnitSpec:
    # --subpath=VALUE: a project directory may be named like an option ("-x")
    argv = ["--q", "/q", "--p", "/p", *(["--c", "/c"] if c else []), f"--subpath={subpath}",
            "--work", "/candidate"]
    return HelperUnitSpec(
        description=f"Cairn {what} of run {desc.run_id}",
        uid=desc.owner_uid,
        gid=desc.owner_gid,
        exec_argv=units.module_argv("cairn.worker.candidate", *argv),
        binds=[*([(str(c), "/c")] if c else []), (str(work), "/candidate")],
        read_only_binds=[(str(q), "/q"), (str(p), "/p")],
        memory_max=desc.limits.memory_max,
        tasks_max=64,
        cpu_quota_percent=100,
        runtime_max_sec=int(CANDIDATE_TIMEOUT),
        log_fields={"CAIRN_RUN": desc.run_id},
    )


class StreamNeeded(Exception):
    """The unit could not read P by the record: it asked for the send stream."""


def _run_candidate_unit(desc: LaunchDescription, spec: HelperUnitSpec, name: str,
                        work: Path, source: ChangeSource) -> units.HelperUnit:
    """Run the candidate unit; when it fails, say why only from a ``failure.json`` it
    wrote that is one (``StreamNeeded`` when it was handed a record and asks for the
    stream)."""
    try:
        return units.run_helper(spec, name, CANDIDATE_TIMEOUT)
    except SystemdError as exc:
        try:
            raw = untrusted.read_bytes(work, "failure.json", owner=desc.owner_uid, limit=16384)
            failure = CandidateFailure.model_validate_json(raw, strict=True)
        except (untrusted.UntrustedFileError, ValidationError):
            raise exc from None
        if failure.send_stream and source[0] == "record":
            raise StreamNeeded from None
        raise StorageError(failure.message, hint=failure.hint or exc.hint) from None


def _run_with_source(desc: LaunchDescription, spec: HelperUnitSpec, name: str, work: Path,
                     q: Path, p: Path, source: ChangeSource) -> units.HelperUnit:
    """Stage ``work`` and run the unit; once more with ``btrfs send``'s stream when it
    could not read P by the tree search's record (the owner asks: it costs only time).
    For a unit that writes nothing but its result (a trial's check)."""
    _stage_candidate_work(desc, work, source)
    try:
        return _run_candidate_unit(desc, spec, name, work, source)
    except StreamNeeded:
        log.info("%s could not read P by the record; handing it the send stream", name)
    source = ("stream", storage.metadata_stream(q, p))
    _stage_candidate_work(desc, work, source)
    return _run_candidate_unit(desc, spec, name, work, source)


def discard_c(pool: storage.Pool, c: Path, receipt: SubvolumeReceipt) -> None:
    """Delete a C no receipt will name (a failed build): else it would be a subvolume
    nothing explains."""
    try:
        pool.delete(c, receipt)
    except Exception:
        log.exception("could not remove %s of a failed candidate", c)


def build_c(desc: LaunchDescription, pool: storage.Pool, qpc: tuple[Path, Path, Path],
            qgroup: int | None, subpath: str, source: ChangeSource, work: Path,
            ) -> tuple[units.HelperUnit, CandidateResult, SubvolumeReceipt]:
    """C made a fresh writable snapshot of Q and brought up by the owner's unit
    (:func:`run_candidate`); when the unit asks for the send stream instead of the
    record, C is made afresh for the second run, never one a unit may have half changed.
    A C that fails is deleted; returns the unit, its report and C's receipt."""
    q, p, c = qpc
    c_receipt = pool.snapshot(q, c, read_only=False, qgroup=qgroup)
    try:
        try:
            unit, result = run_candidate(desc, q, p, c, subpath, source, work)
        except StreamNeeded:
            log.info("candidate unit of %s could not read P by the record; handing it "
                     "the send stream", desc.run_id)
            pool.delete(c, c_receipt)
            c_receipt = pool.snapshot(q, c, read_only=False, qgroup=qgroup)
            stream: ChangeSource = ("stream", storage.metadata_stream(q, p))
            unit, result = run_candidate(desc, q, p, c, subpath, stream, work)
    except BaseException:
        discard_c(pool, c, c_receipt)
        raise
    return unit, result, c_receipt


def run_candidate(
    desc: LaunchDescription, q: Path, p: Path, c: Path, subpath: str, source: ChangeSource,
    work: Path,
) -> tuple[units.HelperUnit, CandidateResult]:
    """Bring C (a fresh writable snapshot of Q) to Q plus the allowed changes of P in a
    unit that runs as the project's owner, so root never copies what the agent wrote; give
    it the kernel's account of the changes and the frozen policy; return the unit's name
    and invocation ID, and its checked report. ``StreamNeeded``: the unit asks for the
    send stream instead of the record (:func:`build_c` makes C afresh for it)."""
    name = candidate_unit_name(desc.run_id)
    spec = _candidate_spec(desc, "candidate", q, p, c, subpath, work)
    _stage_candidate_work(desc, work, source)
    unit = _run_candidate_unit(desc, spec, name, work, source)
    raw = untrusted.read_bytes(work, "result.json", owner=desc.owner_uid, limit=units.RESULT_LIMIT)
    try:
        return unit, CandidateResult.model_validate_json(raw, strict=True)
    except ValidationError as exc:
        where, message = first_error(exc)
        raise BrokerRefused(f"{name} wrote an invalid result: {where}: {message}") from None


def run_trial_check(
    desc: LaunchDescription, q: Path, trial: Path, subpath: str, source: ChangeSource,
    work: Path, name: str,
) -> TrialChecked:
    """Judge the changes of ``trial`` (a read-only snapshot of a measured W) since Q as
    the settlement would, in the candidate unit without C, as the project's owner; its
    result is recorded unparsed (root does not act on it: the coordinator does)."""
    spec = _candidate_spec(desc, "trial check", q, trial, None, subpath, work)
    unit = _run_with_source(desc, spec, name, work, q, trial, source)
    raw = untrusted.read_bytes(work, "result.json", owner=desc.owner_uid,
                               limit=units.RAW_RESULT_LIMIT)
    return TrialChecked(**unit, result_raw=RawBytes.of(raw))
