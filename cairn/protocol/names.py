"""The identifiers the protocols check, as plain patterns: run, scope, operation, lane,
intent, verifier and evaluator. Standard library only, no pydantic: :mod:`cairn.paths`
imports them, in every process and every ``cairn`` start, and builds no model for it. The
protocol models type their fields with them (:mod:`cairn.protocol.base`)."""

from __future__ import annotations

import re

RUN_ID_RE = re.compile(r"^flow_[0-9a-f]{32}$")
# Lane scopes are named after their fork and key ("root-2-a"), so nesting lengthens them.
SCOPE_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,119}$")
OP_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,127}$")
LANE_KEY_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,30}$")
INTENT_ID_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{0,80}$")
VERIFIER_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
