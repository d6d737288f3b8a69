"""The ops whose reply the CLI reads through a typed model (:class:`cairn.protocol.replies.Reply`:
``ps``, ``checkpoints``, ``storage-df``, ``retry``, ``reconcile``, ``rm``, ``prune``, ``revert``,
``replay``; ``inbox``, ``answer``, ``approve``, ``reject``, ``apply``, ``pause``, ``resume``,
``stop``, ``cancel``; ``schedule-create``, ``schedule-confirm``, ``schedule-resume``,
``schedule-pause``, ``schedule-delete``, ``schedule-list``, ``schedule-inspect``,
``schedule-inbox``, ``schedule-reconcile``; of :mod:`cairn.protocol.view_replies`: ``diff``,
``logs``, a run's ``doctor``, ``show``; of :mod:`cairn.protocol.run_replies`: ``watch``;
the others in test_typed_op_replies.py): a reply that does not fit is a CairnError saying
so, never a traceback.
What they print from a reply that fits is in tests/unit/test_cli_verbs.py,
test_cli_storage.py and test_cli_hostile_text.py."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from clirunner import CliRunner

from cairn.cli import doctor, logs, people, runs, schedule, schedulepins, storage, watchview
from cairn.cli.commands import app
from cairn.errors import CairnError

RUN = "flow_" + "3fa9" * 8
SCHEDULE = "0123456789ab"

# op -> (the module whose request is faked, the command line, a reply that does not fit)
UNFIT: dict[str, tuple[ModuleType, list[str], Any]] = {
    "ps": (runs, ["list"], [{"run_id": RUN, "state": "running"}]),
    "checkpoints": (storage, ["checkpoints", RUN], {"run_id": RUN, "checkpoints": []}),
    "storage-df": (storage, ["storage", "df"], {"pool": {"root": "/pool"}, "runs": []}),
    "retry": (runs, ["retry", RUN, "root-1"], {"run_id": RUN}),
    "reconcile": (runs, ["reconcile", RUN, "root-1", "--no-effect"], {"op_id": "root-1"}),
    "rm": (storage, ["rm", RUN, "--dry-run"], {"run_id": RUN, "subvolumes": 0}),
    "prune": (storage, ["prune", "--dry-run"], {"dry_run": True, "delete": "all"}),
    "revert": (runs, ["revert", RUN, "--yes"], {"run_id": RUN, "status": "applied"}),
    "replay": (runs, ["replay", RUN, "--through", "root-1"], {"run_id": RUN, "imported": 2}),
    "inbox": (people, ["inbox"], [{"kind": "question", "run_id": RUN}]),
    "answer": (people, ["answer", RUN, "yes", "--challenge", "sha256:0"], {"run_id": RUN}),
    "approve": (people, ["approve", RUN, "req", "--fingerprint", "sha256:0"],
                {"request_id": "req"}),
    "reject": (people, ["reject", RUN, "req"], {"run_id": RUN, "woken": "maybe"}),
    "apply": (people, ["apply", RUN], {"run_id": RUN, "outcome": "approved"}),
    "pause": (people, ["pause", RUN], {"run_id": RUN, "action": "pause"}),
    "resume": (people, ["resume", RUN], {"run_id": RUN, "outcome": None}),
    "stop": (people, ["stop", RUN], {"outcome": "stop-requested"}),
    "cancel": (people, ["cancel", RUN, "--yes"], {"run_id": RUN, "outcome": "cancelled"}),
    "schedule-confirm": (schedule, ["schedule", "confirm", "create", "sha256:0"],
                         {"schedule_id": SCHEDULE, "revision": "one"}),
    "schedule-pause": (schedule, ["schedule", "pause", SCHEDULE], {"schedule_id": SCHEDULE}),
    "schedule-delete": (schedule, ["schedule", "rm", SCHEDULE, "--yes"], {"status": "deleted"}),
    "schedule-list": (schedule, ["schedule", "list"], [{"schedule_id": SCHEDULE}]),
    "schedule-inspect": (schedule, ["schedule", "show", SCHEDULE], {"occurrences": []}),
    "schedule-inbox": (schedule, ["schedule", "inbox"], [{"kind": "failed", "message": 1}]),
    "diff": (runs, ["diff", RUN], {"run_id": RUN, "status": "applied", "refused": ["a"]}),
    "logs": (logs, ["logs", RUN], {"run_id": RUN, "text": "one\n", "finished": "soon"}),
    "show": (runs, ["show", RUN], {"run": {"run_id": RUN}, "operations": [], "units": []}),
    "doctor": (doctor, ["doctor", RUN], {"host": [], "runs": [{"run_id": RUN}], "problems": 0}),
    "watch": (watchview, ["watch", RUN], {"run_id": RUN, "state": "running", "events": "all"}),
    "schedule-reconcile": (schedule, ["schedule", "repair"],
                           {"schedules": [], "repaired": "two", "queued": []}),
}


@pytest.mark.parametrize("op", sorted(UNFIT))
def test_a_reply_that_does_not_fit_is_a_cairn_error_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, op: str
) -> None:
    module, argv, reply = UNFIT[op]
    sent: list[str] = []

    def request(body: Any, **_kwargs: Any) -> Any:
        sent.append(body.op)
        return reply

    monkeypatch.setattr(module, "request", request)
    # the user manager and the pins of whoever runs the tests stay as they are
    monkeypatch.setattr(schedule, "remove_timer", lambda _schedule_id: False)
    monkeypatch.setattr(schedulepins, "forget", lambda _schedule_id: None)
    result = CliRunner().invoke(app, argv)
    # a CairnError: cairn's main prints it as one line with its hint (test_cli_exit.py)
    assert isinstance(result.exception, CairnError), result
    assert result.exception.message == "cairnd sent a reply this CLI cannot read"
    assert sent == [op] and result.stdout == ""


def test_a_list_that_is_not_one_is_a_cairn_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runs, "request", lambda body, **_: {"runs": []})
    result = CliRunner().invoke(app, ["list"])
    assert isinstance(result.exception, CairnError), result
    assert result.exception.message == "cairnd sent a reply this CLI cannot read"


def schedule_detail(project: Path, status: str, review_hash: str) -> dict[str, Any]:
    """Schedule SCHEDULE of builtin:implement on ``project``, as schedule-inspect answers."""
    return {"schedule_id": SCHEDULE, "name": "nightly", "status": status, "revision": 1,
            "confirmed_revision": 1, "awaiting_confirmation": False,
            "definition": "builtin:implement", "project": str(project),
            "calendar": "*-*-* 02:00:00 UTC", "timezone": "UTC", "catch_up": "none",
            "overlap": "skip", "min_spacing_sec": 0, "max_runs": 10, "runs_used": 0,
            "valid_until": "2030-01-01T00:00:00Z", "launch_failures": 0,
            "blocked_reason": None, "timer_unit": f"cairn-schedule@{SCHEDULE}.timer",
            "timer": None, "last_occurrence": None, "review_hash": review_hash, "args": {},
            "profiles": [], "challenge": None, "next_elapses": [], "occurrences": [],
            "occurrences_omitted": False}


def test_a_create_or_resume_reply_that_does_not_fit_is_a_cairn_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    shown = schedule_detail(tmp_path, "paused", "sha256:0")
    sent: list[str] = []

    def request(body: Any, **_kwargs: Any) -> Any:
        sent.append(body.op)
        # the resumed schedule without its timer, the created one without its challenge
        return shown if body.op == "schedule-inspect" else {**shown, "next_elapses": []}

    monkeypatch.setattr(schedule, "request", request)
    monkeypatch.setattr(schedule, "install_timer", lambda *_args: pytest.fail("installed"))
    monkeypatch.setattr(schedulepins, "record_pending", lambda _pin: pytest.fail("pinned"))
    create = ["schedule", "create", "nightly", "builtin:implement", "--project", str(tmp_path),
              "--calendar", "*-*-* 02:00:00", "--timezone", "UTC", "--catch-up", "none",
              "--max-runs", "10", "--valid-until", "2030-01-01T00:00:00Z"]
    for argv, ops in ((["schedule", "resume", SCHEDULE], ["schedule-inspect", "schedule-resume"]),
                      (create, ["schedule-create"])):
        sent.clear()
        result = CliRunner().invoke(app, argv)
        assert isinstance(result.exception, CairnError), result
        assert result.exception.message == "cairnd sent a reply this CLI cannot read"
        assert sent == ops and result.stdout == ""


def test_a_host_doctor_reply_that_does_not_fit_is_a_cairn_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[str] = []

    def request(body: Any, **_kwargs: Any) -> Any:
        sent.append(body.op)
        return {"host": [{"check": "pool"}], "credentials": {}, "runs": [], "problems": 0}

    monkeypatch.setattr(doctor, "request", request)
    result = CliRunner().invoke(app, ["doctor"])
    assert isinstance(result.exception, CairnError), result
    assert result.exception.message == "cairnd sent a reply this CLI cannot read"
    assert sent == ["doctor"] and result.stdout == ""
