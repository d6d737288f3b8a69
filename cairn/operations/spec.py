"""What a module of :mod:`cairn.operations` registers for its kind: an
:class:`OperationSpec` with the kind's review rule and the facts the coordinator, the
runtime and the views act on.

The review rule sees the review's state through :class:`ReviewContext`, a protocol the
workflow review's state satisfies, so this package never imports the workflow language
(it is loaded wherever the kind literal is).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from cairn.operation_kinds import OperationKind


class AgentFacts(Protocol):
    """What the review knows of a module-level agent descriptor."""

    @property
    def profile(self) -> str: ...

    @property
    def access(self) -> str: ...

    @property
    def network(self) -> str: ...


class ReviewContext(Protocol):
    """The part of one review pass a call-site rule reads and reports to."""

    @property
    def agents(self) -> Mapping[str, AgentFacts]: ...

    @property
    def models(self) -> Collection[str]: ...

    def reject(self, node: ast.AST, rule: str, message: str) -> None: ...

    def str_argument(self, node: ast.expr) -> tuple[str | None, str]:
        """The ``str`` input field ``node`` reads as ``args.<field>`` of the workflow
        function's own, never rebound parameter (so its value is the launch argument's),
        or ``None`` and why it is not one."""
        ...


class OperationRecord(Protocol):
    """One journalled operation, as views read it."""

    @property
    def op_id(self) -> str: ...

    @property
    def scope(self) -> str: ...

    @property
    def seq(self) -> int: ...

    @property
    def kind(self) -> str: ...

    @property
    def request(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Contradiction:
    """Journal records a view cannot reconcile: ``code`` names the kind of contradiction,
    ``op_id`` the operation it was found at (``None``: the run), ``message`` says what
    the records claim. A view reports it and builds nothing on those records."""

    code: str
    op_id: str | None
    message: str


@dataclass(frozen=True)
class SiteFacts:
    """What the review records for an accepted call site besides its kind and place."""

    descriptor: str | None = None
    answer_schema: str | None = None
    capabilities: frozenset[str] = frozenset()


ReviewRule = Callable[[ReviewContext, ast.Call], SiteFacts | None]
"""Check one ``flow.<kind>(...)`` call: its facts, or ``None`` once it rejected the call."""


def needs(*capabilities: str) -> ReviewRule:
    """The rule of a kind with nothing to check: the call needs ``capabilities``."""
    facts = SiteFacts(capabilities=frozenset(capabilities))

    def rule(state: ReviewContext, call: ast.Call) -> SiteFacts:
        return facts

    return rule


@dataclass(frozen=True)
class OperationSpec:
    """One operation kind.

    - ``review``: the call-site rule of the static review (descriptor, answer schema,
      capabilities).
    - ``site_kinds``: the reviewed call sites a call of this kind may belong to (empty:
      its own kind only).
    - ``is_fork``: the call forks lanes, each its own scope; it is answered after the
      join, so a replay never hands its result to the worker at the start.
    - ``is_marker``: no effect; committed at once as ``{"marked": kind}`` so views and
      replay see it.
    - ``leaves_boundary``: it commits an agent boundary with a checkpoint of W.
    - ``carried_out``: ``False`` for a kind this release has no coordinator handler for;
      the review refuses its calls.
    """

    kind: OperationKind
    summary: str
    review: ReviewRule = needs()
    site_kinds: tuple[OperationKind, ...] = ()
    is_fork: bool = False
    is_marker: bool = False
    leaves_boundary: bool = False
    carried_out: bool = True

    @property
    def manifest_kinds(self) -> tuple[OperationKind, ...]:
        """The kinds of the reviewed call sites a call of this kind may match."""
        return self.site_kinds or (self.kind,)
