"""The root broker's protocol: the intents the daemon and a coordinator record for it, the
receipts it keeps of what it did (with one body model per intent kind), and its one-line
reply on the broker socket."""

from __future__ import annotations

import base64
import hashlib
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import ConfigDict, Field, JsonValue

from cairn.protocol.base import Frozen, LaneKey, OpId, RunId, ScopeId
from cairn.protocol.measurement import EvaluatorRun, MeasurementEnvironment
from cairn.protocol.names import INTENT_ID_PATTERN
from cairn.protocol.settlement import AppliedCheck, ApplyResult, RefusedPath

Verb = Literal["launch-v1", "storage-v1", "delete-v1"]

IntentKind = Literal[
    "start-coordinator",
    "prepare-q",
    "create-w",
    "drop-w",
    "make-spare",
    "fork",
    "verify-storage",
    "start-agent",
    "stop-agent",
    "checkpoint",
    "freeze-proposal",
    "settle-candidate",
    "start-apply",
    "start-revert",
    "check-applied",
    "verify-proposal",
    "measure-checkpoint",
    "delete-run",
]

VERB_OF_KIND: dict[str, Verb] = {
    "start-coordinator": "launch-v1",
    "start-agent": "launch-v1",
    "stop-agent": "launch-v1",
    "start-apply": "launch-v1",
    "start-revert": "launch-v1",
    "check-applied": "launch-v1",
    "verify-proposal": "launch-v1",
    "measure-checkpoint": "launch-v1",
    "prepare-q": "storage-v1",
    "create-w": "storage-v1",
    "drop-w": "storage-v1",
    "make-spare": "storage-v1",
    "fork": "storage-v1",
    "verify-storage": "storage-v1",
    "checkpoint": "storage-v1",
    "freeze-proposal": "storage-v1",
    "settle-candidate": "storage-v1",
    "delete-run": "delete-v1",
}

# What cairnd may still ask of a run that has ended. Every other intent of an ended run is a
# leftover of it (a settlement step a full pool stopped, say): the broker never carries
# it out afterwards, so a later check of the run cannot redo the run's work.
AFTER_END_KINDS: frozenset[str] = frozenset(
    {"check-applied", "start-revert", "verify-storage", "delete-run"}
)


class Intent(Frozen):
    """What a coordinator or the daemon wants the broker to do. Paths are never given:
    the broker derives them from the run, scope and op IDs."""

    intent_id: str = Field(pattern=INTENT_ID_PATTERN)
    run_id: RunId
    kind: IntentKind
    scope: ScopeId = "root"
    op_id: OpId | None = None
    generation: int = 1
    attempt: int = 1
    from_checkpoint: OpId | None = None
    lanes: list[LaneKey] = []


class EvidenceIndex(Frozen):
    """What root reads of an agent operation's ``evidence/index.json`` (the coordinator
    writes it): the operations whose checkpoints the agent gets read-only."""

    model_config = ConfigDict(defer_build=True, extra="ignore", frozen=True, strict=True)

    incoming: list[OpId] = Field(default=[], max_length=10_000)


class SubvolumeReceipt(Frozen):
    """What the broker records of a subvolume it made; later steps are checked against it."""

    path: str
    subvol_id: int
    uuid: str
    fsid: str
    read_only: bool
    generation: int


RAW_LIMIT = 4 << 20  # the most bytes one RawBytes holds: receipts travel in 16 MiB replies


