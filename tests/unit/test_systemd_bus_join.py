"""A user's bus can be up before the user's manager has joined it (seen right after a
login: the notifier's first hook failed with NameHasNoOwner). The notifier waits for the
manager's name as long as it is told to, over a real private dbus-daemon."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from jeepney import message_bus, new_method_call
from jeepney.io.blocking import DBusConnection, open_dbus_connection

from cairn.cli.notify import NAME_HAS_NO_OWNER, connect_user_manager
from cairn.systemd import SD_BUS_NAME, DBusCallFailed


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[str]:
    address = f"unix:path={tmp_path}/bus"
    daemon = subprocess.Popen(
        ["/usr/bin/dbus-daemon", "--session", "--nofork", "--nopidfile",
         f"--address={address}", "--print-address"],
        stdout=subprocess.PIPE,
    )
    try:
        assert daemon.stdout is not None
        daemon.stdout.readline()  # printed once it listens
        yield address
    finally:
        daemon.terminate()
        daemon.wait(timeout=10)


def claim_manager_name(address: str) -> DBusConnection:
    conn = open_dbus_connection(bus=address)
    conn.send_and_get_reply(new_method_call(message_bus, "RequestName", "su", (SD_BUS_NAME, 0)))
    return conn


def test_without_waiting_a_bus_without_the_manager_is_an_error_at_once(bus: str) -> None:
    started = time.monotonic()
    with pytest.raises(DBusCallFailed) as caught:
        connect_user_manager(bus, 0)
    assert caught.value.dbus_name == NAME_HAS_NO_OWNER
    assert time.monotonic() - started < 5


def test_the_manager_joining_the_bus_meanwhile_is_waited_for(bus: str) -> None:
    claimed: list[DBusConnection] = []
    joins = threading.Timer(0.3, lambda: claimed.append(claim_manager_name(bus)))
    joins.start()
    try:
        with connect_user_manager(bus, 20) as manager:
            assert claimed and manager._owner == claimed[0].unique_name
    finally:
        joins.join()
        for conn in claimed:
            conn.close()


def test_the_wait_ends_with_the_error_when_the_manager_never_joins(bus: str) -> None:
    started = time.monotonic()
    with pytest.raises(DBusCallFailed):
        connect_user_manager(bus, 0.5)
    assert 0.5 <= time.monotonic() - started < 5
