"""/etc/cairn/verifiers.d: what a launch freezes, and every problem named with its file and
field. The checks running over F are in tests/system/test_undo.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from cairn.config import ConfigError, Problems
from cairn.verifiers import matching_verifiers


@pytest.fixture
def verifiers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    directory = tmp_path / "etc/cairn/verifiers.d"
    directory.mkdir(parents=True)
    return directory


def test_checks_match_by_project_below_or_definition_in_file_order(verifiers: Path) -> None:
    (verifiers / "b-tests.toml").write_text(
        'argv = ["/usr/bin/make", "check"]\ntimeout_sec = 600\n'
        '[environment]\nLANG = "C.UTF-8"\n[match]\nprojects = ["/home/alice/src/"]\n'
    )
    (verifiers / "a-lint.toml").write_text(
        'argv = ["/usr/bin/ruff", "check", "."]\ntimeout_sec = 60\n'
        '[match]\ndefinitions = ["builtin:implement"]\n'
    )
    problems = Problems()
    found = matching_verifiers("/home/alice/src/app", "builtin:implement", problems)
    assert [v.name for v in found] == ["a-lint", "b-tests"]
    assert found[1].argv == ["/usr/bin/make", "check"]
    assert found[1].environment == {"LANG": "C.UTF-8"}
    assert found[1].config_sha256 != found[0].config_sha256
    assert [v.name for v in matching_verifiers("/home/alice/srcx", "user:x", problems)] == []
    assert [v.name for v in matching_verifiers("/home/alice/src", "user:x", problems)] == [
        "b-tests"
    ]
    assert len(problems) == 0


def test_no_directory_means_no_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    assert matching_verifiers("/p", "builtin:implement", Problems()) == []


def test_every_problem_is_named_with_its_file_and_field(verifiers: Path) -> None:
    (verifiers / "relative.toml").write_text(
        'argv = ["make"]\ntimeout_sec = 0\n[match]\nprojects = ["src"]\n'
    )
    (verifiers / "nothing.toml").write_text('argv = ["/bin/true"]\ntimeout_sec = 5\n[match]\n')
    (verifiers / "Bad Name.toml").write_text("")
    problems = Problems()
    assert matching_verifiers("/p", "builtin:implement", problems) == []
    with pytest.raises(ConfigError) as caught:
        problems.check()
    text = caught.value.message
    assert "relative.toml: argv: argv[0] 'make' must be an absolute path" in text
    assert "relative.toml: timeout_sec: Input should be greater than or equal to 1" in text
    assert "relative.toml: match.projects: 'src' is not an absolute path" in text
    assert "nothing.toml: match: matches nothing: give projects or definitions" in text
    assert "verifier name 'Bad Name' is not [a-z0-9][a-z0-9_-]*" in text
