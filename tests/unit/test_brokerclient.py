"""The broker client over a real Unix socket served by the real broker server: a refusal
reaches the caller with the broker's error code and hint, not as a bare message."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cairn import cli, paths
from cairn.broker.server import BrokerServer
from cairn.broker.verbs import carry_out
from cairn.brokerclient import call_broker
from cairn.daemon import server as daemon_server
from cairn.errors import BrokerRefused
from cairn.journal.readwrite import Journal
from cairn.protocol.broker import BrokerReply

RUN_ID = "flow_" + "0" * 32


@pytest.fixture
def broker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[BrokerServer]:
    """A broker server on ``paths.broker_socket()`` that answers one connection, accepting
    the test's own UID; there is no journal under the test root."""
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    path = paths.broker_socket()
    path.parent.mkdir(parents=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen(1)
        server = BrokerServer(listener, carry_out)
        server.uids = {os.getuid()}

        def serve_one() -> None:
            conn, _ = listener.accept()
            server.handle(conn)

        thread = threading.Thread(target=serve_one, daemon=True)
        thread.start()
        yield server
        if thread.is_alive():  # the test failed before it connected: unblock accept()
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(str(path))
        thread.join(timeout=10)


def test_refusal_carries_the_brokers_hint(broker: BrokerServer) -> None:
    with pytest.raises(BrokerRefused) as caught:
        call_broker("launch-v1", RUN_ID, timeout=10)
    error = caught.value
    assert error.code == "broker-refused"
    assert error.message == f"broker refused launch-v1 for {RUN_ID}: no journal"
    assert error.hint == "start cairn.socket first"


def test_a_caller_the_broker_refuses_hears_why(broker: BrokerServer) -> None:
    broker.uids = set()  # the test's UID is neither root nor cairn now
    with pytest.raises(BrokerRefused) as caught:
        call_broker("launch-v1", RUN_ID, timeout=10)
    assert caught.value.code == "permission-denied"
    assert "only root and the cairn user may call" in caught.value.message


def test_refusal_carries_the_brokers_code(broker: BrokerServer) -> None:
    paths.journal_path().parent.mkdir(parents=True)
    Journal(paths.journal_path(), create=True).close()  # a journal without the run
    with pytest.raises(BrokerRefused) as caught:  # callers that catch BrokerRefused still do
        call_broker("storage-v1", RUN_ID, timeout=10)
    error = caught.value
    assert error.code == "not-found"
    assert error.message == f"broker refused storage-v1 for {RUN_ID}: no run {RUN_ID}"
    assert error.hint is None


def test_the_cli_prints_the_brokers_message_and_hint(
    broker: BrokerServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """broker -> cairnd -> CLI, each over its real socket: the person sees the broker's
    message and hint, as cairnd's own errors show."""

    def dispatch(*_args: Any) -> Any:  # any request cairnd passes on to the broker
        return call_broker("launch-v1", RUN_ID, timeout=10).model_dump()

    monkeypatch.setattr(daemon_server, "dispatch", dispatch)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(paths.daemon_socket()))
        listener.listen(1)
        cairnd = threading.Thread(target=lambda: daemon_server.handle(listener.accept()[0]))
        cairnd.start()
        monkeypatch.setattr("sys.argv", ["cairn", "ps"])
        with pytest.raises(SystemExit) as exited:
            cli.main()
        cairnd.join(timeout=10)
    assert exited.value.code == 1
    assert capsys.readouterr().err.splitlines() == [
        f"cairn: broker refused launch-v1 for {RUN_ID}: no journal",
        "hint: start cairn.socket first",
    ]


def test_reply_without_hint_has_no_hint_key() -> None:
    """A client from before the ``hint`` field (extra keys forbidden) reads the reply."""
    left, right = socket.socketpair()
    with left, right:
        BrokerServer.reply(left, BrokerReply(ok=False, code="storage", error="pool is full"))
        assert json.loads(right.recv(4096)) == {
            "ok": False,
            "receipts": [],
            "error": "pool is full",
            "code": "storage",
        }
