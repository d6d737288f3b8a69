"""Capability policy: what an operation may do without, with, or never with a person's
approval, and the fingerprint that binds an approval to one exact prepared operation.

The host policy is ``/etc/cairn/policy.toml``::

    default = "allow"                      # for capabilities no rule names
    approval_deadline_sec = 86400          # how long an approval request stays open

    [capabilities]
    write = "allow"
    "network:host" = "require_approval"
    "profile:builtin:*" = "allow"          # fnmatch patterns; the longest match wins

    [definitions."builtin:implement".capabilities]
    write = "require_approval"             # per-definition override (name or review hash)

An operation needing several capabilities gets the strictest of their decisions
(``deny`` over ``require_approval`` over ``allow``). The policy is read when it is
evaluated, never frozen into a run: an approval is checked against the policy in force
when it is given, and again before dispatch.
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field

from cairn import paths
from cairn.canonical import canonical_json, sha256_hex
from cairn.config import ConfigError, Problems
from cairn.errors import CairnError
from cairn.protocol.jsonvalue import JSONObject, JSONValue
from cairn.protocol.launch import LaunchDescription

log = logging.getLogger(__name__)

Decision = Literal["allow", "deny", "require_approval"]
STRICTNESS: dict[Decision, int] = {"allow": 0, "require_approval": 1, "deny": 2}
DEFAULT_DEADLINE_SEC = 86_400
POLICY_FIX = (
    "decisions are allow, deny or require_approval; the keys are default, "
    "approval_deadline_sec, [capabilities] and [definitions.NAME.capabilities]"
)


class PolicyError(ConfigError):
    """The host policy file is malformed: every problem, each with its line or field."""

    code = "policy"


class RequestExpired(CairnError):
    """An approval given after the request's deadline; the request is now expired."""

    code = "expired"


class _Rules(BaseModel):
    model_config = ConfigDict(defer_build=True, extra="forbid", strict=True)

    capabilities: dict[str, Decision] = {}


class Policy(BaseModel):
    """The parsed host policy. Strict: a value of the wrong TOML type (``"60"`` for a
    number) is refused, not converted."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True, strict=True)

    default: Decision = "allow"
    approval_deadline_sec: int = Field(default=DEFAULT_DEADLINE_SEC, ge=1)
    capabilities: dict[str, Decision] = {}
    definitions: dict[str, _Rules] = {}

    def decide(self, capability: str, *, definition: str, review_hash: str) -> Decision:
        """The decision for one capability of an operation of ``definition``."""
        for key in (definition, review_hash):
            rules = self.definitions.get(key)
            if rules is not None:
                found = _lookup(rules.capabilities, capability)
                if found is not None:
                    return found
        return _lookup(self.capabilities, capability) or self.default


class Evaluation(BaseModel):
    """The strictest decision over an operation's capabilities, with each one's reason."""

    model_config = ConfigDict(defer_build=True, frozen=True)

    decision: Decision
    capabilities: dict[str, Decision]

    def because(self, decision: Decision) -> list[str]:
        return sorted(c for c, d in self.capabilities.items() if d == decision)


def _lookup(rules: dict[str, Decision], capability: str) -> Decision | None:
    if capability in rules:
        return rules[capability]
    matches = [p for p in rules if fnmatch.fnmatchcase(capability, p)]
    if not matches:
        return None
    return rules[max(matches, key=len)]


def policy_path() -> Path:
    return paths.config_dir() / "policy.toml"


def load_policy(path: Path | None = None, *, problems: Problems | None = None) -> Policy:
    """The host policy; a missing file means every capability is allowed. Every problem of
    the file is raised together as a :class:`PolicyError`, or, given ``problems``, recorded
    there for the caller to raise with those of the files it loads with this one (and the
    policy that allows nothing is returned)."""
    found = Problems() if problems is None else problems
    before = len(found)
    loaded = found.load(path or policy_path(), Policy, fix=POLICY_FIX)
    if problems is None:
        found.check(PolicyError)
    if len(found) != before:
        return Policy(default="deny")
    return loaded or Policy()


def evaluate(policy: Policy, capabilities: list[str], desc: LaunchDescription) -> Evaluation:
    decided = {
        c: policy.decide(c, definition=desc.definition, review_hash=desc.review_hash)
        for c in capabilities
    }
    strictest: Decision = "allow"
    for decision in decided.values():
        if STRICTNESS[decision] > STRICTNESS[strictest]:
            strictest = decision
    return Evaluation(decision=strictest, capabilities=decided)


def agent_capabilities(agent: Mapping[str, object]) -> list[str]:
    """What an agent operation needs, named as the review names it."""
    needed = [f"profile:{agent['profile']}"]
    if agent.get("access") == "write":
        needed.append("write")
    if agent.get("network", "none") != "none":
        needed.append(f"network:{agent['network']}")
    return needed


class PreparedOperation(TypedDict):
    """An agent operation as :func:`prepare_agent_operation` derives it."""

    run_id: str
    op_id: str
    definition: str
    review_hash: str
    descriptor: JSONValue
    agent: JSONObject
    profile: JSONObject | None
    prompt: JSONValue
    title: JSONValue
    limits: JSONObject
    capabilities: list[str]


def prepare_agent_operation(
    desc: LaunchDescription, op_id: str, request: Mapping[str, JSONValue]
) -> PreparedOperation:
    """The exact operation an agent dispatch would start, derived only from the launch
    description and the journalled request. The coordinator stores it with an approval
    request; the daemon derives it again when a person approves. Attempts are not part of
    it: a clean retry of an approved operation is the same operation."""
    descriptor = request["descriptor"]
    agent = desc.review["agents"][descriptor]
    profile = desc.profiles.get(agent["profile"])
    return {
        "run_id": desc.run_id,
        "op_id": op_id,
        "definition": desc.definition,
        "review_hash": desc.review_hash,
        "descriptor": descriptor,
        "agent": agent,
        "profile": None if profile is None else profile.model_dump(mode="json"),
        "prompt": request["prompt"],
        "title": request.get("title") or descriptor,
        "limits": desc.limits.model_dump(mode="json"),
        "capabilities": agent_capabilities(agent),
    }


def fingerprint(prepared: Mapping[str, object]) -> str:
    """``sha256:`` over the canonical JSON of a prepared operation."""
    return "sha256:" + sha256_hex(canonical_json(prepared))
