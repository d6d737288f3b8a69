"""The ops whose reply the CLI reads through a typed model (:class:`cairn.protocol.replies.Reply`:
``ps``, ``checkpoints``, ``storage-df``, ``retry``, ``reconcile``, ``rm``, ``prune``, ``revert``,
``replay``): a reply that does not fit
is a CairnError saying so, never a traceback. What they print from a reply that fits is in
tests/unit/test_cli_verbs.py, test_cli_storage.py and test_cli_hostile_text.py."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from clirunner import CliRunner

from cairn.cli import runs, storage
from cairn.cli.commands import app
from cairn.errors import CairnError

RUN = "flow_" + "3fa9" * 8

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
