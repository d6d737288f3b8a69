"""What every protocol module shares: the frozen, closed base model and the identifier
patterns (run, scope, operation, lane, intent, verifier and evaluator)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

RUN_ID_RE = re.compile(r"^flow_[0-9a-f]{32}$")
# Lane scopes are named after their fork and key ("root-2-a"), so nesting lengthens them.
SCOPE_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,119}$")
OP_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,127}$")
LANE_KEY_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,30}$")
INTENT_ID_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{0,80}$")
VERIFIER_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


class Frozen(BaseModel):
    """Immutable, and no key the model does not declare."""

    model_config = ConfigDict(extra="forbid", frozen=True)


RunId = Annotated[str, Field(pattern=RUN_ID_RE.pattern)]
ScopeId = Annotated[str, Field(pattern=SCOPE_RE.pattern)]
OpId = Annotated[str, Field(pattern=OP_ID_RE.pattern)]
LaneKey = Annotated[str, Field(pattern=LANE_KEY_RE.pattern)]
