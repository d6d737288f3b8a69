"""Every example profile in docs/examples/profiles.d is one a host could install as is."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from cairn.protocol.launch import ProfileSpec

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "docs/examples/profiles.d").glob("*.toml"))


def test_the_documented_agent_clis_have_examples() -> None:
    names = {path.stem for path in EXAMPLES}
    assert {"aider", "claude", "codex", "opencode"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_profile_is_valid(path: Path) -> None:
    data = tomllib.loads(path.read_text())
    profile = ProfileSpec.model_validate({**data, "name": path.stem}, strict=True)
    assert profile.provider, "every example reaches a model through the relay"
    if profile.kind == "command":
        assert profile.argv[0].startswith("/"), "command argv starts with an absolute path"
        assert any("{prompt}" in arg for arg in profile.argv)


REPO = Path(__file__).resolve().parents[2]
# pin name in tests/system/agent_clis.py -> (the CLI as the docs name it, its example)
TESTED_CLIS = {"CODEX": ("codex", "codex"), "OPENCODE": ("opencode", "opencode"),
               "CLAUDE": ("Claude Code", "claude"), "AIDER": ("aider", "aider")}


def test_the_documented_cli_versions_are_the_tested_ones() -> None:
    """docs/agents.md and each example name the version the system tier pins and runs."""
    pins = dict(re.findall(r'^(\w+)_VERSION = "([^"]+)"$',
                           (REPO / "tests/system/agent_clis.py").read_text(), re.M))
    assert set(TESTED_CLIS) <= set(pins)
    docs = (REPO / "docs/agents.md").read_text()
    for pin, (label, example) in TESTED_CLIS.items():
        version = pins[pin]
        assert f"{label} {version}" in docs, (label, version)
        text = (REPO / f"docs/examples/profiles.d/{example}.toml").read_text()
        assert f"Flags of {label} {version}" in text, (example, version)
    requirements = (REPO / "tests/system/data/aider-requirements.txt").read_text()
    assert f"aider-chat=={pins['AIDER']}\n" in requirements
