"""Log records reach the journal with their priority, the code that logged them and a
program name people recognise: as native entries read back from a real datagram socket,
or as ``<N>``-prefixed stderr lines where that socket is out of reach."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cairn import journald

CHILD = """
import logging, sys
from cairn import journald
journald.JOURNAL_SOCKET = sys.argv[1]
journald.setup_logging()
logging.getLogger("cairn.test").error("it broke")
logging.getLogger("cairn.test").info("fine")
"""


def _stderr_of_child(env: dict[str, str], stderr_path: str, journal: str = "/nonexistent") -> str:
    with open(stderr_path, "w") as err:
        subprocess.run([sys.executable, "-c", CHILD, journal], env=env, stderr=err, check=True)
    with open(stderr_path) as err:
        return err.read()


def test_records_carry_their_priority_when_only_stderr_reaches_the_journal(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "stderr")
    open(path, "w").close()
    st = os.stat(path)
    stream = {**os.environ, "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
    lines = _stderr_of_child(stream, path).splitlines()
    assert lines == ["<3>ERROR cairn.test: it broke", "<6>INFO cairn.test: fine"]


def test_no_prefix_on_a_terminal_or_a_file(tmp_path: Path) -> None:
    path = str(tmp_path / "stderr")
    env = {k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"}
    assert _stderr_of_child(env, path).splitlines() == [
        "ERROR cairn.test: it broke",
        "INFO cairn.test: fine",
    ]


def test_priorities_cover_every_level() -> None:
    assert journald.syslog_priority(logging.CRITICAL) == 2
    assert journald.syslog_priority(logging.ERROR) == 3
    assert journald.syslog_priority(logging.WARNING) == 4
    assert journald.syslog_priority(logging.INFO) == 6
    assert journald.syslog_priority(logging.DEBUG) == 7
    # Levels in between take the priority of the level below them.
    assert journald.syslog_priority(45) == 3
    assert journald.syslog_priority(25) == 6
    assert journald.syslog_priority(5) == 7
    assert journald.syslog_priority(60) == 2


def parse_entry(datagram: bytes) -> dict[str, str]:
    """Decode one native-protocol datagram (``KEY=value`` lines and the length-prefixed
    binary form), as journald does."""
    fields: dict[str, str] = {}
    rest = datagram
    while rest:
        line, _, after = rest.partition(b"\n")
        if b"=" in line:
            key, _, value = line.partition(b"=")
            fields[key.decode()] = value.decode()
            rest = after
        else:
            size = int.from_bytes(after[:8], "little")
            fields[line.decode()] = after[8 : 8 + size].decode()
            assert after[8 + size : 9 + size] == b"\n"
            rest = after[9 + size :]
    return fields


@pytest.fixture
def journal_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A real datagram socket standing in for journald's, with the module pointed at it."""
    path = tmp_path / "journal.socket"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(5)
        monkeypatch.setattr(journald, "JOURNAL_SOCKET", str(path))
        yield sock


def _logger(handler: logging.Handler) -> logging.Logger:
    handler.setFormatter(logging.Formatter(journald.LOG_FORMAT))  # as setup_logging() does
    logger = logging.getLogger("cairn.test.journal")
    logger.handlers = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger


def test_a_record_is_an_entry_with_priority_and_code_location(
    journal_socket: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["/usr/libexec/cairn/cairnd"])
    logger = _logger(journald.JournalHandler())
    line = sys._getframe().f_lineno + 1
    logger.error("cannot open %s", "the journal")
    entry = parse_entry(journal_socket.recv(65536))
    assert entry == {
        "MESSAGE": "ERROR cairn.test.journal: cannot open the journal",
        "PRIORITY": "3",
        "SYSLOG_IDENTIFIER": "cairnd",
        "CODE_FILE": __file__,
        "CODE_LINE": str(line),
        "CODE_FUNC": "test_a_record_is_an_entry_with_priority_and_code_location",
        "LOGGER": "cairn.test.journal",
    }
    logger.warning("slow")
    assert parse_entry(journal_socket.recv(65536))["PRIORITY"] == "4"
    logger.debug("detail")
    assert parse_entry(journal_socket.recv(65536))["PRIORITY"] == "7"


def test_a_traceback_travels_in_one_entry(journal_socket: socket.socket) -> None:
    logger = _logger(journald.JournalHandler())
    try:
        raise ValueError("bad value")
    except ValueError:
        logger.exception("handler failed")
    entry = parse_entry(journal_socket.recv(65536))
    assert entry["PRIORITY"] == "3"
    assert entry["MESSAGE"].startswith("ERROR cairn.test.journal: handler failed\nTraceback")
    assert entry["MESSAGE"].endswith("ValueError: bad value")


def test_without_the_socket_a_record_goes_to_stderr_with_its_priority(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(journald, "JOURNAL_SOCKET", str(tmp_path / "absent"))
    _logger(journald.JournalHandler()).error("no journal here")
    assert capsys.readouterr().err == "<3>ERROR cairn.test.journal: no journal here\n"


def test_setup_uses_the_native_protocol_when_the_socket_answers(
    tmp_path: Path, journal_socket: socket.socket
) -> None:
    path = str(tmp_path / "stderr")
    open(path, "w").close()
    st = os.stat(path)
    stream = {**os.environ, "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
    assert _stderr_of_child(stream, path, journal=journald.JOURNAL_SOCKET) == ""
    error, info = parse_entry(journal_socket.recv(65536)), parse_entry(journal_socket.recv(65536))
    assert (error["PRIORITY"], error["MESSAGE"]) == ("3", "ERROR cairn.test: it broke")
    assert (info["PRIORITY"], info["MESSAGE"]) == ("6", "INFO cairn.test: fine")
    assert error["CODE_FILE"] == "<string>" and error["CODE_LINE"] == "6"


def test_identifier_of_a_module_run_with_dash_m(monkeypatch: pytest.MonkeyPatch) -> None:
    main = "/usr/lib/python3/dist-packages/cairn/coordinator/__main__.py"
    monkeypatch.setattr(sys, "argv", [main])
    assert journald.identifier() == "cairn-coordinator"
    monkeypatch.setattr(sys, "argv", ["/usr/lib/python3/dist-packages/cairn/proxy.py", "x"])
    assert journald.identifier() == "cairn-proxy"  # as its unit's SyslogIdentifier=
    monkeypatch.setattr(sys, "argv", ["/usr/bin/cairn"])
    assert journald.identifier() == "cairn"
    monkeypatch.setattr(sys, "argv", ["/usr/libexec/cairn/cairn-egress", "flow_x"])
    assert journald.identifier() == "cairn-egress"
