"""The candidate step: ``python3 -I -m cairn.worker.candidate --q Q --p P [--c C]
--subpath S --work DIR``.

Runs in ``cairn-candidate-<run>.service`` as the project owner, with Q and P (whole
subvolumes) read-only and C writable, so no file the agent wrote is ever copied by root.
Reads the kernel's account of how P differs from Q, handed over by the broker (``record``,
a tree search's record, :mod:`cairn.settle.generations`; else ``stream``, a ``btrfs send
--no-data -p Q P``) and ``policy.json`` from DIR, brings C to Q plus the changes of P that
policy allows, and writes ``result.json`` (what root reads as a
:class:`cairn.protocol.settlement.CandidateResult`): exit 0. When C cannot be built it
writes ``failure.json`` (why, and what to do: a ``CandidateFailure``; with ``send_stream``
when the record cannot be read and root is to hand over the stream) and exits 1. It
loads no pydantic (/usr/share/doc/cairn/docs/decisions/helpers-without-pydantic.md).

Without ``--c`` it is a trial's check (``cairn-trial-<run>-<op>-<attempt>.service``, P a
read-only snapshot of the measured W): the same judgement, nothing built, and
``result.json`` is a :class:`cairn.protocol.settlement.TrialCheck`, the first of the
changes the settlement would refuse and how many there are.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import TypedDict, final

from cairn import journald
from cairn.errors import CairnError
from cairn.fsutil import write_atomic
from cairn.protocol.limits import TEXT_LIMIT, TRIAL_REFUSED_SHOWN
from cairn.settle.candidate import Refused, build_candidate, check_proposal
from cairn.settle.changes import ChangeSet, changes_in
from cairn.settle.diff import unified_diff
from cairn.settle.generations import Unlistable, changes_from_record
from cairn.settle.inventory import inventories_equal
from cairn.settle.paths import SettlementPolicy

log = logging.getLogger(__name__)


class RefusedJSON(TypedDict):
    path: str
    reason: str


@final
class CandidateResultJSON(TypedDict):
    """``result.json`` of a build, as root reads it (a ``CandidateResult``)."""

    accepted: list[str]
    refused: list[RefusedJSON]
    ignored: list[str]
    bytes_accepted: int
    inventories_equal: bool
    diff: str


@final
class TrialCheckJSON(TypedDict):
    """``result.json`` of a trial's check, as root reads it (a ``TrialCheck``)."""

    refused: list[RefusedJSON]
    refused_count: int


def _refused_json(refused: Refused) -> RefusedJSON:
    return {"path": refused.path, "reason": refused.reason}


def read_changes(q: Path, p: Path, subpath: str, work: Path) -> ChangeSet:
    """The change set from the record root left in ``work``, else from its send stream."""
    try:
        record = (work / "record").read_bytes()
    except FileNotFoundError:
        log.info("changes from btrfs send")
        return changes_in((work / "stream").read_bytes(), q, p, subpath=subpath)
    log.info("changes from a tree search")
    return changes_from_record(record, q, p, subpath=subpath)


def build(q: Path, p: Path, c: Path, subpath: str, work: Path) -> CandidateResultJSON:
    """C from P under the policy in ``work``; the report, inventory check and diff, as
    ``result.json`` holds them."""
    policy = SettlementPolicy.from_json((work / "policy.json").read_bytes())
    started = time.monotonic()
    change_set = read_changes(q, p, subpath, work)
    parsed = time.monotonic()

    def view(root: Path) -> Path:
        return root / subpath if subpath else root

    report = build_candidate(view(q), view(p), view(c), change_set, policy)
    built = time.monotonic()
    result: CandidateResultJSON = {
        "accepted": list(report.accepted),
        "refused": [_refused_json(r) for r in report.refused],
        "ignored": list(report.ignored),
        "bytes_accepted": report.bytes_accepted,
        "inventories_equal": (
            inventories_equal(q, p, subpath, policy.ignore) if not report.accepted else False
        ),
        "diff": unified_diff(q, c, subpath, report.accepted),
    }
    log.info("candidate times: changes %.1f s, C built %.1f s, patch and checks %.1f s",
             parsed - started, built - parsed, time.monotonic() - built)
    return result


def check(q: Path, p: Path, subpath: str, work: Path) -> TrialCheckJSON:
    """What of P's changes since Q the settlement would refuse, as ``result.json`` of a
    trial's check holds it."""
    policy = SettlementPolicy.from_json((work / "policy.json").read_bytes())
    change_set = read_changes(q, p, subpath, work)

    def view(root: Path) -> Path:
        return root / subpath if subpath else root

    report = check_proposal(view(q), view(p), change_set, policy)
    return {"refused": [_refused_json(r) for r in report.refused[:TRIAL_REFUSED_SHOWN]],
            "refused_count": len(report.refused)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="cairn.worker.candidate", description=__doc__)
    parser.add_argument("--q", type=Path, required=True, help="the run's start snapshot")
    parser.add_argument("--p", type=Path, required=True, help="the agent's proposal")
    parser.add_argument("--c", type=Path, help="the candidate to bring up (none: a check)")
    parser.add_argument("--subpath", default="", help="the project inside the subvolumes")
    parser.add_argument("--work", type=Path, required=True, help="stream, policy, results")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    journald.setup_logging()
    try:
        result = (check(args.q, args.p, args.subpath, args.work) if args.c is None
                  else build(args.q, args.p, args.c, args.subpath, args.work))
    except (CairnError, OSError) as exc:
        failure: dict[str, str | bool] = (
            {"message": exc.message[:TEXT_LIMIT], "hint": (exc.hint or "")[:TEXT_LIMIT]}
            if isinstance(exc, CairnError)
            else {"message": f"cannot build the candidate: {exc}"[:TEXT_LIMIT], "hint": ""}
        )
        if isinstance(exc, Unlistable):
            failure["send_stream"] = True
        write_atomic(args.work / "failure.json", json.dumps(failure) + "\n")
        print(f"cairn.worker.candidate: {failure['message']}", file=sys.stderr)
        return 1
    write_atomic(args.work / "result.json", json.dumps(result) + "\n")
    if "refused_count" in result:
        log.info("trial check: %d refused", result["refused_count"])
    else:
        log.info("candidate: %d accepted, %d refused", len(result["accepted"]),
                 len(result["refused"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
