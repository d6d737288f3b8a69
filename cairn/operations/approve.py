"""``flow.approve(subject, expires_in=, on_expiry=, on_reject=)``: the workflow asks a
person to approve something; the run waits (ARCHITECTURE §10).

Review: ``expires_in=`` is an int literal of seconds in
[:data:`MIN_EXPIRY_SEC`, :data:`MAX_EXPIRY_SEC`] (without it the host policy's
``approval_deadline_sec`` applies), ``on_expiry=`` is ``"reject"`` or ``"approve"``,
``on_reject=`` is ``"value"`` or ``"fail"``; the site needs ``human``. Journal: the
request is those four values (:func:`request`); the decision is journalled once, in
the approval request the operation opens, and the settled operation holds the
:class:`Decision` replay returns. Coordinator: :mod:`cairn.coordinator.interactions`;
cairnd expires an undecided request at its deadline (:mod:`cairn.daemon.expiry`).
"""

from __future__ import annotations

import ast
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cairn.errors import UsageError
from cairn.operations.spec import OperationSpec, ReviewContext, SiteFacts
from cairn.protocol.jsonvalue import JSONObject

MIN_EXPIRY_SEC = 60
"""The shortest expiry a workflow may ask for: a person needs a moment to see it."""
MAX_EXPIRY_SEC = 30 * 86_400
SUBJECT_MAX = 4_000

OnExpiry = Literal["reject", "approve"]
OnReject = Literal["value", "fail"]
Outcome = Literal["approved", "rejected", "expired", "denied"]

_NEEDS = frozenset({"human"})
_CHOICES: dict[str, tuple[str, ...]] = {
    "on_expiry": ("reject", "approve"),
    "on_reject": ("value", "fail"),
}


class ApproveCall(BaseModel):
    """What a ``flow.approve`` call sends and the journal stores."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)

    subject: str = Field(min_length=1, max_length=SUBJECT_MAX)
    expires_in: int | None = Field(default=None, ge=MIN_EXPIRY_SEC, le=MAX_EXPIRY_SEC)
    on_expiry: OnExpiry = "reject"
    on_reject: OnReject = "value"


class Decision(BaseModel):
    """The journalled result of a ``flow.approve``: what the workflow receives.
    ``approved`` is False for a rejection, a policy denial, and an expiry with
    ``on_expiry="reject"``; ``reason`` says why (a person's reason, the deadline, the
    policy)."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)

    approved: bool
    outcome: Outcome
    reason: str | None = None
    actor_uid: int | None = None
    request_id: str
    op_id: str


def _expiry(state: ReviewContext, value: ast.expr) -> bool:
    if (
        isinstance(value, ast.Constant)
        and type(value.value) is int
        and MIN_EXPIRY_SEC <= value.value <= MAX_EXPIRY_SEC
    ):
        return True
    state.reject(
        value,
        "flow",
        f"flow.approve expires_in= must be an int literal of seconds from {MIN_EXPIRY_SEC} "
        f"to {MAX_EXPIRY_SEC}, so the review records how long a person has; "
        f"got {ast.unparse(value)!r}",
    )
    return False


def review(state: ReviewContext, call: ast.Call) -> SiteFacts | None:
    ok = True
    if len(call.args) != 1 or isinstance(call.args[0], ast.Starred):
        state.reject(call, "flow", "flow.approve takes one subject: flow.approve(\"Ship it?\", …)")
        ok = False
    for kw in call.keywords:
        if kw.arg == "expires_in":
            ok = _expiry(state, kw.value) and ok
        elif kw.arg in _CHOICES:
            choices = _CHOICES[kw.arg]
            if not (isinstance(kw.value, ast.Constant) and kw.value.value in choices):
                state.reject(
                    kw.value,
                    "flow",
                    f"flow.approve {kw.arg}= must be one of "
                    f"{', '.join(repr(c) for c in choices)} as a literal; "
                    f"got {ast.unparse(kw.value)!r}",
                )
                ok = False
        else:
            state.reject(
                kw.value if kw.arg is None else kw,
                "flow",
                f"flow.approve takes expires_in=, on_expiry= and on_reject=, not "
                f"{'**' if kw.arg is None else kw.arg + '='}",
            )
            ok = False
    return SiteFacts(capabilities=_NEEDS) if ok else None


def request(
    subject: str, expires_in: int | None, on_expiry: str, on_reject: str
) -> JSONObject:
    """What the call sends and the journal stores; refused with a clear error when a value
    is out of bounds (the review checked the literals; this guards the worker's wire)."""
    try:
        call = ApproveCall.model_validate(
            {"subject": subject, "expires_in": expires_in,
             "on_expiry": on_expiry, "on_reject": on_reject}
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UsageError(f"flow.approve {where}: {first['msg']}") from exc
    return call.model_dump(mode="json")


SPECS = (
    OperationSpec(
        kind="approve",
        summary="a person approves or rejects; the workflow receives the decision and why",
        review=review,
    ),
)
