"""The wire protocols: per-op daemon requests keep the request line cairn has always sent,
and the tagged unions dispatch every message they declare."""

from __future__ import annotations

import json
import typing

import pytest
from pydantic import ValidationError

from cairn.daemon import server
from cairn.errors import UsageError
from cairn.protocol.broker import BODY_OF_KIND, Checkpointed, Forked, IntentKind, Receipt
from cairn.protocol.control import (
    CallRequest,
    JoinRequest,
    UnknownWorkerMessage,
    WorkflowFailure,
    WorkflowReturn,
    parse_worker_message,
)
from cairn.protocol.daemon import (
    MODEL_OF_OP,
    DaemonRequest,
    LaunchRequest,
    OpRequest,
    PsRequest,
    RequestEnvelope,
    ShowRequest,
    daemon_request,
    request_line,
)
from cairn.protocol.launch import ProfileSpec

RUN_ID = "flow_" + "0" * 32

# The line the one request model of earlier versions sent for `cairn show RUN`.
SHOW_LINE = (
    b'{"op":"show","definition":null,"args":{},"project":null,"run_id":"' + RUN_ID.encode()
    + b'","scripted":{},"all_users":false,"source":null,"confirm":null,"limits":{},'
    b'"op_id":null,"result":null,"no_effect":false,"dry_run":false,"schedule_id":null,'
    b'"schedule":{},"challenge":null,"occurrence":null,"answer":null,"request_id":null,'
    b'"fingerprint":null,"reason":"","cursor":0}\n'
)
# Keys added since (`cairn prune`), at the end and at their defaults for every other op.
ADDED_KEYS = b',"older_than":null,"keep":null}\n'


def _members() -> list[type[OpRequest]]:
    union = typing.get_args(DaemonRequest)[0]
    return list(typing.get_args(union))


def test_request_line_holds_the_ops_own_keys_and_the_old_line_still_parses() -> None:
    line = request_line(ShowRequest(run_id=RUN_ID))
    assert line == b'{"op":"show","run_id":"' + RUN_ID.encode() + b'"}\n'
    assert server.parse(line) == ShowRequest(run_id=RUN_ID)
    assert server.parse(SHOW_LINE) == ShowRequest(run_id=RUN_ID)  # a CLI of before


def test_launch_line_keeps_envelope_order_and_values() -> None:
    profile = ProfileSpec(name="p", kind="scripted")
    line = request_line(
        LaunchRequest(definition="builtin:implement", args={"x": 1.5}, scripted={"p": profile})
    )
    assert line.startswith(b'{"op":"launch","definition":"builtin:implement","args":{"x":1.5}')
    parsed = server.parse(line)
    assert isinstance(parsed, LaunchRequest) and parsed.scripted == {"p": profile}


def test_every_op_has_one_model_and_one_route() -> None:
    ops = [typing.get_args(m.model_fields["op"].annotation)[0] for m in _members()]
    assert len(ops) == len(set(ops)) == len(server.ROUTES) == len(MODEL_OF_OP)
    for model, op in zip(_members(), ops, strict=True):
        assert server.ROUTES[op][0] is model is MODEL_OF_OP[op]
        assert set(model.model_fields) <= set(RequestEnvelope.model_fields), model
        assert type(daemon_request(op)) is model


def test_keys_of_other_ops_are_checked_then_left_out() -> None:
    """As before per-op models: the envelope types every key; an op takes its own."""
    line = b'{"op": "ps", "all_users": true, "run_id": "%s", "cursor": 3}\n' % RUN_ID.encode()
    assert server.parse(line) == PsRequest(all_users=True)
    with pytest.raises(UsageError, match=r"malformed request: \('cursor',\): Input should be"):
        server.parse(b'{"op": "ps", "cursor": "later"}\n')
    with pytest.raises(ValidationError):  # the op's own model takes only its own keys
        daemon_request("show", run_id=RUN_ID, all_users=True)


def test_parse_reports_unknown_and_missing_ops_as_usage_errors() -> None:
    with pytest.raises(UsageError, match="cairnd does not know the request 'frobnicate'"):
        server.parse(b'{"op": "frobnicate"}\n')
    with pytest.raises(UsageError, match=r"malformed request: \('op',\): Field required"):
        server.parse(b'{"run_id": "x"}\n')
    with pytest.raises(UsageError, match=r"malformed request: \('cursor',\)"):
        server.parse(b'{"op": "watch", "cursor": "later"}\n')


