"""Every example profile in docs/examples/profiles.d is one a host could install as is."""

from __future__ import annotations

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
