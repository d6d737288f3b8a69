"""cairnd's replies as the CLI reads them without a model (``reply_result``), and what a
launch prints of them: cairnd runs as the ``cairn`` service user, so every reply may be
the attacker's. A reply that is not one is a one-line CairnError, never a traceback, and
text from it reaches the terminal escaped."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cairn.cli import launching
from cairn.cli.attest import Expected
from cairn.cli.client import reply_result
from cairn.errors import CairnError, PermissionDenied

DEEP = b"[" * 100_000 + b"]" * 100_000


def test_a_result_is_returned_and_an_error_raised_with_its_code_and_hint() -> None:
    assert reply_result(b'{"ok": true, "result": {"run_id": "r"}}\n') == {"run_id": "r"}
    assert reply_result(b'{"ok": true}') is None
    with pytest.raises(CairnError) as caught:
        reply_result(b'{"ok": false, "error": {"code": "not-found", "message": "no run x",'
                     b' "hint": "see cairn list"}}')
    assert (caught.value.code, caught.value.message, caught.value.hint) == (
        "not-found", "no run x", "see cairn list")
    with pytest.raises(CairnError, match="closed the connection"):
        reply_result(b"")


@pytest.mark.parametrize("raw", [
    b"not json", b"[1, 2]", b'{"ok": "yes"}', b'{"result": 1}', b'{"ok": false}',
    b'{"ok": false, "error": "bad"}', b'{"ok": false, "error": {"code": 7, "message": "m"}}',
    b'{"ok": false, "error": {"code": "x"}}', b"\xff\xfe", DEEP,
])
def test_a_reply_that_is_not_one_is_a_one_line_error(raw: bytes) -> None:
    with pytest.raises(CairnError) as caught:
        reply_result(raw)
    assert caught.value.message == "cairnd sent a reply this CLI cannot read"
    assert caught.value.hint and "cairn doctor" in caught.value.hint


def test_a_description_nested_past_the_parser_is_refused_not_a_crash() -> None:
    with pytest.raises(PermissionDenied, match="cannot read"):
        Expected(definition="builtin:goal").check(DEEP + b"\n")


def test_a_launch_prints_cairnds_run_id_escaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = "flow_\x1b]0;pwned\x07"

    def request(body: dict[str, Any], fd: int | None = None, **_: Any) -> dict[str, Any]:
        assert fd is not None and os.path.samefile(f"/proc/self/fd/{fd}", tmp_path)
        return {"run_id": hostile, "state": "queued", "position": "1\x1b[2J"}

    monkeypatch.setattr(launching, "request", request)
    launching.launch("builtin:goal", project=tmp_path)
    out, err = capsys.readouterr()
    assert out == "flow_\\x1b]0;pwned\\x07\n"
    assert "\x1b" not in err and "flow_\\x1b]0;pwned\\x07 starts when" in err
    assert "(position 1\\x1b[2J)" in err
