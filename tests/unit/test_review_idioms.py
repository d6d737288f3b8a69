"""Safe idioms the review accepts: ``Field(default_factory=...)`` of ``list``, ``dict`` or a
model of the module, ``str.format`` on a literal string whose fields are plain positions or
names, launch arguments named like methods, and ``while`` with a literal bound. The
refusals beside them live here and in the ``bad_factory_*``, ``bad_format_*`` and
``bad_while`` fixtures (checked by test_review.py and pinned by test_review_pins.py)."""

from __future__ import annotations

import json
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest
from test_control_worker import answer, drive

from cairn.errors import ValidationFailed
from cairn.workflow.review import Review, ReviewRejected, render_review, review_source
from cairn.workflow.review.formats import literal_format_refusal
from cairn.workflow.schema import (
    FactorySpec,
    FieldSpec,
    ModelSpec,
    TypeSpec,
    build_models,
    json_schema,
)

FIXTURES = Path(__file__).parent / "fixtures" / "workflows"
GUIDE = Path(__file__).parents[2] / "docs" / "writing-workflows.md"
IDIOMS = (FIXTURES / "good_idioms.py").read_text()
BUILTIN = Path(__file__).parents[2] / "cairn" / "builtin" / "workflows"


def review() -> Review:
    return review_source(IDIOMS, filename="good_idioms.py")


def rules_and_messages(source: str) -> list[tuple[str, str]]:
    with pytest.raises(ReviewRejected) as info:
        review_source(source, filename="wf.py")
    return [(v.rule, v.message) for v in info.value.violations]


@pytest.fixture
def source_module() -> Iterator[types.ModuleType]:
    """The fixture module executed for real, to compare against the rebuilt models."""
    name = "cairn_schema_fixture_good_idioms"
    module = types.ModuleType(name)
    sys.modules[name] = module
    try:
        exec(compile(IDIOMS, "good_idioms.py", "exec"), module.__dict__)
        yield module
    finally:
        del sys.modules[name]


# default_factory


def test_factories_are_in_the_manifest_and_the_review_text() -> None:
    result = review()
    task = {f.name: f for f in result.models["Task"].fields}
    assert task["tags"].default_factory == FactorySpec(kind="list")
    assert task["labels"].default_factory == FactorySpec(kind="dict")
    assert task["limits"].default_factory == FactorySpec(kind="model", model="Limits")
    assert task["extra"].default_factory == FactorySpec(kind="list")
    assert not any(f.has_default for f in task.values())
    lines = render_review(result).splitlines()
    assert "  tags: list[str] = list()  (max_length=5)" in lines
    assert "  limits: Limits = Limits()" in lines
    assert "  extra: list[int] | None = list()" in lines


def test_a_field_without_a_factory_serializes_as_before() -> None:
    plain = FieldSpec(name="x", type=TypeSpec(kind="int"))
    assert "default_factory" not in plain.model_dump(mode="json")
    assert "default_factory" not in plain.model_dump_json()
    made = FieldSpec(name="x", type=TypeSpec(kind="list", item=TypeSpec(kind="int")),
                     default_factory=FactorySpec(kind="list"))
    assert made.model_dump(mode="json")["default_factory"] == {"kind": "list", "model": None}
    assert FieldSpec.model_validate_json(made.model_dump_json()) == made
    assert Review.model_validate_json(review().model_dump_json()) == review()


def test_rebuilt_models_make_a_fresh_default_like_the_source(
        source_module: types.ModuleType) -> None:
    built = build_models(review().models)
    model: Any  # models built at run time: mypy sees none of their fields
    for model in (built["Task"], source_module.Task):
        first, second = model(goal="g"), model(goal="h")
        assert first.model_dump(mode="json") == {
            "goal": "g", "tags": [], "labels": {}, "limits": {"width": 8, "notes": []},
            "extra": [],
        }
        assert first.tags == [] and first.tags is not second.tags
        assert first.labels == {} and first.labels is not second.labels
        assert first.limits is not second.limits
        assert first.limits.notes is not second.limits.notes
        assert type(first.limits).__name__ == "Limits"
    for data in ({"goal": "g", "tags": ["a"] * 6}, {"goal": "g", "labels": {"a": "x"}},
                 {"goal": "g", "limits": {"width": 2}}, {"goal": "g", "extra": None}, {}):
        expected = outcome(source_module.Task, data)
        assert outcome(built["Task"], data) == expected, data


def outcome(model: type[pydantic.BaseModel], data: Any) -> tuple[str, Any]:
    try:
        return "valid", model.model_validate(data).model_dump(mode="json")
    except pydantic.ValidationError as exc:
        return "invalid", [(e["type"], e["loc"]) for e in exc.errors()]


