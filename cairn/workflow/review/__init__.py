"""Static review of a workflow module (ARCHITECTURE §4.2).

:func:`review_source` parses the source with :mod:`ast`; it never imports or executes it.
It rejects everything outside the workflow subset, extracts the typed models and agent
descriptors, lists every ``flow.*`` call site with the capabilities it needs (the effect
manifest) and computes the ``review_hash`` a person confirms before installing.

Decisions that the rules below encode:

- Imports: ``from cairn.workflow import ...`` (``agent``, ``workflow``, ``Field``, ``Model``,
  ``OperationFailed``, under their own names), ``from __future__ import annotations``, and
  the pure modules in :data:`PURE_MODULES`. ``datetime``, ``time``, ``random``,
  ``statistics`` (``NormalDist.samples`` draws random numbers) and every module with I/O,
  threads or an event loop are refused. A pure module is used through its public members
  only (``math.sqrt``), never as an object, and members that are modules, private, able to
  evaluate strings or endless (``itertools.count``) are refused.
- Loops: ``for`` over finite values, and ``while`` only with a literal bound the review
  can see (:mod:`~cairn.workflow.review.loops`: a counter set to an int right before the
  loop, compared with an int in its test, raised first in its body, bound nowhere else);
  ``for _ in range(N)`` and ``flow.repeat_until`` say the same with the bound in sight.
- ``try``: handlers may name only classes known to derive from ``Exception`` (builtin
  ones, exceptions of the allowed modules, ``OperationFailed``), so the runtime's suspend
  and cancel signals (``BaseException``) always pass through; ``finally`` may not
  ``return``/``break``/``continue``, which would swallow them too.
- Decorators: only ``@workflow(...)`` on the workflow function; classes: only
  module-level ``class X(Model)`` with fields from the closed annotation set. A field's
  ``default_factory`` is ``list``, ``dict`` or a model of the module, fitting its type.
- ``.format`` only on a string literal whose fields are plain positions or names
  (``.attr`` and ``[key]`` in a field reach attributes); ``format_map`` never.
- The ``flow`` object (the workflow function's first parameter) is used only as
  ``flow.<operation>(...)`` or passed to a function of the module whose parameter has the
  same name, so every call site is visible here.
- The hash covers the runtime API version, the source and the manifest, not the
  filename: the same reviewed text keeps its confirmation wherever it is installed
  (``user:``, ``project:``, a draft path); the install step records the name separately.

Where each rule group lives in this package:

- :mod:`~cairn.workflow.review.subset`: the allowed modules, members and names;
- :mod:`~cairn.workflow.review.module`: imports and the module-level statements, the
  ``@workflow`` function;
- :mod:`~cairn.workflow.review.model_classes`: ``class X(Model)`` bodies and ``Field(...)``;
- :mod:`~cairn.workflow.review.agents`: ``agent(...)`` descriptors (network rules in
  :mod:`cairn.netpolicy`);
- :mod:`~cairn.workflow.review.bindings`: no reserved name is rebound;
- :mod:`~cairn.workflow.review.statements`: every statement and expression;
- :mod:`~cairn.workflow.review.formats`: ``.format`` on a literal string, field by field;
- :mod:`~cairn.workflow.review.calls`: ``flow.*`` call sites and their capabilities;
- :mod:`~cairn.workflow.review.manifest`: the result, its hash and its text;
- :mod:`~cairn.workflow.review.state` and :mod:`~cairn.workflow.review.nodes`: what the
  passes share.
"""

from __future__ import annotations

import ast
import hashlib
import logging

from cairn.canonical import canonical_json
from cairn.workflow import RUNTIME_API_VERSION
from cairn.workflow.review.bindings import review_bindings
from cairn.workflow.review.calls import FLOW_KINDS
from cairn.workflow.review.manifest import (
    AgentEntry,
    CallSite,
    Review,
    ReviewRejected,
    Violation,
    WorkflowEntry,
    build_manifest,
    compute_review_hash,
    render_review,
)
from cairn.workflow.review.module import review_module_level
from cairn.workflow.review.state import ReviewState
from cairn.workflow.review.statements import review_statements
from cairn.workflow.review.subset import PURE_MODULES

__all__ = [
    "FLOW_KINDS",
    "PURE_MODULES",
    "AgentEntry",
    "CallSite",
    "Review",
    "ReviewRejected",
    "Violation",
    "WorkflowEntry",
    "canonical_json",
    "compute_review_hash",
    "render_review",
    "review_source",
]

log = logging.getLogger(__name__)


def review_source(source: str, *, filename: str) -> Review:
    """Review ``source`` statically; raise :class:`ReviewRejected` listing every violation."""
    try:
        tree = ast.parse(source, filename=filename, type_comments=False)
    except SyntaxError as exc:
        violation = Violation(
            line=exc.lineno or 1,
            col=exc.offset or 1,
            rule="syntax",
            message=f"not valid Python: {exc.msg}",
        )
        raise ReviewRejected(filename, [violation]) from None
    state = ReviewState(tree)
    review_module_level(state)
    review_bindings(state)
    review_statements(state)
    state.calls.sort(key=lambda c: (c.line, c.col))
    if state.violations:
        violations = sorted(state.violations, key=lambda v: (v.line, v.col, v.rule))
        raise ReviewRejected(filename, violations)
    assert state.workflow is not None  # a missing workflow is a violation above
    calls = state.calls
    capabilities = sorted({c for call in calls for c in call.capabilities})
    manifest = build_manifest(state.workflow, state.agents, state.models, calls, capabilities)
    review_hash = compute_review_hash(source, manifest)
    review = Review(
        api_version=RUNTIME_API_VERSION,
        filename=filename,
        source_sha256=hashlib.sha256(source.encode()).hexdigest(),
        workflow=state.workflow,
        agents=state.agents,
        models=state.models,
        calls=calls,
        capabilities=capabilities,
        review_hash=review_hash,
    )
    log.debug("reviewed %s: %d calls, hash %s", filename, len(calls), review_hash)
    return review
