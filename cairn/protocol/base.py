"""What every protocol module shares: the frozen, closed base model and the identifier
types (the patterns themselves are in :mod:`cairn.protocol.names`, without pydantic)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from cairn.protocol.names import LANE_KEY_PATTERN, OP_ID_PATTERN, RUN_ID_PATTERN, SCOPE_PATTERN


def build_loaded_models() -> int:
    """Build now every Cairn model loaded so far whose build was deferred; return how many.

    Cairn's models defer their build to their first use (``defer_build=True``): a process
    pays only for the models it uses. Pydantic's build on first use is not thread-safe,
    so a process that uses models from several threads (cairnd, the broker, the
    coordinator, ``cairn mcp``) calls this once its modules are imported and before it
    starts them."""
    pending = [
        model
        for model in _subclasses(BaseModel)
        if model.__module__.split(".")[0] == "cairn" and not model.__pydantic_complete__
    ]
    for model in pending:
        model.model_rebuild()
    return len(pending)


def _subclasses(cls: type[BaseModel]) -> set[type[BaseModel]]:
    found: set[type[BaseModel]] = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_subclasses(sub)}
    return found


class Frozen(BaseModel):
    """Immutable, and no key the model does not declare."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)


RunId = Annotated[str, Field(pattern=RUN_ID_PATTERN)]
ScopeId = Annotated[str, Field(pattern=SCOPE_PATTERN)]
OpId = Annotated[str, Field(pattern=OP_ID_PATTERN)]
LaneKey = Annotated[str, Field(pattern=LANE_KEY_PATTERN)]