@pytest.mark.parametrize(
    ("line", "model"),
    [
        ('{"type":"call","scope":"root","seq":1,"kind":"agent","request":{},"location":"f:1:1"}',
         CallRequest),
        ('{"type":"join","scope":"root","seq":2,"outcomes":{}}', JoinRequest),
        ('{"type":"return","output":{"a":1}}', WorkflowReturn),
        ('{"type":"failure","error":"boom","kind":"RuntimeError"}', WorkflowFailure),
    ],
)
def test_worker_messages_parse_to_their_model(line: str, model: type[object]) -> None:
    assert type(parse_worker_message(line)) is model


def test_an_unknown_worker_message_is_named() -> None:
    with pytest.raises(UnknownWorkerMessage, match="unknown message: {'type': 'dance'}"):
        parse_worker_message('{"type": "dance"}')
    with pytest.raises(ValidationError):  # a known message with bad fields
        parse_worker_message('{"type": "return"}')


# --- receipt bodies -------------------------------------------------------------------

SUBVOLUME = {
    "path": "/pool/runs/r/q",
    "subvol_id": 256,
    "uuid": "u",
    "fsid": "f",
    "read_only": True,
    "generation": 7,
}


def test_every_intent_kind_has_a_receipt_body() -> None:
    assert set(BODY_OF_KIND) == set(typing.get_args(IntentKind))


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        ("prepare-q", {"q": SUBVOLUME, "subpath": "sub", "imported": False, "project_ino": 9}),
        (
            "prepare-q",
            {
                "q": SUBVOLUME,
                "subpath": "",
                "imported": True,
                "import": {"unit": "cairn-import-r.service", "stats": {"files": 3}},
                "project_ino": 9,
            },
        ),
        ("fork", {"s": SUBVOLUME, "op_id": "root-2", "lanes": {"a": {"w": SUBVOLUME}}}),
        ("verify-storage", {"problems": ["x"], "checked": 4}),
        ("verify-storage", {"problems": [], "checked": 0, "deleted": True}),
        (
            "start-agent",
            {
                "unit": "u.service",
                "invocation_id": "i",
                "control_group": "/cg",
                "attempt": 1,
                "capsule": "c",
                "op_id": "root-1",
            },
        ),
        ("stop-agent", {"unit": "u.service", "stopped": True, "result_file": False}),
        (
            "settle-candidate",
            {
                "accepted": ["a"],
                "refused": [{"path": "b", "reason": "outside write_paths"}],
                "bytes_accepted": 3,
                "f": SUBVOLUME,
                "c": SUBVOLUME,
                "inventories_equal": False,
                "diff": "",
            },
        ),
        (
            "settle-candidate",
            {
                "accepted": [],
                "refused": [],
                "ignored": [".aider.chat.history.md"],
                "bytes_accepted": 0,
                "f": SUBVOLUME,
                "c": SUBVOLUME,
                "inventories_equal": True,
                "diff": "",
            },
        ),
        ("delete-run", {"deleted": ["/pool/runs/r"], "proxy_removed": True}),
    ],
)
def test_a_receipt_body_keeps_its_json(kind: str, data: dict[str, object]) -> None:
    body = BODY_OF_KIND[kind].model_validate(data)
    assert json.dumps(body.wire()) == json.dumps(data)  # same keys, same order
    receipt = Receipt(intent_id=kind, run_id=RUN_ID, kind=kind, data=data, at=1.0)  # type: ignore[arg-type]
    assert receipt.body(BODY_OF_KIND[kind]) == body


def test_subvolumes_of_a_fork_include_its_lanes() -> None:
    forked = Forked.model_validate(
        {"s": SUBVOLUME, "op_id": "root-2", "lanes": {"a": {"w": {**SUBVOLUME, "uuid": "v"}}}}
    )
    assert [s.uuid for s in forked.subvolumes()] == ["u", "v"]
    with pytest.raises(TypeError):
        Receipt(intent_id="f", run_id=RUN_ID, kind="fork", data={}, at=1.0).body(Checkpointed)
