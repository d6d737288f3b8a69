"""What every protocol module shares: the frozen, closed base model and the identifier
types (the patterns themselves are in :mod:`cairn.protocol.names`, without pydantic)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from cairn.protocol.names import INTENT_ID_RE as INTENT_ID_RE
from cairn.protocol.names import LANE_KEY_RE, OP_ID_RE, RUN_ID_RE, SCOPE_RE
from cairn.protocol.names import VERIFIER_NAME_RE as VERIFIER_NAME_RE


class Frozen(BaseModel):
    """Immutable, and no key the model does not declare."""

    model_config = ConfigDict(extra="forbid", frozen=True)


RunId = Annotated[str, Field(pattern=RUN_ID_RE.pattern)]
ScopeId = Annotated[str, Field(pattern=SCOPE_RE.pattern)]
OpId = Annotated[str, Field(pattern=OP_ID_RE.pattern)]
LaneKey = Annotated[str, Field(pattern=LANE_KEY_RE.pattern)]