class RawBytes(Frozen):
    """Bytes a less trusted process wrote (a helper unit that runs as the run's owner)
    that root only records: base64, their size and sha256. Root never parses them; the
    reader checks the hash before it parses (``cairn/rawbytes.py``)."""

    b64: str = Field(max_length=4 * (RAW_LIMIT // 3 + 1))
    size: int = Field(ge=0, le=RAW_LIMIT)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    truncated: bool = False  # only the last ``size`` bytes were kept

    @classmethod
    def of(cls, data: bytes, *, limit: int = RAW_LIMIT) -> RawBytes:
        """The last ``limit`` bytes of ``data``, recorded as they are."""
        kept = data[-limit:] if len(data) > limit else data
        return cls(
            b64=base64.b64encode(kept).decode("ascii"),
            size=len(kept),
            sha256=hashlib.sha256(kept).hexdigest(),
            truncated=len(kept) < len(data),
        )


# --- receipt bodies: what each intent kind did --------------------------------------
# Field names and order are the receipt's JSON; a key some receipts leave out is listed in
# ``optional_keys`` and left out when it is None. Keys added after a kind's first version
# have defaults, so receipts an earlier broker wrote still read.


class ReceiptBody(Frozen):
    optional_keys: ClassVar[tuple[str, ...]] = ()

    def wire(self) -> dict[str, JsonValue]:
        """The body as the receipt's ``data``."""
        data = self.model_dump(mode="json", by_alias=True)
        for key in self.optional_keys:
            if data.get(key) is None:
                data.pop(key, None)
        return data

    def subvolumes(self) -> list[SubvolumeReceipt]:
        """Every subvolume this receipt records (``verify-storage`` checks them)."""
        return [
            value
            for value in (getattr(self, name) for name in type(self).model_fields)
            if isinstance(value, SubvolumeReceipt)
        ]


class CoordinatorStarted(ReceiptBody):
    unit: str


class ImportDone(Frozen):
    """The import unit of a prepare-q and the statistics it wrote, as it wrote them
    (``stats_raw``); a receipt from before holds them parsed by root (``stats``)."""

    unit: str
    invocation_id: str = ""
    stats_raw: RawBytes | None = None
    stats: dict[str, JsonValue] | None = None


class QPrepared(ReceiptBody):
    """prepare-q: Q, snapshotted from the project's subvolume or made by an import unit
    (``import``: that unit and its statistics), or reminted from a replay's source."""

    optional_keys = ("import", "reminted")

    q: SubvolumeReceipt
    subpath: str
    imported: bool
    import_: ImportDone | None = Field(default=None, alias="import")
    project_ino: int
    # A replayed run's Q is its source's Q reminted; so is each imported operation's
    # checkpoint S, by operation ID (cairn replay).
    reminted: dict[str, SubvolumeReceipt] | None = None

    def subvolumes(self) -> list[SubvolumeReceipt]:
        return [self.q, *(self.reminted or {}).values()]

    def wire(self) -> dict[str, JsonValue]:
        data = super().wire()
        if self.import_ is not None:  # the keys it was given: a receipt from before as it was
            data["import"] = self.import_.model_dump(mode="json", exclude_unset=True)
        return data


class WCreated(ReceiptBody):
    w: SubvolumeReceipt
    source_uuid: str | None = None  # what W snapshots: Q or a checkpoint S (None: older)


class WDropped(ReceiptBody):
    deleted: str


class ForkLane(Frozen):
    w: SubvolumeReceipt


class Forked(ReceiptBody):
    """fork: S of the parent's W, and one W per lane key."""

    s: SubvolumeReceipt
    op_id: str
    lanes: dict[str, ForkLane]

    def subvolumes(self) -> list[SubvolumeReceipt]:
        return [self.s, *(lane.w for lane in self.lanes.values())]


class StorageVerified(ReceiptBody):
    """verify-storage (``deleted`` once the run's storage is gone)."""

    optional_keys = ("deleted",)

    problems: list[str]
    checked: int
    deleted: bool | None = None


class AgentStarted(ReceiptBody):
    unit: str
    invocation_id: str
    control_group: str
    attempt: int
    capsule: str = ""
    op_id: str


class AgentStopped(ReceiptBody):
    """stop-agent: ``result_file`` says whether the agent had written its result."""

    unit: str
    stopped: bool = True
    result_file: bool = False


class Checkpointed(ReceiptBody):
    """checkpoint: S of the operation's W, and ``changed``: whether S differs in more
    than file times from the subvolume the agent's W held when it began (the scope's
    previous checkpoint of the same W, else the one W was made from); absent when the
    broker could not tell."""

    optional_keys = ("changed",)

    s: SubvolumeReceipt
    op_id: str
    changed: bool | None = None


class ProposalFrozen(ReceiptBody):
    p: SubvolumeReceipt


class CandidateBuilt(ReceiptBody):
    """settle-candidate: the candidate unit that built C, what went into C and what did
    not (``refused``: path and reason; ``ignored``: a profile's ``settle_ignore``, absent
    when there was none), F, and the diff of the accepted paths."""

    optional_keys = ("unit", "invocation_id", "ignored")

    unit: str | None = None
    invocation_id: str | None = None
    accepted: list[str]
    refused: list[RefusedPath]
    ignored: list[str] | None = None
    bytes_accepted: int
    f: SubvolumeReceipt
    c: SubvolumeReceipt
    inventories_equal: bool = False
    diff: str


CHECK_OUTPUT_LIMIT = 16 << 10


class CheckResult(Frozen):
    """One verifier's run over a snapshot of F: its unit, how it ended (systemd's result
    and the exit status) and the last bytes it printed, as it printed them
    (``output_raw``); a receipt from before holds root's decoding of them (``output``)."""

    name: str
    unit: str
    invocation_id: str
    passed: bool
    result: str
    exit_status: int
    output_raw: RawBytes | None = None
    output: str = Field(default="", max_length=CHECK_OUTPUT_LIMIT)


class ProposalVerified(ReceiptBody):
    """verify-proposal: the host's checks of F, in order, up to the first that failed."""

    checks: list[CheckResult]
    passed: bool


class TrialChecked(Frozen):
    """The check of a measured W: the owner's unit that judged W's changes since Q as the
    settlement would, and its result, recorded unparsed (a ``TrialCheck`` to cairn)."""

    unit: str
    invocation_id: str
    result_raw: RawBytes


class MeasurementTaken(ReceiptBody):
    """measure-checkpoint: the evaluator's runs over a disposable writable snapshot of W
    (warm-ups, then samples), the values of each sample, and where they were measured.
    ``error``: why the measurement has no samples (a run failed or printed no metric line);
    the runs stop there, and ``output_raw`` is the last bytes that run printed (a receipt
    from before has root's decoding of them at the end of ``error``). ``trial``: the check
    of what W changed, for a measurement with samples (a receipt from before has none)."""

    optional_keys = ("output_raw", "trial")

    op_id: str
    environment: MeasurementEnvironment
    runs: list[EvaluatorRun]
    samples: list[dict[str, float]]
    error: str = Field(default="", max_length=CHECK_OUTPUT_LIMIT)
    output_raw: RawBytes | None = None
    trial: TrialChecked | None = None


class ApplyDone(ReceiptBody):
    """start-apply and start-revert: the apply unit and its result (a revert is an apply
    from F back to Q). Root acts on an apply's result (check-applied reads its paths), so
    it is parsed at the edge (``result``); a revert's it only records (``result_raw``;
    a revert receipt from before holds ``result``)."""

    optional_keys = ("result", "result_raw")

    unit: str
    invocation_id: str
    result: ApplyResult | None = None
    result_raw: RawBytes | None = None


class AppliedChecked(ReceiptBody):
    """check-applied: the unit and the result it wrote, recorded, not parsed
    (``result_raw``; a receipt from before holds ``result``)."""

    optional_keys = ("result", "result_raw")

    unit: str
    invocation_id: str
    result: AppliedCheck | None = None
    result_raw: RawBytes | None = None


class RunDeleted(ReceiptBody):
    optional_keys = ("reclaim_pending",)
    deleted: list[str]
    proxy_removed: bool = False
    reclaim_pending: int | None = None  # subvolumes Btrfs still reclaimed when root stopped waiting


BODY_OF_KIND: dict[str, type[ReceiptBody]] = {
    "start-coordinator": CoordinatorStarted,
    "prepare-q": QPrepared,
    "create-w": WCreated,
    "drop-w": WDropped,
    "make-spare": WCreated,
    "fork": Forked,
    "verify-storage": StorageVerified,
    "start-agent": AgentStarted,
    "stop-agent": AgentStopped,
    "checkpoint": Checkpointed,
    "freeze-proposal": ProposalFrozen,
    "settle-candidate": CandidateBuilt,
    "start-apply": ApplyDone,
    "start-revert": ApplyDone,
    "check-applied": AppliedChecked,
    "verify-proposal": ProposalVerified,
    "measure-checkpoint": MeasurementTaken,
    "delete-run": RunDeleted,
}

B = TypeVar("B", bound=ReceiptBody)


class Receipt(Frozen):
    """The broker's record that an intent was carried out; ``data`` is the body of its
    kind (:data:`BODY_OF_KIND`) as JSON."""

    intent_id: str
    run_id: RunId
    kind: IntentKind
    data: dict[str, Any]
    at: float

    def body(self, model: type[B]) -> B:
        """``data`` as ``model``, which must be the body of this receipt's kind."""
        if BODY_OF_KIND[self.kind] is not model:
            raise TypeError(f"a {self.kind} receipt has no {model.__name__} body")
        return model.model_validate(self.data)

    def typed_body(self) -> ReceiptBody:
        """``data`` as the body model of this receipt's kind."""
        return BODY_OF_KIND[self.kind].model_validate(self.data)


class BrokerReply(Frozen):
    ok: bool
    receipts: list[Receipt] = []
    error: str | None = None
    code: str | None = None
    hint: str | None = None  # sent only when there is one: older clients forbid the key
