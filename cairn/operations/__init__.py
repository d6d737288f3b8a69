"""Operation kinds: one module per kind, registered in one table.

Each module of this package (:mod:`~cairn.operations.agent`, :mod:`~cairn.operations.ask`,
:mod:`~cairn.operations.approve`, :mod:`~cairn.operations.fork`,
:mod:`~cairn.operations.unroll`, :mod:`~cairn.operations.repeat_until`,
:mod:`~cairn.operations.measure_proposal`, :mod:`~cairn.operations.settle_experiment`,
:mod:`~cairn.operations.restore`) holds for its kinds the review rule, the request the
runtime sends and the journal stores, what views show, and the flags the coordinator
dispatches on; it exports them as ``SPECS``. :data:`KINDS` maps every :data:`OperationKind`
to its :class:`OperationSpec`. The coordinator's handlers are in
:mod:`cairn.coordinator.dispatch` (process code stays out of the library).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType, ModuleType
from typing import TypeGuard, get_args

from cairn.operation_kinds import OperationKind
from cairn.operations import (
    agent,
    approve,
    ask,
    fork,
    measure_proposal,
    repeat_until,
    restore,
    settle_experiment,
    unroll,
)
from cairn.operations.agent import AGENT
from cairn.operations.spec import OperationSpec, ReviewContext, SiteFacts

ALL_KINDS: tuple[OperationKind, ...] = get_args(OperationKind)

MODULES: tuple[ModuleType, ...] = (
    agent,
    fork,
    unroll,
    ask,
    approve,
    measure_proposal,
    settle_experiment,
    repeat_until,
    restore,
)


def _registry() -> Mapping[OperationKind, OperationSpec]:
    specs: dict[OperationKind, OperationSpec] = {}
    for module in MODULES:
        for spec in module.SPECS:
            if spec.kind in specs:
                raise RuntimeError(f"operation kind {spec.kind} is registered twice")
            specs[spec.kind] = spec
    missing = set(ALL_KINDS) - set(specs)
    if missing:
        raise RuntimeError(f"operation kinds without a module: {sorted(missing)}")
    return MappingProxyType({kind: specs[kind] for kind in ALL_KINDS})


KINDS: Mapping[OperationKind, OperationSpec] = _registry()

FORK_KINDS: tuple[OperationKind, ...] = tuple(k for k, s in KINDS.items() if s.is_fork)
MARKER_KINDS: tuple[OperationKind, ...] = tuple(k for k, s in KINDS.items() if s.is_marker)
BOUNDARY_KINDS: tuple[OperationKind, ...] = tuple(
    k for k, s in KINDS.items() if s.leaves_boundary
)
AVAILABLE_KINDS: tuple[OperationKind, ...] = tuple(k for k, s in KINDS.items() if s.carried_out)
"""The kinds this release carries out: the only ones the review accepts."""


def is_kind(name: str) -> TypeGuard[OperationKind]:
    """Whether ``name`` is an operation kind (``flow.<name>`` is an operation)."""
    return name in ALL_KINDS


def spec_of(kind: OperationKind) -> OperationSpec:
    """The spec of ``kind``."""
    return KINDS[kind]


__all__ = [
    "AGENT",
    "ALL_KINDS",
    "AVAILABLE_KINDS",
    "BOUNDARY_KINDS",
    "FORK_KINDS",
    "KINDS",
    "MARKER_KINDS",
    "MODULES",
    "OperationKind",
    "OperationSpec",
    "ReviewContext",
    "SiteFacts",
    "is_kind",
    "spec_of",
]
