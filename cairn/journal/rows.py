"""What the journal's rows hold: run and operation states, and the rows read back."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, JsonValue, PlainSerializer, PlainValidator
from pydantic_core import PydanticCustomError

from cairn.canonical import canonical_json

if TYPE_CHECKING:  # a type only: the broker reads rows and loads no more than it runs
    from cairn.protocol.jsonvalue import JSONObject

RunState = Literal[
    "queued", "pending",
    "running",
    "waiting",
    "paused",
    "blocked",
    "succeeded",
    "failed",
    "stopped",
    "cancelled",
]
OpState = Literal[
    "requested",
    "started",
    "waiting",
    "uncertain",
    "retry",
    "failed",
    "settled",
    "committed",
    "not-started",
]
TERMINAL_RUN_STATES = ("succeeded", "failed", "stopped", "cancelled")
ControlAction = Literal["pause", "resume", "stop", "cancel"]


def loads(value: str | None) -> JsonValue:
    return None if value is None else json.loads(value)


def dumps(value: object) -> str | None:
    return None if value is None else canonical_json(value)


def _object(value: object) -> dict[str, JsonValue]:
    if not isinstance(value, dict):
        raise PydanticCustomError("dict_type", "Input should be a valid dictionary")
    return dict(value)


def _as_is(value: object) -> object:  # ``object``: serialized as it is, never walked
    return value


# A JSON column as :func:`loads` read it: JSON by construction, so only checked to be an
# object, and dumped as it is. Never walked as pydantic's JsonValue would be: its nesting
# limit is below json's (a deeper value would hang its serializer), a row cairn wrote must
# read back and be shown, and a big column would cost its size at every read.
JSONColumn = Annotated[dict[str, JsonValue], PlainValidator(_object), PlainSerializer(_as_is)]


def fork_lanes(request: Mapping[str, object]) -> list[str] | None:
    """The lane keys a fork's request names ([] when it names none); None when it names
    them as anything but a list of strings (no request the coordinator writes)."""
    lanes = request.get("lanes", [])
    if not isinstance(lanes, list) or not all(isinstance(key, str) for key in lanes):
        return None
    return lanes


class RunRow(BaseModel):
    model_config = ConfigDict(defer_build=True)

    run_id: str
    owner_uid: int
    definition: str
    review_hash: str
    project: str
    state: RunState
    output: dict[str, object] | None
    error: str | None
    settlement: JSONColumn | None
    lease_holder: str | None
    lease_token: int
    lease_expires: float
    created_at: float
    updated_at: float
    run_key: str | None = None

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> RunRow:
        data = dict(row)
        data.pop("launch", None)
        for key in ("output", "settlement"):
            data[key] = loads(data[key])
        return cls.model_validate(data)


class OpRow(BaseModel):
    model_config = ConfigDict(defer_build=True)

    run_id: str
    scope: str
    seq: int
    op_id: str
    kind: str
    request: JSONColumn
    request_hash: str
    source_location: str
    predecessor: str | None
    attempt: int
    state: OpState
    finish: dict[str, object] | None
    result: JSONColumn | None
    error: str | None
    checkpoint: JSONColumn | None
    created_at: float
    updated_at: float

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> OpRow:
        data = dict(row)
        for key in ("request", "finish", "result", "checkpoint"):
            data[key] = loads(data[key])
        return cls.model_validate(data)


class StoredReceipt(TypedDict):
    """A broker receipt as the journal keeps it (``Receipt.model_dump(mode="json")``)."""

    intent_id: str
    run_id: str
    kind: str
    data: JSONObject
    at: float


class EventRow(BaseModel):
    model_config = ConfigDict(defer_build=True)

    cursor: int
    run_id: str
    scope: str | None
    op_id: str | None
    event: str
    data: JSONColumn
    at: float
