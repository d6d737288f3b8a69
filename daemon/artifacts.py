"""``cairn artifacts``: what a run's agents published, and the content of one artifact.

The list comes from the journal (each agent operation's result records what its boundary
collected, :mod:`cairn.artifacts`); the content from the boundary's copy, which only
cairnd's own user wrote, opened all the same without following a link and checked
against the size and hash the journal recorded before it is sent.
"""

from __future__ import annotations

import base64
import hashlib
import os

from pydantic import ValidationError

from cairn import paths, untrusted
from cairn.artifacts import ARTIFACTS, MAX_FILE_BYTES
from cairn.daemon.views import visible_run
from cairn.errors import CairnError, NotFound, UsageError
from cairn.journal.readwrite import Journal
from cairn.journal.rows import OpRow
from cairn.journal.snapshot import read_snapshot, readable_ops
from cairn.protocol.agent import Artifact, Artifacts
from cairn.protocol.daemon import ArtifactsRequest
from cairn.protocol.jsonvalue import JSONObject
from cairn.protocol.replies import ArtifactContent, ArtifactsReply, OperationArtifacts
from cairn.terminal import printable


def artifacts(journal: Journal, request: ArtifactsRequest, uid: int) -> JSONObject:
    """Every agent operation's artifacts (of ``op_id`` only), :class:`ArtifactsReply`; or
    with ``name`` one artifact's content, :class:`ArtifactContent`."""
    with read_snapshot(journal):
        row = visible_run(journal, request.run_id, uid)
        ops, _unreadable = readable_ops(journal, row.run_id)
    if request.op_id is not None:
        ops = [o for o in ops if o.op_id == request.op_id]
        if not ops:
            raise NotFound(f"run {row.run_id} has no operation {request.op_id}",
                           hint=f"see its operations with 'cairn show {row.run_id}'")
    if request.name is None:
        listed = []
        for o in (o for o in ops if o.kind == "agent"):
            kept = recorded(o)
            listed.append(OperationArtifacts(op_id=o.op_id, files=kept.files,
                                             refused=kept.refused,
                                             refused_total=kept.refused_total))
        return ArtifactsReply(run_id=row.run_id, operations=listed).model_dump(mode="json")
    if request.op_id is None:
        raise UsageError("an artifact is named with its operation",
                         hint=f"cairn artifacts {row.run_id} OP NAME")
    (op,) = ops
    wanted = next((a for a in recorded(op).files if a.name == request.name), None)
    if wanted is None:
        raise NotFound(f"operation {op.op_id} of run {row.run_id} published no artifact "
                       f"{printable(request.name)}",
                       hint=f"list them with 'cairn artifacts {row.run_id} {op.op_id}'")
    data = read_content(row.run_id, op.op_id, wanted)
    return ArtifactContent(
        run_id=row.run_id, op_id=op.op_id, name=wanted.name, size=wanted.size,
        sha256=wanted.sha256, content_base64=base64.b64encode(data).decode(),
    ).model_dump(mode="json")


def recorded(op: OpRow) -> Artifacts:
    """What the operation's result says its boundary collected (none for an operation
    that has not reached its boundary)."""
    raw = (op.result or {}).get("artifacts")
    if raw is None:
        return Artifacts()
    try:
        return Artifacts.model_validate(raw)
    except ValidationError:
        raise CairnError(f"the journal's record of {op.op_id}'s artifacts is unreadable",
                         hint="see 'cairn doctor'") from None


def read_content(run_id: str, op_id: str, artifact: Artifact) -> bytes:
    """The boundary's copy of ``artifact``, as recorded (hard links are the evidence that
    later agents of the run read)."""
    base = paths.run_state_dir(run_id) / "boundaries" / op_id / ARTIFACTS
    try:
        data = untrusted.read_bytes(base, artifact.name, owner=os.getuid(),
                                    limit=MAX_FILE_BYTES, single_link=False)
    except untrusted.UntrustedFileMissing:
        raise NotFound(f"artifact {printable(artifact.name)} of {op_id} is no longer stored",
                       hint="the run's files were removed ('cairn rm' or retention)") from None
    if len(data) != artifact.size or hashlib.sha256(data).hexdigest() != artifact.sha256:
        raise CairnError(f"artifact {printable(artifact.name)} of {op_id} changed after it "
                         "was collected", hint="see 'cairn doctor'")
    return data
