"""What a passed review produces: the effect manifest, its ``review_hash`` and its text.

:class:`Review` is the manifest (workflow entry, agent descriptors, models, ``flow.*`` call
sites and capabilities); :func:`compute_review_hash` is what a person confirms, taken over
the canonical JSON (:mod:`cairn.canonical`) of the API version, the source and the manifest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

from cairn.canonical import canonical_json
from cairn.errors import CairnError
from cairn.netpolicy import NetworkMode
from cairn.operation_kinds import OperationKind
from cairn.protocol.jsonvalue import JSONObject, JSONValue
from cairn.workflow import RUNTIME_API_VERSION
from cairn.workflow.schema import ModelSpec

MAX_REPORTED = 3


class _Frozen(BaseModel):
    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)


class Violation(_Frozen):
    """One rule broken at one place (``col`` is 1-based)."""

    line: int
    col: int
    rule: str
    message: str

    def render(self, filename: str) -> str:
        """``file:line:col: message [rule]``."""
        return f"{filename}:{self.line}:{self.col}: {self.message} [{self.rule}]"


class ReviewError(CairnError):
    """A workflow definition failed static review."""

    code = "review"


class ReviewRejected(ReviewError):
    """Review refused a workflow; ``violations`` lists every reason, in source order."""

    def __init__(self, filename: str, violations: list[Violation]) -> None:
        shown = "; ".join(v.render(filename) for v in violations[:MAX_REPORTED])
        more = len(violations) - MAX_REPORTED
        if more > 0:
            shown += f" (and {more} more)"
        super().__init__(shown, hint="fix the workflow source and run the review again")
        self.filename = filename
        self.violations = violations


class WorkflowEntry(_Frozen):
    """The ``@workflow`` function: its name, description and input/output model names, and
    the project paths its proposal may change (``write_paths``; None: not declared, so
    any path the host policy allows)."""

    function: str
    description: str
    input: str
    output: str
    write_paths: list[str] | None = None

    @model_serializer(mode="wrap")
    def _undeclared_left_out(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        """An undeclared ``write_paths`` is not written, so older reviews keep their hash."""
        data: dict[str, object] = handler(self)
        if data.get("write_paths") is None:
            data.pop("write_paths", None)
        return data


class AgentEntry(_Frozen):
    """One module-level agent descriptor, as written."""

    profile: str
    access: Literal["read", "write"]
    network: NetworkMode
    output: str
    allowlist: tuple[str, ...] = ()


class CallSite(_Frozen):
    """One ``flow.*`` call: where it is, what it calls and what it needs.

    ``line``/``col`` (1-based) are the start of the call expression, i.e. of ``flow``.
    ``answer_schema`` names the answer model of ``flow.ask(..., schema=X)``.
    """

    kind: OperationKind
    line: int
    col: int
    descriptor: str | None = None
    answer_schema: str | None = None
    capabilities: list[str] = []


class Review(_Frozen):
    """The result of a passed review: the effect manifest and its hash."""

    api_version: str
    filename: str
    source_sha256: str
    workflow: WorkflowEntry
    agents: dict[str, AgentEntry]
    models: dict[str, ModelSpec]
    calls: list[CallSite]
    capabilities: list[str]
    review_hash: str

    def manifest(self) -> dict[str, Any]:
        """Everything the hash covers besides the source and the API version."""
        return build_manifest(
            self.workflow, self.agents, self.models, self.calls, self.capabilities
        )


def compute_review_hash(source: str, manifest: Mapping[str, JSONValue]) -> str:
    """``sha256:`` over the canonical JSON of the API version, the source and the manifest."""
    document = {"api_version": RUNTIME_API_VERSION, "source": source, "manifest": manifest}
    return "sha256:" + hashlib.sha256(canonical_json(document).encode()).hexdigest()


def render_review(review: Review) -> str:
    """The text ``cairn workflow review FILE`` prints; the hash is the last line."""
    wf = review.workflow
    lines = [
        f"workflow      {wf.function}  ({review.filename})",
        f"description   {wf.description}",
        *([f"write paths   {', '.join(wf.write_paths)}"] if wf.write_paths else []),
        f"api           {review.api_version}",
        f"input         {wf.input}",
        *_render_fields(review.models, wf.input),
        f"output        {wf.output}",
        *_render_fields(review.models, wf.output),
    ]
    lines.append("agents" if review.agents else "agents        (none)")
    for name, entry in sorted(review.agents.items()):
        text = (
            f"  {name}  profile={entry.profile} access={entry.access} "
            f"network={entry.network} output={entry.output}"
        )
        if entry.allowlist:
            text += " allowlist=" + ",".join(entry.allowlist)
        lines.append(text)
    lines.append("calls" if review.calls else "calls         (none)")
    width = max((len(str(c.line)) for c in review.calls), default=1)
    kind_width = max((len(c.kind) for c in review.calls), default=1)
    for call in review.calls:
        target = call.descriptor or call.answer_schema or "-"
        lines.append(
            f"  line {call.line:<{width}}  {call.kind:<{kind_width}}  {target}  "
            f"[{', '.join(call.capabilities)}]"
        )
        for capability in call.capabilities:
            if capability.startswith("evaluator:$args."):
                field = capability.removeprefix("evaluator:$args.")
                lines.append(
                    f"  {'':<{width + 5}}  measures with the host evaluator named by the "
                    f"argument {field!r}"
                )
    lines.append("capabilities  " + (", ".join(review.capabilities) or "(none)"))
    lines.append(f"review_hash: {review.review_hash}")
    return "\n".join(lines)


def _render_fields(models: dict[str, ModelSpec], name: str) -> list[str]:
    spec = models.get(name)
    return [f"  {field.render()}" for field in spec.fields] if spec else []


def build_manifest(
    workflow: WorkflowEntry,
    agents: dict[str, AgentEntry],
    models: dict[str, ModelSpec],
    calls: list[CallSite],
    capabilities: list[str],
) -> JSONObject:
    return {
        "workflow": workflow.model_dump(mode="json"),
        "agents": {k: v.model_dump(mode="json") for k, v in agents.items()},
        "models": {k: v.model_dump(mode="json") for k, v in models.items()},
        "calls": [c.model_dump(mode="json") for c in calls],
        "capabilities": list(capabilities),
    }
