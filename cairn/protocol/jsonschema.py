"""The published schema of what ``cairn COMMAND --json`` prints: cairnd's reply as its
:class:`~cairn.protocol.replies.Reply` model dumps it (a listing: the list of them), one
JSON Schema a command, with :data:`JSON_SCHEMA_VERSION`. ``docs/json-schema.json`` is
:func:`document`, regenerated with ``python -m cairn.protocol.jsonschema >
docs/json-schema.json``; tests/unit/test_json_schema.py holds the file to the models, and
the version to every field removed, renamed or retyped since.

This module loads no pydantic until :func:`document` is called: ``cairn version`` reads
only the version."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cairn.protocol.jsonvalue import JSONObject

JSON_SCHEMA_VERSION = 1
"""Kept when a ``--json`` output only gains fields; bumped when one of its fields is
removed or renamed or changes type. A reader ignores keys it does not know."""

REGENERATE = "python -m cairn.protocol.jsonschema > docs/json-schema.json"


def outputs() -> dict[str, object]:
    """Each command that prints a typed reply with ``--json``, and the type it prints."""
    from pydantic import BaseModel

    from cairn.protocol import replies as r
    from cairn.protocol.run_replies import LaunchReply, UpgradeReply
    from cairn.protocol.view_replies import DiffReply, DoctorReply, ShowReply

    class VersionOutput(BaseModel):
        """``cairn version --json``: the package's version and this schema's."""

        version: str
        json_schema: int

    def listed(model: type[BaseModel], field: str) -> object:
        return model.model_fields[field].annotation  # a listing prints the list itself

    return {
        "version": VersionOutput,
        "launch": LaunchReply,
        "list": listed(r.PsReply, "runs"),
        "show": ShowReply,
        "diff": DiffReply,
        "doctor": DoctorReply,
        "upgrade": UpgradeReply,
        "revert": r.RevertReply,
        "replay": r.QueuedReplayReply | r.ReplayReply,
        "checkpoints": r.CheckpointsReply,
        "artifacts": r.ArtifactsReply | r.ArtifactContent,
        "inbox": listed(r.InboxReply, "items"),
        "rm": list[r.RmReply],
        "prune": r.PruneReply,
        "storage df": r.StorageDfReply,
        "schedule create": r.ScheduleReview,
        "schedule confirm": r.ScheduleView,
        "schedule resume": r.EnabledSchedule,
        "schedule pause": r.ScheduleView,
        "schedule rm": r.ScheduleView,
        "schedule list": listed(r.ScheduleListReply, "schedules"),
        "schedule show": r.ScheduleDetail,
        "schedule run-now": r.OccurrenceDecision,
        "schedule inbox": listed(r.ScheduleInboxReply, "items"),
    }


def document() -> JSONObject:
    """``{"version": JSON_SCHEMA_VERSION, "commands": {COMMAND: JSON Schema}}``."""
    from pydantic import TypeAdapter

    schemas: JSONObject = {
        command: TypeAdapter(kind).json_schema(mode="serialization")
        for command, kind in outputs().items()
    }
    return {"version": JSON_SCHEMA_VERSION, "commands": schemas}


def text() -> str:
    """:func:`document` as ``docs/json-schema.json`` holds it."""
    import json

    return json.dumps(document(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    print(text(), end="")
