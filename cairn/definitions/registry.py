"""The registry (``registry.json``): which definitions models may start, each pinned to the
review hash it had when a person exposed it. Only installed ``user:`` and ``builtin:``
definitions can be exposed; a draft or a ``project:`` definition never is. The file is read
strictly: an unknown key or a malformed entry refuses every command that reads it."""

from __future__ import annotations

from cairn.definitions.files import read_record, registry_path, write_record
from cairn.errors import NotFound, UsageError
from cairn.protocol.definitions import DEFINITION_RE, ExposedDefinition, Registry

REGISTRY_FIX = "fix or remove it; 'cairn workflow expose' writes a valid one"


def load_registry() -> Registry:
    return read_record(registry_path(), Registry, "registry", REGISTRY_FIX) or Registry()


def exposed_hashes() -> dict[str, str]:
    """Each exposed definition and the review hash it was exposed at."""
    return {entry.definition: entry.review_hash for entry in load_registry().exposed}


def expose(definition: str, review_hash: str) -> Registry:
    """Expose ``definition`` at ``review_hash`` (replacing an earlier pin of it)."""
    if not DEFINITION_RE.match(definition) or definition.startswith("project:"):
        raise UsageError(
            f"{definition} cannot be exposed",
            hint="expose an installed user:NAME or a builtin:NAME",
        )
    current = load_registry()
    kept = [e for e in current.exposed if e.definition != definition]
    entry = ExposedDefinition(definition=definition, review_hash=review_hash)
    registry = Registry(exposed=sorted([*kept, entry], key=lambda e: e.definition))
    write_record(registry_path(), registry)
    return registry


def unexpose(definition: str, *, missing_ok: bool = False) -> bool:
    """Take ``definition`` out of the registry; whether it was in it."""
    current = load_registry()
    kept = [e for e in current.exposed if e.definition != definition]
    if len(kept) == len(current.exposed):
        if missing_ok:
            return False
        raise NotFound(f"{definition} is not exposed", hint="see 'cairn workflow list'")
    write_record(registry_path(), Registry(exposed=kept))
    return True
