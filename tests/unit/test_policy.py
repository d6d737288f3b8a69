"""Capability policy: parsing, per-definition overrides, strictest decision, fingerprints."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cairn.policy import (
    Policy,
    PolicyError,
    agent_capabilities,
    evaluate,
    fingerprint,
    load_policy,
    prepare_agent_operation,
)
from cairn.protocol.launch import LaunchDescription, ProfileSpec, ProjectSpec

RUN = "flow_" + "0" * 31 + "7"
AGENT = {"profile": "test:fetch", "access": "write", "network": "host", "output": "Report",
         "allowlist": []}


def description(**update: object) -> LaunchDescription:
    desc = LaunchDescription(
        run_id=RUN, owner_uid=1001, owner_gid=1001, owner_name="alice",
        definition="builtin:implement", source="x = 1\n", source_filename="implement.py",
        review_hash="sha256:" + "b" * 64, review={"agents": {"fetch": AGENT}},
        args={}, project=ProjectSpec(root="/home/alice/p", owner_uid=1001, on_pool_fs=False),
        profiles={"test:fetch": ProfileSpec(name="test:fetch", kind="scripted")},
        cairn_version="0", created_at=time.time(),
    )
    return desc.model_copy(update=update)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return path


def test_missing_file_allows_everything(tmp_path: Path) -> None:
    policy = load_policy(tmp_path / "absent.toml")
    result = evaluate(policy, agent_capabilities(AGENT), description())
    assert result.decision == "allow"
    assert set(result.capabilities) == {"profile:test:fetch", "write", "network:host"}


def test_strictest_decision_wins_and_names_its_capabilities(tmp_path: Path) -> None:
    policy = load_policy(write(tmp_path, """
default = "allow"
[capabilities]
write = "require_approval"
"network:host" = "deny"
"""))
    result = evaluate(policy, agent_capabilities(AGENT), description())
    assert result.decision == "deny"
    assert result.because("deny") == ["network:host"]
    assert result.because("require_approval") == ["write"]
    read_only = {**AGENT, "access": "read", "network": "none"}
    assert evaluate(policy, agent_capabilities(read_only), description()).decision == "allow"


def test_patterns_longest_match_and_default(tmp_path: Path) -> None:
    policy = load_policy(write(tmp_path, """
default = "deny"
[capabilities]
"profile:*" = "require_approval"
"profile:test:*" = "allow"
"""))
    desc = description()
    assert policy.decide("profile:test:fetch", definition="x", review_hash="y") == "allow"
    assert policy.decide("profile:builtin:planner", definition="x", review_hash="y") == (
        "require_approval")
    assert policy.decide("write", definition="x", review_hash="y") == "deny"
    assert evaluate(policy, ["profile:test:fetch"], desc).decision == "allow"


def test_per_definition_override_by_name_or_review_hash(tmp_path: Path) -> None:
    policy = load_policy(write(tmp_path, f"""
[capabilities]
write = "allow"
[definitions."builtin:implement".capabilities]
write = "require_approval"
[definitions."{'sha256:' + 'c' * 64}".capabilities]
write = "deny"
"""))
    assert evaluate(policy, ["write"], description()).decision == "require_approval"
    other = description(definition="builtin:research")
    assert evaluate(policy, ["write"], other).decision == "allow"
    pinned = description(definition="/home/alice/x.py", review_hash="sha256:" + "c" * 64)
    assert evaluate(policy, ["write"], pinned).decision == "deny"


@pytest.mark.parametrize(("text", "message"), [
    ("[capabilities]\nwrite = \"maybe\"\n", "capabilities.write"),
    ("default = \n", "not valid TOML"),
    ("surprise = 1\n", "surprise"),
    ("approval_deadline_sec = 0\n", "approval_deadline_sec"),
])
def test_malformed_policy_is_refused_with_the_place(tmp_path: Path, text: str,
                                                    message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        load_policy(write(tmp_path, text))


def test_deadline_default_and_setting(tmp_path: Path) -> None:
    assert Policy().approval_deadline_sec == 86_400
    assert load_policy(write(tmp_path, "approval_deadline_sec = 5\n")).approval_deadline_sec == 5


def test_fingerprint_binds_the_exact_prepared_operation() -> None:
    request = {"descriptor": "fetch", "prompt": "news", "title": "fetch"}
    prepared = prepare_agent_operation(description(), "root-2", request)
    assert prepared["capabilities"] == ["profile:test:fetch", "write", "network:host"]
    same = prepare_agent_operation(description(), "root-2", dict(request))
    assert fingerprint(prepared) == fingerprint(same)
    assert fingerprint(prepared).startswith("sha256:")
    changed_prompt = prepare_agent_operation(description(), "root-2", {**request,
                                                                        "prompt": "olds"})
    assert fingerprint(changed_prompt) != fingerprint(prepared)
    changed_source = prepare_agent_operation(
        description(review_hash="sha256:" + "d" * 64), "root-2", request)
    assert fingerprint(changed_source) != fingerprint(prepared)
    changed_profile = prepare_agent_operation(
        description(profiles={"test:fetch": ProfileSpec(name="test:fetch", kind="scripted",
                                                        handoff="x")}), "root-2", request)
    assert fingerprint(changed_profile) != fingerprint(prepared)
