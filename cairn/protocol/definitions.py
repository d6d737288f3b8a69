"""The files a person's definitions are kept in (``$XDG_CONFIG_HOME/cairn/``): an installed
``user:`` definition, the projects trusted for ``project:`` definitions, and the registry of
definitions exposed to models. Written by the ``cairn`` command as the user, read back
strictly: a key a model does not declare is refused, never ignored.

A definition is named ``NAMESPACE:NAME``; :data:`DEFINITION_RE` is the one pattern."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field

from cairn.canonical import canonical_json, sha256_hex
from cairn.protocol.base import Frozen
from cairn.protocol.names import HASH_PATTERN

NAME_PATTERN = r"[a-z][a-z0-9_-]{0,40}"
NAME_RE = re.compile(rf"^{NAME_PATTERN}$")
DEFINITION_RE = re.compile(rf"^(builtin|user|project):({NAME_PATTERN})$")
HASH_RE = re.compile(HASH_PATTERN)

DefinitionName = Annotated[str, Field(pattern=NAME_RE.pattern)]
ReviewHash = Annotated[str, Field(pattern=HASH_RE.pattern)]
ExposableDefinition = Annotated[str, Field(pattern=rf"^(builtin|user):{NAME_PATTERN}$")]


class InstalledDefinition(Frozen):
    """``workflows/NAME.json``: one ``user:NAME`` definition, its source as reviewed and
    confirmed, and who installed it when. One file, so an install replaces it whole."""

    format: Literal[1] = 1
    name: DefinitionName
    source: str = Field(max_length=1 << 20)
    review_hash: ReviewHash
    installed_at: float
    installed_by: str = Field(min_length=1, max_length=64)
    installed_from: str = Field(max_length=4096)


class TrustedProject(Frozen):
    """One project's trust decision: the review hash of each of its ``project:``
    definitions at the time the person confirmed ``trust_hash``."""

    root: str = Field(min_length=1, max_length=4096)
    definitions: dict[DefinitionName, ReviewHash]
    trust_hash: ReviewHash
    trusted_at: float
    trusted_by: str = Field(min_length=1, max_length=64)


class TrustFile(Frozen):
    """``trust.json``: the trusted projects, by root path."""

    format: Literal[1] = 1
    projects: dict[str, TrustedProject] = {}


class ExposedDefinition(Frozen):
    """A definition a model may start, pinned to the review hash it had when exposed."""

    definition: ExposableDefinition
    review_hash: ReviewHash


class Registry(Frozen):
    """``registry.json``: which installed definitions are exposed to models."""

    format: Literal[1] = 1
    exposed: list[ExposedDefinition] = []


def trust_hash(root: str, definitions: dict[str, str]) -> str:
    """What a person confirms to trust a project: ``sha256:`` over the canonical JSON of
    its root and the review hash of every definition in it."""
    document = {"project": root, "definitions": definitions}
    return "sha256:" + sha256_hex(canonical_json(document))
