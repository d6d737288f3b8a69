"""The first pydantic error as one ValidationFailed line: ``<what>: <where>: <message>``."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError, model_validator

from cairn.errors import ValidationFailed
from cairn.validation import first_error, invalid


class Inner(BaseModel):
    count: int


class Outer(BaseModel):
    inner: Inner
    name: str

    @model_validator(mode="before")
    @classmethod
    def not_a_list(cls, data: object) -> object:
        if isinstance(data, list):
            raise ValueError("expected an object")  # noqa: TRY004  (pydantic wants ValueError)
        return data


def _error(data: object) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        Outer.model_validate(data)
    return caught.value


def test_where_is_the_dotted_path_of_the_first_error() -> None:
    exc = _error({"inner": {"count": "many"}})  # two errors: inner.count, then name
    assert first_error(exc) == (
        "inner.count",
        "Input should be a valid integer, unable to parse string as an integer",
    )


def test_top_names_the_whole_value() -> None:
    exc = _error([1])
    assert first_error(exc, top="args") == ("args", "Value error, expected an object")
    assert first_error(exc) == ("", "Value error, expected an object")


def test_invalid_is_one_line_with_a_hint() -> None:
    error = invalid(_error({"inner": {"count": 1}}), "arguments do not match Outer", hint="h")
    assert isinstance(error, ValidationFailed)
    assert error.message == "arguments do not match Outer: name: Field required"
    assert error.hint == "h"
