"""The settlement record: how a run's proposal ended, written by the coordinator (and by
cairnd for a revert) into the journal's ``runs.settlement``, read by the coordinator's
run end, ``cairn show``/``diff``/``ps``, ``cairn doctor``, ``cairn revert`` and the MCP
server. Its JSON is the record's stored form: a key that holds nothing is left out, as
it always was (``held`` only when held, no ``candidate`` when the settlement failed
before one was built)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    JsonValue,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)

from cairn.errors import JournalError
from cairn.protocol.settlement import ApplyConflict, ApplyResult

# applied, conflict, noop: what the apply reported; refused: no path was acceptable;
# verification-failed: a host check of F failed; held: --apply never, or a refused or
# denied --apply ask; waiting: --apply ask, no decision yet; failed: the pool was full.
SettlementStatus = Literal[
    "applied", "conflict", "noop", "refused", "verification-failed", "held", "waiting", "failed"
]
SETTLED_WITHOUT_CONFLICT: tuple[SettlementStatus, ...] = ("applied", "noop")


class _Record(BaseModel):
    """Frozen, closed, and dumped without the keys that hold nothing."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)

    @model_serializer(mode="wrap")
    def _omit_empty(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        data: dict[str, object] = handler(self)
        return {key: value for key, value in data.items() if value is not None}


class AppliedPaths(_Record):
    """What reached the live project; ``status`` is the apply's, absent when none ran."""

    status: Literal["applied", "conflict", "noop"] | None = None
    applied: list[str] = []
    already_applied: list[str] = []
    conflicts: list[ApplyConflict] = []
    # applied with F's content and mode, but without the user.* xattrs F gave them (the
    # live filesystem refused them); absent when every one was kept
    xattrs_not_kept: list[str] | None = None
    # applied as copies, though in F a hard link of another applied path; absent when
    # every link was kept
    links_not_kept: list[str] | None = None

    @classmethod
    def of(cls, result: ApplyResult) -> AppliedPaths:
        return cls(status=result.status, applied=result.applied,
                   already_applied=result.already_applied, conflicts=result.conflicts,
                   xattrs_not_kept=result.xattrs_not_kept or None,
                   links_not_kept=result.links_not_kept or None)

    @property
    def touched(self) -> bool:
        """Whether the live project holds any path of the proposal."""
        return bool(self.applied or self.already_applied)


class Revert(AppliedPaths):
    """``cairn revert``'s apply of Q over F: by whom and when."""

    by_uid: int
    at: float


class Verification(_Record):
    """The host's checks of F, each as ``cairn show`` prints it."""

    # Not walked as JsonValue (nor ``candidate`` below): every ``cairn ps`` reads the
    # record of every run, and a candidate holds every accepted path and the diff.
    checks: list[dict[str, Any]]
    passed: bool

    def first_failed(self) -> dict[str, Any] | None:
        return next((c for c in self.checks if not c.get("passed")), None)


class SettlementRecord(_Record):
    """The whole record. ``candidate`` is the settle-candidate receipt's data (what went
    into C, what was refused or ignored, F and the diff)."""

    status: SettlementStatus
    candidate: dict[str, Any] | None = None
    verification: Verification | None = None
    held: str | None = None
    error: str | None = None
    apply: AppliedPaths = AppliedPaths()
    revert: Revert | None = None

    @classmethod
    def read(cls, stored: object) -> SettlementRecord | None:
        """The record the journal keeps for a run (None: not settled, or not yet)."""
        if stored is None:
            return None
        try:
            return cls.model_validate(stored)
        except ValidationError as exc:
            raise JournalError(
                f"the journal holds a settlement record this version cannot read: "
                f"{exc.errors()[0]['msg']}",
                hint="see 'cairn doctor'; the run's checkpoints are unaffected",
            ) from None

    def candidate_list(self, key: str) -> list[JsonValue]:
        """A list of the candidate (``accepted``, ``refused``, ``ignored``); [] without."""
        value = (self.candidate or {}).get(key)
        return value if isinstance(value, list) else []

    def stored(self) -> dict[str, JsonValue]:
        """The JSON the journal keeps."""
        return self.model_dump(mode="json")
