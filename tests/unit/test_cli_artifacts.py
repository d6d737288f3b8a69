"""``cairn artifacts`` with cairnd's replies faked (the real path: the system test
tests/system/test_artifacts.py): an artifact's bytes go to a pipe or a new file exactly,
never to a terminal, never over a file that exists, and not at all when they arrive
damaged."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from clirunner import CliRunner

from cairn.cli import artifacts
from cairn.cli.commands import app
from cairn.errors import CairnError

RUN = "flow_" + "3fa9" * 8
CONTENT = b"\x1b[2J# a report with a control byte\n"


def reply(content: bytes = CONTENT, sha256: str | None = None) -> dict[str, Any]:
    return {"run_id": RUN, "op_id": "root-1", "name": "report.md", "size": len(content),
            "sha256": sha256 or hashlib.sha256(content).hexdigest(),
            "content_base64": base64.b64encode(content).decode()}


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    sent: list[Any] = []

    def fake(body: Any, **_kwargs: Any) -> dict[str, Any]:
        sent.append(body)
        return reply()

    monkeypatch.setattr(artifacts, "request", fake)
    return sent


def test_bytes_go_to_a_pipe_exactly(asked: list[Any]) -> None:
    result = CliRunner().invoke(app, ["artifacts", RUN, "root-1", "report.md"])
    assert result.exit_code == 0, result.output
    assert result.stdout_bytes == CONTENT
    assert (asked[0].op_id, asked[0].name) == ("root-1", "report.md")


def test_a_terminal_is_refused_before_anything_is_asked(
    asked: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(artifacts, "stdout_is_terminal", lambda: True)
    result = CliRunner().invoke(app, ["artifacts", RUN, "root-1", "report.md"])
    assert result.exit_code == 2
    assert "not shown on a terminal" in result.stderr and "-o FILE" in result.stderr
    assert asked == [] and result.stdout_bytes == b""


def test_output_makes_a_new_file_and_keeps_one_that_exists(
    asked: list[Any], tmp_path: Path
) -> None:
    target = tmp_path / "report.md"
    result = CliRunner().invoke(app, ["artifacts", RUN, "root-1", "report.md", "-o", str(target)])
    assert result.exit_code == 0, result.output
    assert target.read_bytes() == CONTENT
    assert "saved report.md of root-1 as" in result.stderr
    target.write_bytes(b"mine\n")
    again = CliRunner().invoke(app, ["artifacts", RUN, "root-1", "report.md", "-o", str(target)])
    assert again.exit_code == 2 and "exists; nothing was written" in again.stderr
    assert target.read_bytes() == b"mine\n"


def test_damaged_bytes_are_not_written(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(artifacts, "request", lambda body, **_: reply(sha256="0" * 64))
    target = tmp_path / "report.md"
    result = CliRunner().invoke(app, ["artifacts", RUN, "root-1", "report.md", "-o", str(target)])
    assert result.exit_code == 1 and "arrived damaged" in result.stderr
    assert not target.exists()


def test_a_run_without_artifacts_says_how_to_publish_one(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(artifacts, "request", lambda body, **_: {
        "run_id": RUN, "operations": [{"op_id": "root-1", "files": [], "refused": [],
                                       "refused_total": 0}]})
    result = CliRunner().invoke(app, ["artifacts", RUN])
    assert result.exit_code == 0
    assert result.stdout == (f"no artifacts in {RUN}: an agent publishes one by writing it "
                             "below /outputs/artifacts/\n")


def test_a_reply_that_does_not_fit_is_a_cairn_error_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(artifacts, "request", lambda body, **_: {"run_id": RUN})
    result = CliRunner().invoke(app, ["artifacts", RUN])
    # a CairnError: cairn's main prints it as one line with its hint (test_cli_exit.py)
    assert isinstance(result.exception, CairnError)
    assert result.exception.message == "cairnd sent a reply this CLI cannot read"


def test_json_with_a_name_prints_the_reply_and_output_without_one_is_refused(
    asked: list[Any], tmp_path: Path
) -> None:
    shown = CliRunner().invoke(app, ["artifacts", RUN, "root-1", "report.md", "--json"])
    assert shown.exit_code == 0
    assert json.loads(shown.stdout)["content_base64"] == base64.b64encode(CONTENT).decode()
    refused = CliRunner().invoke(app, ["artifacts", RUN, "-o", str(tmp_path / "x")])
    assert refused.exit_code == 2 and "--output saves one artifact" in refused.stderr
    assert len(asked) == 1 and not (tmp_path / "x").exists()
