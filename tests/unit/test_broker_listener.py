"""The listening socket the broker (and cairnd) serve on, cairn/sockets.py: systemd's
when the process was socket-activated for it, else one bound by hand with the mode asked
for, replacing a socket a dead process left."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from cairn import sockets


def test_a_service_started_by_hand_binds_its_own_socket_with_its_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LISTEN_PID", raising=False)
    path = tmp_path / "run/cairn/broker.sock"
    with sockets.listener(path, 0o660) as first:
        assert stat.S_IMODE(path.stat().st_mode) == 0o660 and stat.S_ISSOCK(path.stat().st_mode)
    with sockets.listener(path, 0o600) as again:  # the dead one's socket file is replaced
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(path))
            conn, _ = again.accept()
            conn.close()
    assert first.fileno() == -1


@pytest.fixture
def on_fd_3() -> Iterator[socket.socket]:
    """A listening socket where systemd puts the first one (fd 3); whatever was there
    before is put back."""
    saved = os.dup(3) if _is_open(3) else None
    made = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    made.bind(f"\0cairn-test-listener-{os.getpid()}")
    made.listen(1)
    os.dup2(made.fileno(), 3)
    try:
        yield made
    finally:
        made.close()
        if saved is None:
            os.close(3)
        else:
            os.dup2(saved, 3)
            os.close(saved)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_an_activated_service_serves_on_the_socket_systemd_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, on_fd_3: socket.socket
) -> None:
    path = tmp_path / "broker.sock"
    monkeypatch.setenv("LISTEN_PID", str(os.getpid()))
    monkeypatch.setenv("LISTEN_FDS", "1")
    activated = sockets.listener(path, 0o660)
    try:
        assert activated.fileno() == 3 and activated.getsockname() == on_fd_3.getsockname()
        assert not path.exists()  # nothing bound by hand
    finally:
        activated.detach()  # fd 3 is the fixture's to put back
    monkeypatch.setenv("LISTEN_FDS", "0")
    assert sockets.systemd_listener() is None
    monkeypatch.setenv("LISTEN_PID", str(os.getpid() + 1))  # passed to another process
    monkeypatch.setenv("LISTEN_FDS", "1")
    assert sockets.systemd_listener() is None