def test_schema_shows_the_starting_value_and_matches_the_source(
        source_module: types.ModuleType) -> None:
    specs = review().models
    for name in specs:
        assert json_schema(specs, name) == getattr(source_module, name).model_json_schema(), name
    schema = json_schema(specs, "Task")
    props = schema["properties"]
    assert schema["required"] == ["goal"]
    assert props["tags"]["default"] == [] and props["tags"]["maxItems"] == 5
    assert props["labels"] == {"additionalProperties": {"type": "integer"}, "default": {},
                               "description": "Counts by label", "title": "Labels",
                               "type": "object"}
    assert props["limits"] == {"$ref": "#/$defs/Limits", "default": {"width": 8, "notes": []}}
    assert props["extra"]["default"] == []
    assert schema["$defs"]["Limits"]["properties"]["notes"]["default"] == []


def test_schemas_without_factories_do_not_change() -> None:
    specs = review_source((BUILTIN / "implement.py").read_text(), filename="i.py").models
    assert "default" not in json.dumps(json_schema(specs, "Objective"))


def test_build_models_refuses_a_factory_it_cannot_make() -> None:
    listed = TypeSpec(kind="list", item=TypeSpec(kind="int"))
    both = {"A": ModelSpec(name="A", fields=(FieldSpec(
        name="x", type=listed, has_default=True, default=[],
        default_factory=FactorySpec(kind="list")),))}
    with pytest.raises(ValidationFailed, match="both a default and a default_factory"):
        build_models(both)
    factory = FactorySpec(kind="model", model="B")
    later = {"A": ModelSpec(name="A", fields=(FieldSpec(
        name="x", type=TypeSpec(kind="int"), default_factory=factory),))}
    with pytest.raises(ValidationFailed, match="not a model declared before it"):
        build_models(later)


def test_a_factory_name_the_module_rebinds_is_refused() -> None:
    source = IDIOMS.replace("writer = agent(", "def list() -> None:\n    pass\n\n\nwriter = agent(")
    found = rules_and_messages(source)
    assert ("model-field", "Field(default_factory=list) needs the builtin 'list', which this "
            "module rebinds; rename that binding") in found
    assert {rule for rule, _ in found} == {"model-field"}


def test_a_model_factory_must_be_declared_above() -> None:
    source = IDIOMS.replace("limits: Limits = Field(default_factory=Limits)",
                            "limits: int = Field(default_factory=Later)")
    (rule, message), = rules_and_messages(source)
    assert rule == "model-field" and "default_factory=Later" in message
    assert "list, dict or a Model class declared above" in message


# str.format on a literal string


@pytest.mark.parametrize("template", [
    "", "no fields", "{}", "{} and {}", "{0}{1}{0}", "{name}", "{name} {0}", "{!r}", "{0!s:>8}",
    "{:>{width}}", "{0:{1}.{2}f}", "{x:^{w}}", "{{}} {{0.__class__}}", "{ünïcode}", "{:}",
])
def test_plain_fields_are_accepted(template: str) -> None:
    assert literal_format_refusal(template) is None


@pytest.mark.parametrize(("template", "named"), [
    ("{0.__class__}", "'{0.__class__}'"),
    ("{.real}", "'{.real}'"),
    ("{a[0]}", "'{a[0]}'"),
    ("ok {} then {x.y!r:>3}", "'{x.y!r:>3}'"),
    ("{:{w.real}}", "'{w.real}'"),
    ("{:{w[0]}}", "'{w[0]}'"),
    ("{__class__}", "double-underscore"),
    ("{0!x}", "unknown conversion"),
    ("{a b}", "neither a position nor a name"),
    ("{-1}", "neither a position nor a name"),
    ("{", "not a valid format string"),
    ("}", "not a valid format string"),
    ("{0!}", "not a valid format string"),
])
def test_fields_that_reach_further_are_refused_by_name(template: str, named: str) -> None:
    reason = literal_format_refusal(template)
    assert reason is not None and named in reason and "\n" not in reason


def with_line(statement: str) -> str:
    anchor = "    step = await flow.agent("
    return IDIOMS.replace(anchor, f"    {statement}\n{anchor}")


def test_other_receivers_and_format_map_stay_refused() -> None:
    old = ("format", "'.format()' is not allowed in a workflow (it reaches attributes by "
           "name); use an f-string")
    assert rules_and_messages(with_line("x = prompt.format(1)")) == [old]
    assert rules_and_messages(with_line("x = ('{}' + '{}').format(1, 2)")) == [old]
    assert rules_and_messages(with_line("x = f'{prompt}'.format(1)")) == [old]
    assert rules_and_messages(with_line("x = b'{}'.format(1)")) == [old]
    assert rules_and_messages(with_line("x = '{a}'.format_map({'a': 1})")) == [
        ("format", "'.format_map()' is not allowed in a workflow (it reaches attributes by "
         "name); use an f-string")]


