"""The registry of operation kinds: every kind has one home, and each home registers.

Also pins the requests each kind sends (the journal's request hash is taken over them)
and the coordinator's table of handlers.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path
from typing import Any, TypedDict, get_args

import pytest
from pydantic import ValidationError

import cairn.operations
from cairn import operation_kinds
from cairn.broker import verbs
from cairn.coordinator.dispatch import HANDLERS, Handlers
from cairn.operation_kinds import OperationKind
from cairn.operations import (
    ALL_KINDS,
    AVAILABLE_KINDS,
    BOUNDARY_KINDS,
    FORK_KINDS,
    KINDS,
    MARKER_KINDS,
    MODULES,
    agent,
    ask,
    fork,
    measure_proposal,
    repeat_until,
    restore,
    settle_experiment,
    spec_of,
    unroll,
)
from cairn.operations.spec import OperationSpec
from cairn.protocol.control import CallRequest
from cairn.workflow.review import FLOW_KINDS, ReviewRejected, review_source
from cairn.workflow.runtime import Flow

# Modules of the package that define the spec type rather than a kind.
_NOT_KINDS = {"spec"}


def _kind_modules() -> list[str]:
    found = [m.name for m in pkgutil.iter_modules(cairn.operations.__path__)]
    return sorted(name for name in found if name not in _NOT_KINDS)


def test_every_kind_has_exactly_one_spec_in_one_module() -> None:
    homes: dict[str, list[str]] = {}
    for name in _kind_modules():
        module = importlib.import_module(f"cairn.operations.{name}")
        specs = getattr(module, "SPECS", ())
        assert specs, f"cairn/operations/{name}.py registers no operation kind (SPECS)"
        for spec in specs:
            assert isinstance(spec, OperationSpec)
            homes.setdefault(spec.kind, []).append(name)
    assert sorted(homes) == sorted(get_args(OperationKind))
    assert {kind: len(found) for kind, found in homes.items() if len(found) != 1} == {}


def test_every_module_is_registered() -> None:
    registered = sorted(m.__name__.rsplit(".", 1)[1] for m in MODULES)
    assert registered == _kind_modules()
    for module in MODULES:
        for spec in module.SPECS:
            assert KINDS[spec.kind] is spec


def test_registry_follows_the_literal() -> None:
    assert tuple(KINDS) == ALL_KINDS == get_args(OperationKind)
    assert set(FLOW_KINDS) <= set(ALL_KINDS)
    assert tuple(k for k in ALL_KINDS if k in FLOW_KINDS) == FLOW_KINDS  # the literal's order
    for kind, spec in KINDS.items():
        assert spec.kind == kind and spec_of(kind) is spec
        assert spec.summary


def test_kind_literal_module_imports_only_typing() -> None:
    tree = ast.parse(Path(operation_kinds.__file__).read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"typing", "__future__"}


def test_flags() -> None:
    assert FORK_KINDS == ("parallel", "map")
    assert MARKER_KINDS == ("unroll", "item", "repeat_until")
    assert BOUNDARY_KINDS == ("agent",)
    assert spec_of("item").manifest_kinds == ("item", "unroll")
    assert spec_of("agent").manifest_kinds == ("agent",)


def test_broker_spells_the_same_kinds() -> None:
    assert verbs.AGENT == cairn.operations.AGENT
    assert verbs.FORK_KINDS == FORK_KINDS


def test_every_carried_out_kind_has_one_coordinator_handler() -> None:
    carried_out = {kind for kind, spec in KINDS.items() if spec.carried_out}
    assert set(HANDLERS) == carried_out
    for kind in FORK_KINDS:
        assert HANDLERS[kind] is Handlers.answer_fork
    for kind in MARKER_KINDS:
        assert HANDLERS[kind] is Handlers.answer_marker


# One call of every kind, as a workflow would write it (a new kind needs its example).
CALL_OF_KIND: dict[str, str] = {
    "agent": "await flow.agent(worker, prompt=args.text)",
    "parallel": 'await flow.parallel({"a": lambda: flow.agent(worker, prompt="a")})',
    "map": "await flow.map([args.text], lambda t: flow.agent(worker, prompt=t))",
    "unroll": 'await flow.unroll([args.text], lambda t: flow.agent(worker, prompt=t), title="P")',
    "item": 'await flow.item("k", lambda: flow.agent(worker, prompt="k"))',
    "ask": 'await flow.ask("Ship it?")',
    "approve": 'await flow.approve("Ship it?", expires_in=600)',
    "measure_proposal": (
        'await flow.measure_proposal("bench", metrics={"t": {"unit": "s", "direction": "lower"}})'
    ),
    "settle_experiment": 'await flow.settle_experiment({"measurement": "root-1"}, "accept")',
    "repeat_until": (
        "await flow.repeat_until(lambda: flow.agent(worker, prompt=args.text), "
        "lambda r: True, 3)"
    ),
    "restore": "await flow.restore(await flow.agent(worker, prompt=args.text))",
}

WORKFLOW = """
from cairn.workflow import Field, Model, agent, workflow


