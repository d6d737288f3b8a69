"""The published schema of ``--json`` (:mod:`cairn.protocol.jsonschema`): docs/json-schema.json
is what the models generate; every field of the schema as its version was first published
(tests/unit/fixtures/json-schema/vN.json) is still there, with its type and still
required, unless the version was bumped; a reader of a newer output ignores the keys it
does not know; ``cairn version --json`` names the version."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import cast

import pytest
from clirunner import CliRunner
from pydantic import BaseModel, TypeAdapter, create_model

from cairn.cli.commands import app
from cairn.protocol.jsonschema import JSON_SCHEMA_VERSION, REGENERATE, document, outputs, text

REPO = Path(__file__).resolve().parents[2]
PUBLISHED = REPO / "docs" / "json-schema.json"
FIRST_OF_EACH_VERSION = Path(__file__).parent / "fixtures" / "json-schema"
# Each version's copy as first published: regenerating it would hide a removal.
FIRST_SHA256 = {1: "3a2b3229ac2c0cb1bf5b9fff4067e5563f7d7e7f1a5b1f0975adcd6ac57f82b8"}

Schema = dict[str, object]


def test_the_committed_schema_is_the_generated_one() -> None:
    assert PUBLISHED.read_text() == text(), f"docs/json-schema.json is stale: run {REGENERATE}"


def _fields(node: Schema, defs: dict[str, Schema], path: str, seen: frozenset[str]) -> set[str]:
    """Each field under ``node`` as ``PATH: TYPE`` (and ``PATH required``), through $refs."""
    ref = node.get("$ref")
    if isinstance(ref, str):
        name = ref.rsplit("/", 1)[-1]
        if name in seen:  # a recursive type: named, not walked again
            return {f"{path}: {name}"}
        return _fields(defs[name], defs, path, seen | {name})
    found: set[str] = set()
    kind = node.get("type")
    if kind is not None:
        found.add(f"{path}: {kind}")
    for key in ("const", "enum"):
        if key in node:
            found.add(f"{path}: {key} {json.dumps(node[key], sort_keys=True)}")
    properties = cast(dict[str, Schema], node.get("properties", {}))
    for name, sub in properties.items():
        found |= _fields(sub, defs, f"{path}.{name}", seen)
    found |= {f"{path}.{name} required" for name in cast(list[str], node.get("required", []))}
    for key in ("anyOf", "oneOf", "allOf"):
        for index, branch in enumerate(cast(list[Schema], node.get(key, []))):
            # each branch under its own name: a field one branch lost is not hidden by
            # another's, and a field that became nullable is no longer the same field
            named = branch.get("$ref")
            label = named.rsplit("/", 1)[-1] if isinstance(named, str) else str(index)
            found |= _fields(branch, defs, f"{path}|{label}", seen)
    if isinstance(node.get("items"), dict):
        found |= _fields(cast(Schema, node["items"]), defs, f"{path}[]", seen)
    if isinstance(node.get("additionalProperties"), dict):
        found |= _fields(cast(Schema, node["additionalProperties"]), defs, f"{path}{{}}", seen)
    return found


def fields(doc: Schema) -> set[str]:
    found: set[str] = set()
    for command, schema in cast(dict[str, Schema], doc["commands"]).items():
        defs = cast(dict[str, Schema], schema.get("$defs", {}))
        found |= _fields(schema, defs, command, frozenset())
    return found


def test_no_field_is_removed_renamed_or_retyped_without_a_version_bump() -> None:
    first = FIRST_OF_EACH_VERSION / f"v{JSON_SCHEMA_VERSION}.json"
    assert first.exists(), (
        f"version {JSON_SCHEMA_VERSION} has no published copy: cp docs/json-schema.json {first}")
    assert hashlib.sha256(first.read_bytes()).hexdigest() == FIRST_SHA256[JSON_SCHEMA_VERSION], (
        f"{first} changed: it is version {JSON_SCHEMA_VERSION} as first published")
    published = json.loads(first.read_text())
    assert published["version"] == JSON_SCHEMA_VERSION
    gone = sorted(fields(published) - fields(dict(document())))
    assert not gone, (
        f"fields of --json schema version {JSON_SCHEMA_VERSION} removed, renamed or retyped "
        f"(bump JSON_SCHEMA_VERSION in cairn/protocol/jsonschema.py): {gone[:20]}")


def test_the_field_walk_sees_a_removal_a_rename_and_a_new_type() -> None:
    class Before(BaseModel):
        run_id: str
        count: int

    class Renamed(BaseModel):
        run: str
        count: int

    class Retyped(BaseModel):
        run_id: str
        count: str

    class Added(BaseModel):
        run_id: str
        count: int
        more: bool = False

    class Nullable(BaseModel):
        run_id: str | None
        count: int

    class Other(BaseModel):
        run_id: str
        extra: int

    def one(*, keeps_run_id: bool) -> type[BaseModel]:
        """A model named One, with or without ``run_id``."""
        if keeps_run_id:
            return create_model("One", extra=(int, ...), run_id=(str, ...))
        return create_model("One", extra=(int, ...))

    def walk(model: type[BaseModel]) -> set[str]:
        return fields({"commands": {"c": TypeAdapter(model).json_schema()}})

    assert walk(Before) - walk(Renamed) == {"c.run_id: string", "c.run_id required"}
    assert walk(Before) - walk(Retyped) == {"c.count: integer"}
    assert walk(Before) - walk(Added) == set()
    assert walk(Before) - walk(Nullable) == {"c.run_id: string"}

    def union(*models: type[BaseModel]) -> set[str]:
        return fields({"commands": {"c": TypeAdapter(models[0] | models[1]).json_schema()}})

    # a field one branch of a union lost is seen although the other branch still has it
    lost = union(one(keeps_run_id=True), Other) - union(one(keeps_run_id=False), Other)
    assert lost == {"c|One.run_id: string", "c|One.run_id required"}


@pytest.mark.parametrize("command", sorted(outputs()))
def test_a_reader_ignores_a_key_it_does_not_know(command: str) -> None:
    kind = outputs()[command]
    models = [m for m in _models(kind) if m.__name__ != "VersionOutput"]
    for model in models:
        assert model.model_config.get("extra") == "ignore", model


def _models(kind: object) -> list[type[BaseModel]]:
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return [kind]
    return [m for arg in getattr(kind, "__args__", ()) for m in _models(arg)]


def test_cairn_version_json_names_the_schema_version() -> None:
    result = CliRunner().invoke(app, ["version", "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["json_schema"] == JSON_SCHEMA_VERSION == document()["version"]
    assert set(shown) == {"version", "json_schema"}
    human = CliRunner().invoke(app, ["version"]).output.splitlines()
    assert human == [f"cairn {shown['version']}", f"--json schema {JSON_SCHEMA_VERSION}"]
