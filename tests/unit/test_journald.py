"""Log records reach the journal with their priority and a program name people recognise."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cairn import journald

CHILD = """
import logging
from cairn import journald
journald.setup_logging()
logging.getLogger("cairn.test").error("it broke")
logging.getLogger("cairn.test").info("fine")
"""


def _stderr_of_child(env: dict[str, str], stderr_path: str) -> str:
    with open(stderr_path, "w") as err:
        subprocess.run([sys.executable, "-c", CHILD], env=env, stderr=err, check=True)
    with open(stderr_path) as err:
        return err.read()


def test_records_carry_their_priority_when_stderr_is_the_journal(tmp_path: Path) -> None:
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
    assert journald.SYSLOG_PRIORITY[logging.ERROR] == 3
    assert journald.SYSLOG_PRIORITY[logging.WARNING] == 4


def test_identifier_of_a_module_run_with_dash_m(monkeypatch: pytest.MonkeyPatch) -> None:
    main = "/usr/lib/python3/dist-packages/cairn/coordinator/__main__.py"
    monkeypatch.setattr(sys, "argv", [main])
    assert journald.identifier() == "cairn-coordinator"
    monkeypatch.setattr(sys, "argv", ["/usr/bin/cairn"])
    assert journald.identifier() == "cairn"