def test_a_literal_format_is_accepted_wherever_it_stands() -> None:
    lines = [
        "x = ('{}' '{}').format(1, 2)",  # implicit concatenation is one literal
        "x = [s for s in ('{}'.format(i) for i in range(3))]",
        "x = (lambda v: '{v}'.format(v=v))(1)",
        "x = '{}'.format",
        "x = '{a}{b!r}'.format(**{'a': 1, 'b': 2})",
    ]
    for line in lines:
        review_source(with_line(line), filename="wf.py")


# a launch-argument field named like a method is a value


METHOD_NAMED = '''"""Fields named like str methods and interpreter attributes."""

from cairn.workflow import Field, Model, workflow


class Export(Model):
    format: str = Field(min_length=1)
    mro: int = 0
    co_author: str = "nobody"


class Done(Model):
    summary: str


@workflow(description="Read fields whatever their names.", input=Export, output=Done)
async def run(flow, args: Export) -> Done:
    return Done(summary=f"{args.format}/{args.mro}/{args.co_author}")
'''


def test_a_launch_argument_named_format_is_read_as_a_field_and_runs() -> None:
    review_source(METHOD_NAMED, filename="wf.py")
    calls, end = drive(METHOD_NAMED, {"format": "{0.__class__}", "mro": 3}, [])
    assert calls == []
    assert end == {"type": "return", "output": {"summary": "{0.__class__}/3/nobody"}}
    # the guide's example, as written
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.DOTALL)
    (example,) = [b for b in blocks if "class Export(Model)" in b]
    header = ("from cairn.workflow import Field, Model, workflow\n\n\n"
              "class Done(Model):\n    summary: str\n\n\n")
    review_source(header + example, filename="guide.py")
    _calls, end = drive(header + example, {"format": "csv"}, [])
    assert end == {"type": "return", "output": {"summary": "exported as csv"}}


HELPER = "\n\ndef show(x: Export) -> str:\n    return f'{x.format}'\n"


@pytest.mark.parametrize(("old", "new", "rules"), [
    # not the launch arguments: a local, a model built here, a helper's parameter
    ("{args.format}/", "{(x := args).format}/", "format"),
    ("{args.format}/", "{Done(summary='s').format}/", "format"),
    ("return Done(", "return Done(summary=show(args)) or Done(", "format"),
    # the launch arguments bound again, a field it does not declare, the value's method
    ("    return Done(", "    args = Export(format='{}')\n    return Done(",
     "format introspection introspection"),
    ("{args.co_author}", "{args.co_code}", "introspection"),
    ("{args.format}/", "{args.format.format(1)}/", "format"),
])
def test_the_same_names_elsewhere_stay_refused(old: str, new: str, rules: str) -> None:
    source = METHOD_NAMED.replace(old, new) + (HELPER if "show(" in new else "")
    assert source != METHOD_NAMED
    assert [r for r, _m in rules_and_messages(source)] == rules.split()


# while with a literal bound


BOUNDED = '''"""Retry an agent until it says ok, at most three times."""

from cairn.workflow import Field, Model, agent, workflow


class Task(Model):
    goal: str = Field(min_length=1)


class Step(Model):
    text: str


writer = agent(profile="builtin:implementer", output=Step)


@workflow(description="Bounded retries.", input=Task, output=Step)
async def run(flow, args: Task) -> Step:
    done = False
    attempt = 0
    while attempt < 3 and not done:
        attempt += 1
        step = await flow.agent(writer, prompt=f"{args.goal}, try {attempt}")
        done = step.output.text == "ok"
    return step.output
'''


def test_a_while_with_a_literal_bound_is_accepted_and_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.DOTALL)
    (example,) = [b for b in blocks if "while attempt < 3" in b]
    assert example in BOUNDED  # the guide shows this workflow's loop as written
    review_source(BOUNDED, filename="wf.py")
    calls, end = drive(BOUNDED, {"goal": "g"},
                       [answer("text", "no", "root-1"), answer("text", "ok", "root-2")])
    assert [c.request["prompt"] for c in calls] == ["g, try 1", "g, try 2"]
    assert end == {"type": "return", "output": {"text": "ok"}}
    calls, end = drive(BOUNDED, {"goal": "g"}, [answer("text", "no", f"root-{n}")
                                                 for n in (1, 2, 3)])
    assert len(calls) == 3 and end == {"type": "return", "output": {"text": "no"}}
    for variant in (("attempt < 3 and not done", "attempt <= 2"),
                    ("attempt = 0", "attempt: int = 0"),
                    ("attempt += 1", "attempt += 2"),
                    ("attempt < 3 and not done", "not done and attempt < 3")):
        review_source(BOUNDED.replace(*variant), filename="wf.py")