class Task(Model):
    text: str = Field(min_length=1)


class Done(Model):
    summary: str


worker = agent(profile="builtin:implementer", output=Done)


@workflow(description="One call.", input=Task, output=Done)
async def run(flow, args: Task) -> Done:
    CALL
    return Done(summary="ok")
"""


def _review_accepts(kind: str) -> bool:
    try:
        review = review_source(WORKFLOW.replace("CALL", CALL_OF_KIND[kind]), filename="wf.py")
    except ReviewRejected as error:
        (violation,) = [v for v in error.violations if f"flow.{kind}" in v.message]
        assert violation.message.startswith(
            f"flow.{kind}(...) is not available in this release of cairn; use one of "
        )
        assert error.message.count("\n") == 0  # noqa: PT017
        return False
    assert kind in {c.kind for c in review.calls}
    return True


def test_review_accepts_exactly_the_kinds_the_runtime_carries_out() -> None:
    """A reviewed workflow can always run: every kind the review lets through has a
    coordinator handler and a method of the control worker's ``flow``, and every other
    kind is refused by name."""
    assert set(CALL_OF_KIND) == set(ALL_KINDS)
    accepted = {kind for kind in ALL_KINDS if _review_accepts(kind)}
    assert accepted == set(HANDLERS) == set(FLOW_KINDS) == set(AVAILABLE_KINDS)
    assert all(callable(getattr(Flow, kind, None)) for kind in accepted)


def test_requests_keep_their_shape() -> None:
    """The journal's request hash is taken over these: they may not change."""
    assert agent.request("fix", "do it", None) == {
        "descriptor": "fix",
        "prompt": "do it",
        "title": "fix",
    }
    assert agent.request("fix", "p", "Title")["title"] == "Title"
    assert agent.request("fix", "do it", None, False) == agent.request("fix", "do it", None)
    assert agent.request("fix", "p", None, True)["require_changes"] is True
    assert ask.request("why?", None) == {"question": "why?"}
    assert ask.request("why?", "Answer") == {"question": "why?", "schema": "Answer"}
    assert fork.request(["a", "b"], 2) == {"lanes": ["a", "b"], "concurrency": 2}
    assert repeat_until.request(3) == {"max_attempts": 3}
    assert restore.request("root-1") == {"boundary": "root-1"}
    assert unroll.request("plan", ["x"]) == {"title": "plan", "items": ["x"]}
    assert unroll.item_request("plan", 0, "x") == {"worklist": "plan", "index": 0, "label": "x"}
    assert unroll.done_request("plan", 1) == {
        "worklist": "plan",
        "index": 1,
        "label": "",
        "done": True,
    }
    assert unroll.label({"b": 1}) == '{"b": 1}'
    assert measure_proposal.request("bench", {"t": {"unit": "s", "direction": "lower"}}, None) == {
        "evaluator": "bench",
        "primary": "t",
        "metrics": {"t": {"unit": "s", "direction": "lower", "aggregation": "median",
                          "max_regression": None}},
    }
    assert settle_experiment.request({"measurement": "root-2", "values": {}}, "reject") == {
        "measurement": "root-2",
        "disposition": "reject",
    }
    with pytest.raises(ValueError, match="'accept' or 'reject'"):
        settle_experiment.request({"measurement": "root-2"}, "keep")
    with pytest.raises(ValueError, match="takes what flow.measure_proposal returned"):
        settle_experiment.request({"values": {}}, "accept")
    assert unroll.label("y" * 200) == "y" * 120


@pytest.mark.parametrize("attempts", [0, 101])
def test_repeat_until_bounds(attempts: int) -> None:
    with pytest.raises(ValueError, match="max_attempts must be between 1 and 100"):
        repeat_until.request(attempts)


class CallFields(TypedDict):
    scope: str
    seq: int
    request: dict[str, Any]
    location: str


def test_call_request_kind_is_typed() -> None:
    fields: CallFields = {"scope": "root", "seq": 1, "request": {}, "location": "w.py:1:1"}
    assert CallRequest(kind="unroll", **fields).kind == "unroll"
    with pytest.raises(ValidationError):
        CallRequest.model_validate({"kind": "teleport", **fields})
