"""Whatever an agent writes stays harmless (issue 28): its result is parsed with bounds
(size before reading, depth before recursing, strict UTF-8, no lone surrogate) and
refused as ``result-invalid: <kind>: …``; the command it ran is read until it exits, not
until every process it left behind closes stdout."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from test_untrusted import OWNER, RUN, agent_op, coordinator, desc, outputs_of, owned

from cairn import resultjson
from cairn.coordinator.agentsock import AgentSocket
from cairn.coordinator.base import OperationError
from cairn.protocol.agent import MESSAGE_LIMIT, AgentInstruction, AgentMessage, AgentReply
from cairn.protocol.launch import ProfileSpec
from cairn.resultjson import DEPTH_LIMIT, RESULT_LIMIT, ResultInvalid, parse
from cairn.worker import __main__ as worker_main
from cairn.worker import agentproc, profiles

__all__ = ["coordinator", "desc"]  # fixtures of test_untrusted, used here


def refusal(data: bytes, **limits: int) -> ResultInvalid:
    with pytest.raises(ResultInvalid) as caught:
        parse(data, "the result", **limits)
    return caught.value


# --- the bounded parser ---------------------------------------------------------------


def test_a_result_within_the_bounds_is_parsed() -> None:
    data = json.dumps({"output": {"summary": "é [not a bracket] {", "n": [[1.5]]}}).encode()
    assert parse(data, "x") == {"output": {"summary": "é [not a bracket] {", "n": [[1.5]]}}


def test_size_is_refused_before_parsing() -> None:
    error = refusal(b'"' + b"x" * RESULT_LIMIT + b'"')
    assert error.kind == "size"
    assert str(error) == (f"result-invalid: size: the result is {RESULT_LIMIT + 2} bytes; "
                          f"a result may have at most {RESULT_LIMIT}")
    assert refusal(b"[1, 2]", limit=5).kind == "size"


@pytest.mark.parametrize("levels", [DEPTH_LIMIT + 1, 200_000])
def test_nesting_past_the_limit_is_refused_without_recursing(levels: int) -> None:
    started = time.monotonic()
    error = refusal(b"[" * levels + b"]" * levels)
    assert error.kind == "depth"
    assert error.reason == f"depth: the result nests deeper than {DEPTH_LIMIT} levels"
    assert time.monotonic() - started < 1
    deep_objects = b'{"a":' * levels + b"1" + b"}" * levels
    assert refusal(deep_objects).kind == "depth"


def test_nesting_at_the_limit_and_brackets_in_strings_pass() -> None:
    assert parse(b"[" * DEPTH_LIMIT + b"]" * DEPTH_LIMIT, "x") is not None
    quoted = json.dumps({"s": "[" * 1000 + '\\"{' * 1000}).encode()
    assert parse(quoted, "x") == json.loads(quoted)


def test_a_flat_result_of_the_whole_size_is_judged() -> None:
    # how fast is a bench figure, not a unit test's: 0.13 s measured on a 2-core machine
    assert refusal(b"[]" * (RESULT_LIMIT // 2)).kind == "syntax"


@pytest.mark.parametrize(
    ("data", "detail"),
    [
        (b'{"summary": "caf\xe9"}', "the result is not UTF-8 (byte 0xe9 at offset 16)"),
        (b'{"summary": "\xed\xa0\x80"}', "the result is not UTF-8 (byte 0xed at offset 13)"),
        (b'{"summary": "\\ud800"}', "the result holds a lone surrogate \\ud800, which is "
         "not Unicode text"),
        (b'{"\\udfff": 1}', "the result holds a lone surrogate \\udfff, which is not "
         "Unicode text"),
    ],
)
def test_invalid_utf8_and_lone_surrogates_are_encoding_errors(data: bytes, detail: str) -> None:
    error = refusal(data)
    assert (error.kind, error.detail) == ("encoding", detail)


def test_a_surrogate_pair_is_text() -> None:
    assert parse(b'{"s": "\\ud83d\\ude00"}', "x") == {"s": "\U0001f600"}


@pytest.mark.parametrize(
    "data", [b"{", b"[NaN]", b"[Infinity]", b"[1e400]", b"[" + b"9" * 5000 + b"]", b"{} {}"]
)
def test_what_is_not_json_is_a_syntax_error(data: bytes) -> None:
    error = refusal(data)
    assert error.kind == "syntax" and "\n" not in error.detail
    assert "sys.set_int_max_str_digits" not in error.detail


def test_the_fingerprint_tells_the_same_bytes_from_others() -> None:
    first, again = refusal(b"[" * 100 + b"]" * 100), refusal(b"[" * 100 + b"]" * 100)
    other = refusal(b"[" * 101 + b"]" * 101)
    assert first.sha256 == again.sha256 != other.sha256
    assert len(first.sha256) == 64


def test_a_value_built_in_memory_is_checked_as_a_message_would_carry_it() -> None:
    deep: Any = "x"
    for _ in range(200_000):
        deep = [deep]
    for value, kind in (
        ({"a": deep}, "depth"),
        ({"a": "\udc80"}, "encoding"),
        ({"a": float("nan")}, "syntax"),
        ({"a": {1: "x"}}, "schema"),
        ({"a": object()}, "schema"),
    ):
        with pytest.raises(ResultInvalid) as caught:
            resultjson.check_value(value, "the output")
        assert caught.value.kind == kind, value if kind != "depth" else kind
    resultjson.check_value({"a": [1, 2.5, None, True, "ü"]}, "the output")


def test_a_reason_from_the_sandbox_is_cut_to_one_printable_line() -> None:
    error = ResultInvalid.from_reason("depth: \x1b]0;owned\x07deep\n" + "x" * 900,
                                      sha256="not-a-hash")
    assert error.kind == "depth" and error.sha256 == ""
    assert "\x1b" not in error.detail and "\n" not in error.detail
    assert len(error.detail) == 500
    assert ResultInvalid.from_reason("whatever it says").kind == "schema"


# --- the worker: reading the command until it exits -----------------------------------


def test_a_background_child_holding_stdout_does_not_hold_the_worker(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    os.mkfifo(gate)  # the child blocks opening it, stdout inherited, until the test ends
    script = f"cat {gate} & echo '{{\"output\": {{\"summary\": \"done\"}}}}'"
    started = time.monotonic()
    try:
        status, tail = agentproc.run_to_exit(["/bin/sh", "-c", script])
        assert time.monotonic() - started < 5
    finally:
        with open(gate, "w"):  # lets the child end
            pass
    assert status == 0
    assert tail.last_line("stdout") == b'{"output": {"summary": "done"}}'


def test_a_child_that_writes_on_after_the_exit_is_drained_for_a_bounded_time() -> None:
    script = "yes noise & echo '{\"a\": 1}'"  # yes ends on SIGPIPE once the pipe is closed
    started = time.monotonic()
    status, tail = agentproc.run_to_exit(["/bin/sh", "-c", script])
    assert time.monotonic() - started < agentproc.DRAIN_SEC + 4
    assert status == 0 and tail.total > 0


def test_stdout_is_kept_bounded_and_an_oversized_last_line_is_a_size_error() -> None:
    code = ("import sys\nfor _ in range(64): sys.stdout.write('x' * (1 << 20))\n"
            "sys.stdout.write('\\n{\"a\": 1}\\n')")
    status, tail = agentproc.run_to_exit([sys.executable, "-c", code], keep=1 << 20)
    assert status == 0 and tail.total == (64 << 20) + 10
    assert len(tail.data) <= 1 << 20
    assert tail.last_line("stdout") == b'{"a": 1}'
    status, tail = agentproc.run_to_exit(
        [sys.executable, "-c", "import sys; sys.stdout.write('y' * (3 << 20))"], keep=1 << 20
    )
    with pytest.raises(ResultInvalid) as caught:
        tail.last_line("the last line of stdout", limit=1 << 20)
    assert caught.value.kind == "size" and caught.value.sha256


@pytest.fixture
def command_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(profiles, "WORKSPACE", tmp_path)
    monkeypatch.setattr(profiles, "OUTPUTS", tmp_path / "outputs")
    (tmp_path / "outputs").mkdir()
    return tmp_path


class Summary(BaseModel):
    summary: str


def instruction(kind: str = "command") -> AgentInstruction:
    return AgentInstruction(
        run_id="flow_" + "0" * 32, op_id="root-1", attempt=1, prompt="p", title="t",
        descriptor="d", output_schema=Summary.model_json_schema(),
        profile=ProfileSpec(name="test", kind=kind),  # type: ignore[arg-type]
    )


def test_an_oversized_result_file_is_refused_by_its_size(command_env: Path) -> None:
    big = command_env / "outputs" / "result.json"
    with open(big, "wb") as fh:
        fh.truncate(200 << 20)  # sparse: the size alone must refuse it
    with pytest.raises(ResultInvalid) as caught:
        profiles.run_command(["/bin/true"], instruction())
    assert caught.value.reason == (
        f"size: /outputs/result.json is {200 << 20} bytes; a result may have at most "
        f"{RESULT_LIMIT}"
    )


def test_a_result_file_that_is_a_fifo_is_refused_not_waited_for(command_env: Path) -> None:
    os.mkfifo(command_env / "outputs" / "result.json")
    with pytest.raises(ResultInvalid) as caught:
        profiles.run_command(["/bin/true"], instruction())
    assert caught.value.kind == "file" and "FIFO" in caught.value.detail


@pytest.mark.parametrize(
    ("printed", "kind"),
    [(b"\xff\xfe\n", "encoding"), (b'{"output": {"summary": "\\udc00"}}\n', "encoding"),
     (b"[" * 200_000 + b"\n", "depth"), (b"[1, 2]\n", "schema"),
     (b'{"output": [1]}\n', "schema")],
)
def test_a_bad_stdout_line_is_refused_with_its_kind(
    command_env: Path, printed: bytes, kind: str
) -> None:
    (command_env / "out.bin").write_bytes(printed)
    with pytest.raises(ResultInvalid) as caught:
        profiles.run_command(["/bin/cat", str(command_env / "out.bin")], instruction())
    assert caught.value.kind == kind


def test_a_scripted_step_may_answer_through_the_result_file(command_env: Path) -> None:
    (command_env / "outputs" / "result.json").write_bytes(b'{"output": {"summary": "\\ud800"}}')
    with pytest.raises(ResultInvalid):
        profiles.run_profile(instruction("scripted"), None)  # type: ignore[arg-type]
    (command_env / "outputs" / "result.json").write_text('{"output": {"summary": "s"}}')
    assert profiles.run_profile(instruction("scripted"), None) == (  # type: ignore[arg-type]
        {"summary": "s"}, "")


def test_the_finish_message_must_fit_the_socket() -> None:
    assert worker_main.finish_message({"summary": "ok"}, "h").output == {"summary": "ok"}
    with pytest.raises(ResultInvalid) as caught:
        worker_main.finish_message({"summary": "\x00" * (MESSAGE_LIMIT // 4)}, "")
    assert caught.value.kind == "size"  # each NUL becomes \u0000 on the wire
    with pytest.raises(ResultInvalid):
        worker_main.finish_message({"summary": "ok"}, "\ud800")


def test_the_worker_writes_why_it_refused(tmp_path: Path) -> None:
    path = tmp_path / "result-invalid.json"
    worker_main.write_invalid(ResultInvalid("depth", "too deep", sha256="a" * 64), path)
    assert json.loads(path.read_text()) == {"reason": "depth: too deep", "sha256": "a" * 64}


# --- the coordinator's socket ---------------------------------------------------------


@pytest.fixture
def agent_socket(tmp_path: Path) -> Any:
    sock = AgentSocket(tmp_path / "op.sock", owner_uid=os.getuid(), instruction=instruction(),
                       output_model=Summary, on_note=lambda text: text)
    yield sock
    sock.close()


def send(path: Path, payload: bytes) -> AgentReply:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect(str(path))
        client.sendall(payload)
        return AgentReply.model_validate_json(client.makefile("rb").readline())


def test_a_finish_failing_the_schema_is_refused_as_the_attempts_result(
    agent_socket: AgentSocket,
) -> None:
    message = AgentMessage(type="finish_work", output={"summary": 3})
    reply = send(agent_socket.path, message.model_dump_json().encode() + b"\n")
    assert reply.refused and reply.error and reply.error.startswith("schema: output.summary")
    assert agent_socket.refused is not None and agent_socket.refused.kind == "schema"
    assert not agent_socket.finished.is_set()
    good = AgentMessage(type="finish_work", output={"summary": "ok"})
    assert send(agent_socket.path, good.model_dump_json().encode() + b"\n").ok
    assert agent_socket.finish == good


def test_a_line_past_the_message_limit_is_refused_and_the_connection_closed(
    agent_socket: AgentSocket,
) -> None:
    reply = send(agent_socket.path, b'{"type": "finish_work", "output": {"s": "'
                 + b"x" * MESSAGE_LIMIT + b'"}}\n')
    assert reply.refused and reply.error == f"size: a message may have at most " \
                                           f"{MESSAGE_LIMIT - 1} bytes"
    assert agent_socket.refused is not None and agent_socket.refused.kind == "size"


# --- the coordinator's judgement ------------------------------------------------------


def judged(c: Any, op: Any, invalid: ResultInvalid) -> OperationError | None:
    try:
        c.agents.judge_invalid(op, {"profile": "builtin:implementer"}, invalid)
    except OperationError as exc:
        return exc
    return None


def with_profile(c: Any, kind: str, **fields: Any) -> None:
    profile = ProfileSpec(name="builtin:implementer", kind=kind, **fields)  # type: ignore[arg-type]
    c.context.desc = c.context.desc.model_copy(
        update={"profiles": {"builtin:implementer": profile}})


def test_a_scripted_agents_invalid_result_fails_at_once(coordinator: Any) -> None:
    op = agent_op(coordinator)
    failed = judged(coordinator, op, ResultInvalid("depth", "too deep", sha256="a" * 64))
    assert failed is not None and failed.code == "result-invalid"
    assert str(failed).startswith("agent root-1 result-invalid: depth: too deep (not retried: "
                                  "a scripted agent answers the same")
    row = coordinator.journal.get_op_by_id(RUN, "root-1")
    assert (row.state, row.error) == ("failed", "result-invalid: depth: too deep")
    assert row.result == {"error": "result-invalid: depth: too deep", "kind": "result-invalid"}


def test_another_agent_is_retried_until_it_repeats_the_same_bytes(coordinator: Any) -> None:
    with_profile(coordinator, "command")
    op = agent_op(coordinator)
    first = ResultInvalid("size", "big", sha256="a" * 64)
    assert judged(coordinator, op, first) is None
    # judged again for the same attempt (a coordinator restarted): still a retry
    assert judged(coordinator, coordinator.journal.get_op_by_id(RUN, "root-1"), first) is None
    coordinator.journal.update_op(RUN, "root-1", token=coordinator.token, attempt=2)
    second = coordinator.journal.get_op_by_id(RUN, "root-1")
    assert judged(coordinator, second, ResultInvalid("size", "big", sha256="b" * 64)) is None
    coordinator.journal.update_op(RUN, "root-1", token=coordinator.token, attempt=3)
    third = coordinator.journal.get_op_by_id(RUN, "root-1")
    failed = judged(coordinator, third, ResultInvalid("size", "big", sha256="b" * 64))
    assert failed is not None and "the same result as the attempt before" in str(failed)


def test_the_last_attempt_fails_whatever_it_wrote(coordinator: Any) -> None:
    with_profile(coordinator, "command")
    op = agent_op(coordinator)
    attempts = ProfileSpec(name="x", kind="command").agent_attempts
    assert attempts == 3  # the default
    coordinator.journal.update_op(RUN, "root-1", token=coordinator.token, attempt=attempts)
    last = coordinator.journal.get_op_by_id(RUN, "root-1")
    failed = judged(coordinator, last, ResultInvalid("syntax", "x"))
    assert failed is not None and f"all {attempts} attempts are used" in str(failed)
    assert op.attempt == 1


def test_a_profile_of_one_attempt_fails_at_its_first_invalid_result(coordinator: Any) -> None:
    """Retries of a command profile are its own setting: a CLI whose every attempt costs
    model calls may be given one."""
    with_profile(coordinator, "command", agent_attempts=1)
    op = agent_op(coordinator)
    failed = judged(coordinator, op, ResultInvalid("syntax", "x"))
    assert failed is not None and "not retried: its only attempt is used" in str(failed)


def test_the_workers_reason_is_read_as_untrusted(coordinator: Any) -> None:
    op = agent_op(coordinator)
    out = outputs_of(coordinator, op)
    assert coordinator.agents.read_invalid_file(op) is None
    reason = {"reason": "encoding: \x1b[2Jbad", "sha256": "c" * 64}
    (out / "result-invalid.json").write_text(json.dumps(reason))
    owned(out / "result-invalid.json", OWNER)
    invalid = coordinator.agents.read_invalid_file(op)
    assert (invalid.kind, invalid.detail, invalid.sha256) == ("encoding", "?[2Jbad", "c" * 64)
    (out / "result-invalid.json").unlink()
    os.mkfifo(out / "result-invalid.json")
    owned(out / "result-invalid.json", OWNER)
    assert coordinator.agents.read_invalid_file(op).kind == "file"


def test_an_oversized_file_is_fingerprinted_by_its_size_and_head(command_env: Path) -> None:
    path = command_env / "outputs" / "result.json"

    def refused_hash(head: bytes, size: int) -> str:
        with open(path, "wb") as fh:
            fh.write(head)
            fh.truncate(size)
        with pytest.raises(ResultInvalid) as caught:
            profiles.run_command(["/bin/true"], instruction())
        return caught.value.sha256

    same = refused_hash(b"a", 10 << 20)
    assert same == refused_hash(b"a", 10 << 20)
    assert same != refused_hash(b"b", 10 << 20) and same != refused_hash(b"a", 11 << 20)


def test_an_agent_without_a_result_is_retried_as_often_as_its_profile_says(
    coordinator: Any,
) -> None:
    with_profile(coordinator, "command", agent_attempts=1)
    op = agent_op(coordinator)
    with pytest.raises(OperationError, match=r"ended without finish_work in 1 attempt "
                       r"\(last: exited 1\)"):
        coordinator.agents.recovery.retry_or_block(
            op, {"profile": "builtin:implementer", "network": "none"}, "exited 1")
    row = coordinator.journal.get_op_by_id(RUN, "root-1")
    assert (row.state, row.error) == ("failed", "no finish_work in 1 attempt (exited 1)")