@pytest.mark.parametrize(("old", "new", "says"), [
    # no counter in the test
    ("attempt < 3 and not done", "not done", "needs a literal bound"),
    ("attempt < 3 and not done", "attempt < 3 or not done", "needs a literal bound"),
    ("attempt < 3 and not done", "attempt > -3", "needs a literal bound"),
    ("attempt < 3 and not done", "attempt < len(args.goal)", "needs a literal bound"),
    ("attempt < 3 and not done", "0 <= attempt < 3", "needs a literal bound"),
    ("attempt < 3 and not done", "attempt < 3.5", "needs a literal bound"),
    # the counter not raised first, or not by a positive int literal
    ("        attempt += 1\n", "        attempt += 0\n", "must raise it first"),
    ("        attempt += 1\n", "        attempt -= 1\n", "must raise it first"),
    ("        attempt += 1\n", "        attempt += len(args.goal)\n", "must raise it first"),
    ("        attempt += 1\n", "        attempt += True\n", "must raise it first"),
    ("        attempt += 1\n        step", "        step", "must raise it first"),
    ("        attempt += 1\n        step = await flow.agent(writer, prompt=f\"{args.goal}, "
     "try {attempt}\")\n", "        step = await flow.agent(writer, prompt=f\"{args.goal}, "
     "try {attempt}\")\n        attempt += 1\n", "must raise it first"),
    # the counter not set to an int literal right before the loop
    ("    attempt = 0\n", "    attempt = 0\n    done = False\n", "right before"),
    ("    attempt = 0\n", "    attempt = 0.0\n", "right before"),
    ("    attempt = 0\n", "    attempt = False\n", "right before"),
    ("    attempt = 0\n", "    attempt = -len(args.goal)\n", "right before"),
    ("    attempt = 0\n", "    attempt = other = 0\n", "right before"),
    # bound again inside the loop
    ("        done = step", "        attempt = 0\n        done = step", "again"),
    ("        done = step", "        done = (attempt := 0) == 0 and step", "again"),
    ("        done = step", "        for attempt in range(2):\n            pass\n"
     "        done = step", "again"),
])
def test_a_while_without_a_literal_bound_is_refused_saying_why(
    old: str, new: str, says: str
) -> None:
    source = BOUNDED.replace(old, new, 1)
    assert source != BOUNDED
    found = rules_and_messages(source)
    assert [rule for rule, _m in found] == ["while"], found
    assert says in found[0][1] and "\n" not in found[0][1]


# the control worker runs what review accepts


def test_the_idioms_run_in_the_control_worker() -> None:
    calls, end = drive(IDIOMS, {"goal": "ship", "tags": ["a", "b"], "labels": {"x": 1}},
                       [answer("text", "done", "root-1")])
    (call,) = calls
    assert call.request["prompt"] == "Goal: ship; tags: a, b"
    assert end == {"type": "return", "output": {
        "summary": "0|[]",
        "lines": ["== (1) ==", "[    ship]", "{literal} done"],
    }}


def test_the_guide_example_passes_review() -> None:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.DOTALL)
    assert blocks, "docs/writing-workflows.md shows no python example"
    result = review_source(blocks[0], filename="guide.py")
    fields = {f.name: f for f in result.models["Task"].fields}
    assert fields["limits"].default_factory == FactorySpec(kind="model", model="Limits")


def test_the_guide_require_changes_example_passes_review() -> None:
    """The guide's ``require_changes=`` snippet, as the body of a workflow, is reviewed
    as written."""
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.DOTALL)
    (snippet,) = [b for b in blocks if "require_changes=True" in b]
    body = "".join(f"    {line}\n" for line in snippet.splitlines())
    source = (
        "from typing import Any\n\n"
        "from cairn.workflow import Field, Model, OperationFailed, agent, workflow\n\n\n"
        "class Issue(Model):\n    issue: str = Field(min_length=1)\n\n\n"
        "class Done(Model):\n    summary: str\n\n\n"
        'fixer = agent(profile="builtin:implementer", access="write", output=Done)\n\n\n'
        '@workflow(description="Fix it.", input=Issue, output=Done)\n'
        "async def run(flow: Any, args: Issue) -> Done:\n"
        f'{body}    return Done(summary="fixed")\n'
    )
    result = review_source(source, filename="guide.py")
    assert [c.kind for c in result.calls] == ["agent", "agent"]
