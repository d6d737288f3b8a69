"""What the journal's rows hold: run and operation states, and the rows read back."""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from cairn.canonical import canonical_json

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


def loads(value: str | None) -> Any:
    return None if value is None else json.loads(value)


def dumps(value: object) -> str | None:
    return None if value is None else canonical_json(value)


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
    settlement: dict[str, Any] | None
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
    request: dict[str, Any]
    request_hash: str
    source_location: str
    predecessor: str | None
    attempt: int
    state: OpState
    finish: dict[str, object] | None
    result: dict[str, Any] | None
    error: str | None
    checkpoint: dict[str, Any] | None
    created_at: float
    updated_at: float

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> OpRow:
        data = dict(row)
        for key in ("request", "finish", "result", "checkpoint"):
            data[key] = loads(data[key])
        return cls.model_validate(data)


class EventRow(BaseModel):
    model_config = ConfigDict(defer_build=True)

    cursor: int
    run_id: str
    scope: str | None
    op_id: str | None
    event: str
    data: dict[str, Any]
    at: float
