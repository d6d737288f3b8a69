"""Models rebuilt from review specs enforce exactly what the workflow's own classes enforce."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest

from cairn.errors import ValidationFailed
from cairn.workflow.review import review_source
from cairn.workflow.schema import FieldSpec, ModelSpec, TypeSpec, build_models, json_schema

FIXTURES = Path(__file__).parent / "fixtures" / "workflows"
BUILTIN = Path(__file__).parents[2] / "cairn" / "builtin" / "workflows"

POINT = {"title": "Add tests", "weight": 2.5}
PLAN = {"goal": "Ship", "points": [POINT]}

SAMPLES: dict[str, list[Any]] = {
    "Point": [
        POINT, {"title": "x"}, {"title": ""}, {"title": "x" * 201}, {"title": "x", "weight": 11},
        {"title": "x", "weight": -0.1}, {"title": "x", "weight": "3"}, {"title": "x", "y": 1},
        {}, {"title": 5}, "not an object",
    ],
    "Plan": [
        PLAN,
        {**PLAN, "labels": {"a": 1}, "mode": "fast", "reviewer": "ana", "budget": 10,
         "tags": ["x"], "strict": False},
        {**PLAN, "goal": "1 starts with a digit"}, {**PLAN, "points": []},
        {**PLAN, "points": [POINT] * 21}, {**PLAN, "labels": {"a": "one"}},
        {**PLAN, "mode": "reckless"}, {**PLAN, "budget": 7}, {**PLAN, "budget": 0},
        {**PLAN, "budget": None}, {**PLAN, "reviewer": None}, {**PLAN, "strict": "yes"},
        {**PLAN, "strict": "perhaps"}, {**PLAN, "points": [{"title": "x", "extra": 1}]},
        {**PLAN, "unknown": True}, {"points": [POINT]},
    ],
    "Approval": [{"approve": True}, {"approve": True, "reason": "ok"}, {"reason": "no"},
                 {"approve": "maybe"}],
    "Report": [{"summary": "s"}, {"summary": ""},
               {"summary": "s", "verdicts": [{"accepted": True}], "score": 1},
               {"summary": "s", "verdicts": [{"notes": "missing accepted"}]}],
}


@pytest.fixture
def source_module() -> Iterator[types.ModuleType]:
    """The fixture module executed for real (only here, to compare against the specs)."""
    name = "cairn_schema_fixture_good_multi"
    module = types.ModuleType(name)
    sys.modules[name] = module
    try:
        source = (FIXTURES / "good_multi.py").read_text()
        exec(compile(source, "good_multi.py", "exec"), module.__dict__)
        yield module
    finally:
        del sys.modules[name]


def outcome(model: type[pydantic.BaseModel], data: Any) -> tuple[str, Any]:
    try:
        return "valid", model.model_validate(data).model_dump(mode="json")
    except pydantic.ValidationError as exc:
        return "invalid", [(e["type"], e["loc"]) for e in exc.errors()]


def test_rebuilt_models_validate_like_the_source_models(source_module: types.ModuleType) -> None:
    review = review_source((FIXTURES / "good_multi.py").read_text(), filename="good_multi.py")
    built = build_models(review.models)
    assert list(built) == ["Point", "Plan", "Verdict", "Approval", "Report"]
    seen = set()
    for name, samples in SAMPLES.items():
        original = getattr(source_module, name)
        for data in samples:
            expected = outcome(original, data)
            assert outcome(built[name], data) == expected, (name, data)
            seen.add(expected[0])
    assert seen == {"valid", "invalid"}


def test_rebuilt_models_have_the_same_json_schema(source_module: types.ModuleType) -> None:
    review = review_source((FIXTURES / "good_multi.py").read_text(), filename="good_multi.py")
    for name in review.models:
        original = getattr(source_module, name).model_json_schema()
        assert json_schema(review.models, name) == original, name


def test_rebuilt_models_are_frozen_and_closed() -> None:
    review = review_source((BUILTIN / "implement.py").read_text(), filename="implement.py")
    objective = build_models(review.models)["Objective"]
    value = objective.model_validate({"objective": "do it"})
    with pytest.raises(pydantic.ValidationError):
        value.objective = "changed"  # type: ignore[attr-defined]
    with pytest.raises(pydantic.ValidationError) as info:
        objective.model_validate({"objective": "x", "more": 1})
    assert info.value.errors()[0]["type"] == "extra_forbidden"
    with pytest.raises(pydantic.ValidationError):
        objective.model_validate({"objective": ""})


def test_builtin_schema_matches_its_declared_limits() -> None:
    review = review_source((BUILTIN / "implement.py").read_text(), filename="implement.py")
    schema = json_schema(review.models, "Summary")
    assert schema["properties"]["summary"] == {
        "maxLength": 4000, "minLength": 1, "title": "Summary", "type": "string"}
    assert schema["required"] == ["summary"]
    assert schema["additionalProperties"] is False


def test_unknown_model_name_is_refused() -> None:
    review = review_source((BUILTIN / "implement.py").read_text(), filename="implement.py")
    with pytest.raises(ValidationFailed, match="no model named 'Nope'"):
        json_schema(review.models, "Nope")


def test_reference_to_a_later_model_is_refused() -> None:
    specs = {
        "A": ModelSpec(name="A", fields=(
            FieldSpec(name="b", type=TypeSpec(kind="model", model="B")),)),
        "B": ModelSpec(name="B", fields=(FieldSpec(name="x", type=TypeSpec(kind="int")),)),
    }
    with pytest.raises(ValidationFailed, match="not declared before it"):
        build_models(specs)


def test_specs_round_trip_through_json() -> None:
    review = review_source((FIXTURES / "good_multi.py").read_text(), filename="good_multi.py")
    specs = {k: ModelSpec.model_validate_json(v.model_dump_json())
             for k, v in review.models.items()}
    assert specs == review.models
    rebuilt, built = build_models(specs), build_models(review.models)
    for name in specs:
        assert rebuilt[name].model_json_schema() == built[name].model_json_schema()
