"""A workflow's input schema as the flat launch form of MCP elicitation: which fields a
form holds, what they start at, and when there is no form."""

from __future__ import annotations

from typing import Any

from cairn.definitions.builtin import builtin_source
from cairn.mcp.forms import filled, form_field, launch_form
from cairn.workflow.review import review_source
from cairn.workflow.schema import json_schema


def builtin_input(name: str) -> dict[str, Any]:
    source, _ = builtin_source(name)
    review = review_source(source, filename=f"{name}.py")
    return json_schema(review.models, review.workflow.input)


def test_the_optimize_form_asks_what_is_missing_and_proposes_the_rest() -> None:
    form = launch_form(builtin_input("optimize"), {"max_trials": 5})
    assert form is not None and form["required"] == ["objective"]
    fields = form["properties"]
    assert list(fields) == ["objective", "evaluator", "metric", "direction", "max_trials",
                            "target"]
    assert fields["target"] == {"type": "number", "title": "Target"}  # float | None, no default
    assert fields["objective"] == {"type": "string", "title": "Objective",
                                   "minLength": 1, "maxLength": 20_000}
    assert fields["max_trials"] == {"type": "integer", "title": "Max Trials", "default": 5,
                                    "minimum": 1, "maximum": 20}  # the caller's value
    assert fields["metric"]["default"] == "runtime"  # the model's default
    assert "pattern" not in fields["evaluator"]  # a form cannot say it; cairnd checks it


def test_no_form_when_nothing_required_is_missing() -> None:
    assert launch_form(builtin_input("review"), {"focus": "the parser"}) is None
    assert launch_form({"type": "object"}, {}) is None


def test_fields_a_form_cannot_hold_are_left_out_or_there_is_no_form() -> None:
    schema = {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "mode": {"enum": ["fast", "slow"], "type": "string", "default": "fast"},
        "note": {"anyOf": [{"type": "string", "maxLength": 9}, {"type": "null"}],
                 "default": None, "title": "Note"},
        "flag": {"type": "boolean", "default": False},
    }}
    form = launch_form(schema, {"tags": ["kept"]})
    assert form is not None and "tags" not in form["properties"]
    assert form["properties"]["mode"] == {"type": "string", "enum": ["fast", "slow"],
                                          "default": "fast"}
    assert form["properties"]["note"] == {"type": "string", "maxLength": 9, "title": "Note"}
    assert form["properties"]["flag"] == {"type": "boolean", "default": False}
    schema["required"] = ["tags"]  # required and not a form field: cairnd says what it needs
    assert launch_form(schema, {}) is None
    assert form_field({"type": "object", "properties": {}}) is None


def test_what_the_person_entered_wins_and_an_empty_entry_is_no_entry() -> None:
    given = {"objective": "model's", "max_trials": 5}
    assert filled(given, {"objective": "person's", "metric": "", "direction": None}) == {
        "objective": "person's", "max_trials": 5}
    assert filled(given, None) == given
