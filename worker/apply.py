"""The apply step: ``python3 -I -m cairn.worker.apply --q Q --f F --live DIR --plan FILE
--receipts FILE --result FILE``.

Runs in ``cairn-apply-<run>.service`` as the project owner, with Q and F read-only and
the live project read-write. Exit 0 for every outcome (applied, noop, conflict); non-zero
only when the apply itself failed.

With ``--check`` it writes nothing to the live project (bound read-only then, in
``cairn-check-applied-<run>.service`` for ``cairn doctor``): the result says what the live
project holds at each path of the plan and of the receipts file.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict
from pathlib import Path

from cairn import journald
from cairn.errors import CairnError, ValidationFailed
from cairn.fsutil import write_atomic
from cairn.progress import ProgressWriter
from cairn.settle import apply as settle_apply

log = logging.getLogger(__name__)


def read_plan(path: Path) -> list[str]:
    """The paths to apply: root's plan file, a JSON list of strings."""
    try:
        paths = json.loads(path.read_bytes())
    except ValueError as exc:
        raise ValidationFailed(f"{path} is not JSON: {exc}") from None
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise ValidationFailed(f"{path} is not a JSON list of paths")
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cairn.worker.apply", description=__doc__)
    parser.add_argument("--q", type=Path, required=True, help="the run's start snapshot")
    parser.add_argument("--f", type=Path, required=True, help="the verified final snapshot")
    parser.add_argument("--live", type=Path, required=True, help="the live project root")
    parser.add_argument("--plan", type=Path, required=True, help="JSON list of paths")
    parser.add_argument("--receipts", type=Path, required=True, help="JSONL receipts file")
    parser.add_argument("--result", type=Path, required=True, help="where to write the result")
    parser.add_argument("--progress", type=Path, help="keep DIR/progress.json current")
    parser.add_argument("--check", action="store_true", help="only check what live holds")
    args = parser.parse_args(argv)
    journald.setup_logging()
    writer = ProgressWriter(args.progress) if args.progress else None

    def report(done: int, total: int) -> None:
        if writer is not None:
            if done == total:
                writer.final(done, total)
            else:
                writer.report(done, total)

    if args.check:
        return check(args)
    try:
        paths = read_plan(args.plan)
        result = settle_apply.apply(args.q, args.f, args.live, paths, args.receipts, report)
        write_atomic(args.result, json.dumps(asdict(result), indent=2, sort_keys=True) + "\n")
    except (CairnError, OSError) as exc:
        print(f"cairn.worker.apply: {exc}", file=sys.stderr)
        return 1
    log.info("apply %s: %d applied, %d already, %d conflicts", result.status,
             len(result.applied), len(result.already_applied), len(result.conflicts))
    return 0


def check(args: argparse.Namespace) -> int:
    try:
        paths = read_plan(args.plan)
        result = settle_apply.check_applied(args.q, args.f, args.live, paths, args.receipts)
        write_atomic(args.result, json.dumps(asdict(result), indent=2) + "\n")
    except (CairnError, OSError) as exc:
        print(f"cairn.worker.apply: {exc}", file=sys.stderr)
        return 1
    log.info("check: %d as applied, %d reverted, %d changed since", len(result.as_applied),
             len(result.reverted), len(result.changed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
