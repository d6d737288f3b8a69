"""``cairn rm``, ``cairn prune`` and ``cairn storage df`` as the CLI sends and prints them
(cairnd's side is tests/unit/test_retention.py)."""

from __future__ import annotations

from typing import Any

import pytest
from clirunner import CliRunner

from cairn.cli import storage as cli_storage
from cairn.cli.commands import app
from cairn.errors import CairnError, UsageError
from cairn.protocol.daemon import OpRequest, PruneRequest, RmRequest

A, B = "flow_" + "a" * 32, "flow_" + "b" * 32


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[OpRequest]:
    """Requests the CLI sends; a check of run B is refused as cairnd would refuse it."""
    requests: list[OpRequest] = []

    def request(body: OpRequest, **_: Any) -> Any:
        requests.append(body)
        if isinstance(body, RmRequest):
            if body.run_id == B:
                raise UsageError(f"run {B} is kept: it is running; only finished runs are deleted")
            return {"run_id": body.run_id, "already_gone": False, "subvolumes": 6,
                    "reclaim_pending": 0, "free_bytes": None}
        if isinstance(body, PruneRequest):
            return {
                "dry_run": body.dry_run, "rule": {"older_than": body.older_than, "keep": body.keep},
                "delete": [{"run_id": A, "reason": "finished 20d ago"}], "kept": [],
                "deleted": [] if body.dry_run else [{"run_id": A, "subvolumes": 6}], "failed": [],
                "reclaim_pending": 0, "free_bytes": None,
            }
        return {
            "pool": {"root": "/var/lib/cairn/pool", "size": 2 << 30, "used": 600 << 20,
                     "free": 1400 << 20, "reserve": 256 << 20, "quotas": False},
            "runs": [{"run_id": A, "owner_uid": 1000, "state": "succeeded", "finished_at": 0.0,
                      "exclusive": None, "held": None}],
        }

    monkeypatch.setattr(cli_storage, "request", request)
    return requests


def test_rm_checks_every_run_before_deleting_any(sent: list[OpRequest]) -> None:
    result = CliRunner().invoke(app, ["rm", A, B, "--yes"])
    assert isinstance(result.exception, CairnError) and "is kept" in result.exception.message
    assert sent == [RmRequest(run_id=A, dry_run=True), RmRequest(run_id=B, dry_run=True)]


def test_rm_deletes_after_the_check(sent: list[OpRequest]) -> None:
    result = CliRunner().invoke(app, ["rm", A, "--yes"])
    assert result.exit_code == 0, result.output
    assert sent == [RmRequest(run_id=A, dry_run=True), RmRequest(run_id=A)]
    assert result.output == f"deleted {A} (6 subvolumes)\n"


def test_prune_sends_the_rule_in_seconds(sent: list[OpRequest]) -> None:
    result = CliRunner().invoke(app, ["prune", "--older-than", "14d", "--keep", "3", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert sent == [PruneRequest(older_than=14 * 86400, keep=3, dry_run=True)]
    assert f"would delete {A}: finished 20d ago" in result.output


def test_prune_without_a_rule_asks_for_the_host_policy(sent: list[OpRequest]) -> None:
    result = CliRunner().invoke(app, ["prune", "--yes"])
    assert result.exit_code == 0, result.output
    assert sent == [PruneRequest()]
    assert f"deleted {A} (6 subvolumes)" in result.output


def test_an_unreadable_age_is_refused_before_anything_is_sent(sent: list[OpRequest]) -> None:
    result = CliRunner().invoke(app, ["prune", "--older-than", "two weeks"])
    assert isinstance(result.exception, UsageError) and sent == []


def test_df_says_exclusive_bytes_are_unknown_without_quotas(sent: list[OpRequest]) -> None:
    result = CliRunner().invoke(app, ["storage", "df"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == (
        "pool /var/lib/cairn/pool: size 2.0 GiB, used 600.0 MiB, free 1.4 GiB, "
        "reserve 256.0 MiB"
    )
    assert lines[1] == "exclusive bytes per run: unknown (Btrfs quotas are off on this pool)"
    assert lines[3].startswith(A) and "unknown" in lines[3]
