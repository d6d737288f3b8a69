"""cairnd's socket: a request it does not serve is a clear one-line error with a hint, never
another request's answer."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from cairn import paths
from cairn.daemon import server, views
from cairn.errors import UsageError
from cairn.protocol.daemon import DiffRequest, ShowRequest

RUN_ID = "flow_" + "0" * 32


@pytest.fixture(autouse=True)
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    paths.journal_path().parent.mkdir(parents=True)
    return tmp_path


def _ask(line: bytes) -> dict[str, Any]:
    client, conn = socket.socketpair()
    with client:
        client.sendall(line)
        server.handle(conn)  # closes conn
        reply: dict[str, Any] = json.loads(client.recv(1 << 16))
    return reply


def test_unknown_op_on_the_socket_is_a_usage_error() -> None:
    reply = _ask(b'{"op": "frobnicate", "run_id": "' + RUN_ID.encode() + b'"}\n')
    assert reply["ok"] is False
    assert reply["error"]["code"] == "usage"
    assert reply["error"]["message"] == "cairnd does not know the request 'frobnicate'"
    assert "cairn.service" in reply["error"]["hint"]
    assert "\n" not in reply["error"]["message"] + reply["error"]["hint"]


def test_an_op_without_a_handler_is_not_answered_as_diff(monkeypatch: pytest.MonkeyPatch) -> None:
    def diff(*_args: Any) -> Any:
        raise AssertionError("answered as diff")

    monkeypatch.setattr(views, "diff", diff)
    # an op the request model knows but dispatch does not (as when one is added to the
    # model and not to the dispatch)
    request = ShowRequest.model_construct(op="frobnicate", run_id=RUN_ID)
    with pytest.raises(UsageError, match="cairnd does not know the request 'frobnicate'"):
        server.dispatch(request, os.getuid(), None)


def test_diff_is_still_diff(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str | None, int]] = []

    def diff(_journal: Any, run_id: str | None, uid: int) -> dict[str, str]:
        seen.append((run_id, uid))
        return {"diff": "answered"}

    monkeypatch.setattr(views, "diff", diff)
    request = DiffRequest(run_id=RUN_ID)
    assert server.dispatch(request, 1000, None) == {"diff": "answered"}
    assert seen == [(RUN_ID, 1000)]


def test_a_malformed_field_is_still_reported_as_malformed() -> None:
    reply = _ask(b'{"op": "show", "all_users": "perhaps"}\n')
    assert reply["error"]["code"] == "usage"
    assert reply["error"]["message"].startswith("malformed request: ('all_users',)")
