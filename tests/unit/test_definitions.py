"""A person's own definitions (``cairn.definitions``): install with a confirmed hash, drafts,
trusted projects, the registry, and what ``cairn launch user:/project:`` sends cairnd.
Every refusal is asserted with its exact one-line message and hint."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from clirunner import CliRunner

from cairn.cli import launching
from cairn.cli.commands import app
from cairn.daemon import launch as daemon_launch
from cairn.definitions import files, registry, resolve, trust, user
from cairn.errors import CairnError, NotFound, PermissionDenied, UsageError, ValidationFailed
from cairn.protocol.daemon import LaunchRequest
from cairn.protocol.definitions import trust_hash
from cairn.untrusted import UntrustedFileError
from cairn.workflow.review import review_source

SOURCE = user.draft_source("fix-flaky")
CHANGED = SOURCE.replace("max_length=4_000", "max_length=5_000")


def review_hash(source: str, name: str = "fix-flaky") -> str:
    return review_source(source, filename=f"{name}.py").review_hash


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's config home; the Cairn files are in ``cairn/`` under it."""
    home = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    return home / "cairn"


@pytest.fixture
def wf(tmp_path: Path) -> Path:
    path = tmp_path / "fix-flaky.py"
    path.write_text(SOURCE)
    return path


def refused(error: type[CairnError], call: Any, *args: Any, **kwargs: Any) -> CairnError:
    with pytest.raises(error) as caught:
        call(*args, **kwargs)
    return caught.value


# --- install --------------------------------------------------------------------------------


def test_install_keeps_the_exact_reviewed_source_whole(config: Path, wf: Path) -> None:
    record = user.install(wf, review_hash(SOURCE))
    path = config / "workflows" / "fix-flaky.json"
    assert json.loads(path.read_text())["source"] == SOURCE
    assert record.name == "fix-flaky" and record.review_hash == review_hash(SOURCE)
    assert record.installed_from == str(wf)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in path.parent.iterdir()] == ["fix-flaky.json"]  # no temp file left
    assert user.installed("fix-flaky") == record


def test_install_refuses_a_hash_that_does_not_match(config: Path, wf: Path) -> None:
    other = review_hash(CHANGED)
    error = refused(PermissionDenied, user.install, wf, other)
    now = review_hash(SOURCE)
    assert error.message == f"{wf} does not match the confirmed hash: its review hash is {now}"
    assert error.hint == (
        f"read 'cairn workflow review {wf}' (it may have changed since), "
        f"then install with --confirm {now}"
    )
    assert not (config / "workflows").exists()  # nothing half-installed


def test_install_refuses_a_confirmation_that_is_not_a_hash(config: Path, wf: Path) -> None:
    error = refused(UsageError, user.install, wf, "yes")
    assert error.message == "--confirm 'yes' is not a review hash (sha256: and 64 hex digits)"
    assert error.hint == f"read 'cairn workflow review {wf}' and pass the hash it prints"


def test_install_refuses_a_file_that_changes_while_it_is_read(
    config: Path, wf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = files._read_all

    def read_then_written(fd: int) -> bytes:
        data = real(fd)
        with wf.open("a") as fh:  # another writer, between the read and the check
            fh.write("# appended\n")
        return data

    monkeypatch.setattr(files, "_read_all", read_then_written)
    error = refused(UsageError, user.install, wf, review_hash(SOURCE))
    assert error.message == f"{wf} changed while it was being read"
    assert error.hint == "nothing was changed; run the command again once nothing is writing to it"
    assert not (config / "workflows").exists()


def test_a_name_collision_needs_replace_and_the_new_hash(config: Path, wf: Path) -> None:
    old = user.install(wf, review_hash(SOURCE))
    wf.write_text(CHANGED)
    new = review_hash(CHANGED)
    error = refused(UsageError, user.install, wf, new)
    assert error.message == f"user:fix-flaky is already installed (review hash {old.review_hash})"
    assert error.hint == (
        f"read 'cairn workflow diff user:fix-flaky {wf}', then install with "
        f"--replace --confirm {new}"
    )
    # the old confirmation does not carry over to the new content
    refused(PermissionDenied, user.install, wf, old.review_hash, replace=True)
    assert user.installed("fix-flaky").review_hash == old.review_hash
    assert user.install(wf, new, replace=True).review_hash == new
    assert user.installed("fix-flaky").source == CHANGED


def test_a_tampered_install_record_is_refused(config: Path, wf: Path) -> None:
    user.install(wf, review_hash(SOURCE))
    path = config / "workflows" / "fix-flaky.json"
    data = json.loads(path.read_text())
    data["source"] = CHANGED
    path.write_text(json.dumps(data))
    error = refused(PermissionDenied, user.checked_review, user.installed("fix-flaky"))
    assert error.message == (
        f"user:fix-flaky does not match its install record (review hash now {review_hash(CHANGED)})"
    )


def test_an_install_record_reached_through_a_link_is_refused(config: Path, wf: Path) -> None:
    user.install(wf, review_hash(SOURCE))
    folder = config / "workflows"
    (folder / "fix-flaky.json").rename(folder / "elsewhere.json")
    (folder / "fix-flaky.json").symlink_to(folder / "elsewhere.json")
    with pytest.raises(UntrustedFileError, match="not followed"):
        user.installed("fix-flaky")


def test_remove_takes_the_definition_and_its_exposure(config: Path, wf: Path) -> None:
    user.install(wf, review_hash(SOURCE))
    registry.expose("user:fix-flaky", review_hash(SOURCE))
    result = CliRunner().invoke(app, ["workflow", "remove", "user:fix-flaky", "--yes"])
    assert result.exit_code == 0, result.output
    assert registry.exposed_hashes() == {}
    error = refused(NotFound, user.installed, "fix-flaky")
    assert error.message == "user:fix-flaky is not installed"


def test_show_and_diff(config: Path, wf: Path) -> None:
    user.install(wf, review_hash(SOURCE))
    shown = CliRunner().invoke(app, ["workflow", "show", "user:fix-flaky"])
    assert shown.exit_code == 0, shown.output
    assert f"review_hash: {review_hash(SOURCE)}" in shown.output
    assert "by " + __import__("pwd").getpwuid(os.getuid()).pw_name in shown.output
    assert "  class Objective(Model):" in shown.output
    new = wf.with_name("new.py")
    new.write_text(CHANGED)
    diff = CliRunner().invoke(app, ["workflow", "diff", "user:fix-flaky", str(new)])
    assert diff.exit_code == 0, diff.output
    assert "-  summary: str  (min_length=1, max_length=4000)" in diff.output
    assert "+  summary: str  (min_length=1, max_length=5000)" in diff.output
    assert f"--replace --confirm {review_hash(CHANGED)}" in diff.output
    as_json = CliRunner().invoke(app, ["workflow", "diff", "user:fix-flaky", str(new), "--json"])
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.output)
    assert (data["definition"], data["installed_hash"], data["review_hash"], data["changed"]) \
        == ("user:fix-flaky", review_hash(SOURCE), review_hash(CHANGED), True)
    assert "+  summary: str  (min_length=1, max_length=5000)" in data["manifest_diff"]
    same = CliRunner().invoke(app, ["workflow", "diff", "user:fix-flaky", str(wf), "--json"])
    assert json.loads(same.output)["changed"] is False


# --- drafts ---------------------------------------------------------------------------------


def test_a_draft_is_inert(config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EDITOR", raising=False)
    result = CliRunner().invoke(app, ["workflow", "draft", "tidy"])
    path = config / "drafts" / "tidy.py"
    assert result.exit_code == 0 and result.output == f"{path}\n"
    assert "tidy: a draft" in path.read_text()
    assert all(row["definition"] != "user:tidy" for row in resolve.listing())
    hint = (
        f"review it with 'cairn workflow review {path}', then install it with "
        f"'cairn workflow install {path} --confirm sha256:…'"
    )
    for purpose, call in (
        ("launched", lambda: resolve.for_launch("user:tidy", -1, str(tmp_path))),
        ("exposed", lambda: resolve.exposable_hash("user:tidy")),
        ("launched", lambda: resolve.refuse_draft_file(path, "launched")),
        ("exposed", lambda: resolve.exposable_hash(str(path))),
    ):
        error = refused(UsageError, call)
        assert error.message == f"user:tidy is a draft; drafts cannot be {purpose}"
        assert error.hint == hint
    path.write_text("edited\n")
    CliRunner().invoke(app, ["workflow", "draft", "tidy"])
    assert path.read_text() == "edited\n"  # an existing draft is kept


def test_launching_a_draft_file_sends_nothing(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = user.create_draft("tidy")
    monkeypatch.setattr(launching, "request", lambda *a, **k: pytest.fail("sent a draft"))
    result = CliRunner().invoke(app, ["launch", str(path), "--confirm", review_hash(SOURCE)])
    assert isinstance(result.exception, UsageError)
    assert result.exception.message == "user:tidy is a draft; drafts cannot be launched"


# --- the registry ---------------------------------------------------------------------------


def test_expose_pins_the_installed_hash_and_a_reinstall_makes_it_stale(
    config: Path, wf: Path
) -> None:
    user.install(wf, review_hash(SOURCE))
    result = CliRunner().invoke(app, ["workflow", "expose", "user:fix-flaky"])
    assert result.exit_code == 0, result.output
    assert registry.exposed_hashes() == {"user:fix-flaky": review_hash(SOURCE)}
    shown = CliRunner().invoke(app, ["workflow", "list"]).output.splitlines()
    # the name column is as wide as the longest name, builtin:execute-plan
    assert f"user:fix-flaky        {review_hash(SOURCE)}  installed  exposed=yes  {wf}" in shown
    wf.write_text(CHANGED)
    user.install(wf, review_hash(CHANGED), replace=True)
    row = next(r for r in resolve.listing() if r["definition"] == "user:fix-flaky")
    assert row["exposed"] == "stale"
    assert CliRunner().invoke(app, ["workflow", "unexpose", "user:fix-flaky"]).exit_code == 0
    assert registry.exposed_hashes() == {}


def test_project_definitions_are_never_exposed(config: Path) -> None:
    error = refused(UsageError, resolve.exposable_hash, "project:tidy")
    assert error.message == "project:tidy cannot be exposed: project definitions are never exposed"


@pytest.mark.parametrize(
    ("content", "where"),
    [
        ('{"format": 1, "exposed": [], "models": "all"}', "models: Extra inputs are not permitted"),
        (
            '{"format": 1, "exposed": [{"definition": "user:x", "review_hash": "sha256:1"}]}',
            "exposed.0.review_hash: String should match pattern '^sha256:[0-9a-f]{64}$'",
        ),
        ("not json", "file: Invalid JSON: expected ident at line 1 column 2"),
    ],
)
def test_a_malformed_registry_is_refused(config: Path, content: str, where: str) -> None:
    config.mkdir(parents=True)
    (config / "registry.json").write_text(content)
    error = refused(ValidationFailed, registry.load_registry)
    assert error.message == f"{config / 'registry.json'}: not a valid registry: {where}"
    assert error.hint == "fix or remove it; 'cairn workflow expose' writes a valid one"
    refused(ValidationFailed, resolve.listing)


# --- trusted projects -----------------------------------------------------------------------


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "app"
    (root / ".cairn" / "workflows").mkdir(parents=True)
    (root / ".cairn" / "workflows" / "tidy.py").write_text(SOURCE)
    return root


def project_hash(root: Path, source: str = SOURCE) -> str:
    return trust_hash(str(root), {"tidy": review_hash(source, "tidy")})


def launch_project(root: Path, name: str = "tidy") -> tuple[str, str]:
    with trust.open_project(str(root)) as fd:
        return resolve.for_launch(f"project:{name}", fd, str(root))


def test_trust_binds_a_project_to_its_definitions_content(config: Path, project: Path) -> None:
    printed = CliRunner().invoke(app, ["project", "trust", str(project)])
    assert printed.exit_code == 0, printed.output
    assert f"trust_hash: {project_hash(project)}" in printed.output
    as_json = CliRunner().invoke(app, ["project", "trust", str(project), "--json"])
    assert json.loads(as_json.output) == {
        "project": str(project), "trusted": False, "trust_hash": project_hash(project),
        "definitions": {"project:tidy": review_hash(SOURCE, "tidy")}}
    assert trust.trusted_project(str(project)) is None  # printing decides nothing
    confirmed = CliRunner().invoke(app, ["project", "trust", str(project), "--confirm",
                                         project_hash(project), "--json"])
    assert json.loads(confirmed.output) == {**json.loads(as_json.output), "trusted": True}
    trust.trust(str(project), project_hash(project))
    assert launch_project(project) == (SOURCE, review_hash(SOURCE, "tidy"))
    rows = [r for r in resolve.listing() if r["definition"] == "project:tidy"]
    assert [(r["status"], r["where"]) for r in rows] == [("trusted", str(project))]


def test_an_untrusted_project_definition_is_refused(config: Path, project: Path) -> None:
    error = refused(PermissionDenied, launch_project, project)
    assert error.message == f"project:tidy is not trusted: {project} has no trust decision"
    assert error.hint == (
        f"read 'cairn project trust {project}', then trust it with --confirm sha256:…"
    )


def test_trust_refuses_a_hash_that_does_not_match(config: Path, project: Path) -> None:
    wrong = project_hash(project, CHANGED)
    error = refused(PermissionDenied, trust.trust, str(project), wrong)
    expected = project_hash(project)
    assert error.message == (
        f"the definitions of {project} do not match the confirmed hash: "
        f"their trust hash is {expected}"
    )
    assert error.hint == (
        f"read 'cairn project trust {project}' again (they may have changed), "
        f"then confirm {expected}"
    )
    assert not (config / "trust.json").exists()


def test_a_definition_changed_after_trust_is_refused(config: Path, project: Path) -> None:
    trust.trust(str(project), project_hash(project))
    (project / ".cairn" / "workflows" / "tidy.py").write_text(CHANGED)
    error = refused(PermissionDenied, launch_project, project)
    assert error.message == (
        f"project:tidy changed since {project} was trusted "
        f"(review hash now {review_hash(CHANGED, 'tidy')})"
    )
    assert error.hint == f"read 'cairn project trust {project}' again, then confirm its new hash"
    row = next(r for r in resolve.listing() if r["definition"] == "project:tidy")
    assert row["status"] == "changed"
    trust.trust(str(project), project_hash(project, CHANGED))  # confirmed again
    assert launch_project(project)[0] == CHANGED


def test_a_definition_added_after_trust_is_refused(config: Path, project: Path) -> None:
    trust.trust(str(project), project_hash(project))
    (project / ".cairn" / "workflows" / "more.py").write_text(SOURCE)
    error = refused(PermissionDenied, launch_project, project, "more")
    assert error.message == f"project:more was added to {project} after it was trusted"


def test_a_project_definition_that_is_a_link_is_refused(
    config: Path, project: Path, tmp_path: Path
) -> None:
    trust.trust(str(project), project_hash(project))
    elsewhere = tmp_path / "elsewhere.py"
    elsewhere.write_text(SOURCE)
    target = project / ".cairn" / "workflows" / "tidy.py"
    target.unlink()
    target.symlink_to(elsewhere)
    error = refused(UntrustedFileError, launch_project, project)
    assert error.message == f"{target}: a symbolic link on the way; not followed"


def test_list_shows_what_became_of_a_trusted_projects_definitions(
    config: Path, project: Path
) -> None:
    trust.trust(str(project), project_hash(project))
    folder = project / ".cairn" / "workflows"
    (folder / "Not A Name.py").write_text(SOURCE)  # cannot name a definition: left out
    (folder / "more.py").write_text(SOURCE)
    statuses = {r["definition"]: r["status"] for r in resolve.listing()}
    assert statuses == {
        "builtin:execute-plan": "builtin",
        "builtin:goal": "builtin",
        "builtin:implement": "builtin",
        "builtin:optimize": "builtin",
        "builtin:research": "builtin",
        "builtin:review": "builtin",
        "project:more": "untrusted",
        "project:tidy": "trusted",
    }
    (folder / "tidy.py").unlink()
    assert {r["definition"]: r["status"] for r in resolve.listing()}["project:tidy"] == "missing"
    error = refused(UsageError, trust.trust, str(project), project_hash(project))
    assert error.message == "project:Not A Name is not a definition name"


def test_a_project_without_definitions_cannot_be_trusted(config: Path, tmp_path: Path) -> None:
    error = refused(NotFound, trust.trust, str(tmp_path), project_hash(tmp_path))
    assert error.message == f"{tmp_path} has no definitions in .cairn/workflows/"


def test_untrust_forgets_the_decision(config: Path, project: Path) -> None:
    trust.trust(str(project), project_hash(project))
    result = CliRunner().invoke(app, ["project", "untrust", str(project)])
    assert result.exit_code == 0, result.output
    refused(PermissionDenied, launch_project, project)
    error = refused(NotFound, trust.untrust, str(project))
    assert error.message == f"{project} is not trusted"


# --- what cairn launch sends, and what cairnd accepts ---------------------------------------


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[LaunchRequest]:
    seen: list[LaunchRequest] = []

    def request(req: dict[str, Any], fd: int | None = None, **_: Any) -> dict[str, Any]:
        seen.append(LaunchRequest.model_validate(req))
        return {"run_id": "flow_" + "0" * 32}

    monkeypatch.setattr(launching, "request", request)
    return seen


def test_launch_sends_the_installed_source_and_its_hash(
    config: Path, wf: Path, project: Path, sent: list[LaunchRequest]
) -> None:
    user.install(wf, review_hash(SOURCE))
    result = CliRunner().invoke(app, ["launch", "user:fix-flaky", "--project", str(project)])
    assert result.exit_code == 0, result.output
    assert (sent[0].definition, sent[0].source) == ("user:fix-flaky", SOURCE)
    assert sent[0].confirm == review_hash(SOURCE)


def test_launch_sends_a_trusted_project_definition_and_nothing_untrusted(
    config: Path, project: Path, sent: list[LaunchRequest]
) -> None:
    argv = ["launch", "project:tidy", "--project", str(project)]
    result = CliRunner().invoke(app, argv)
    assert isinstance(result.exception, PermissionDenied) and sent == []
    trust.trust(str(project), project_hash(project))
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert (sent[0].source, sent[0].confirm) == (SOURCE, review_hash(SOURCE, "tidy"))


def test_cairnd_reviews_sent_source_under_the_definitions_name() -> None:
    assert daemon_launch.source_filename("user:fix-flaky") == "fix-flaky.py"
    assert daemon_launch.source_filename("project:tidy") == "tidy.py"
    assert daemon_launch.source_filename("/home/a/wf.py") == "wf.py"
    request = LaunchRequest(
        definition="user:fix-flaky", source=CHANGED, confirm=review_hash(SOURCE)
    )
    error = refused(PermissionDenied, daemon_launch.launch, None, request, 1000, None)
    assert error.message == (
        f"user:fix-flaky does not match its confirmed hash: its review hash is "
        f"{review_hash(CHANGED)}"
    )
    assert error.hint == "it changed while it was being launched; launch it again"


def test_cairnd_never_reads_user_or_project_definitions_itself() -> None:
    error = refused(UsageError, daemon_launch.resolve_definition, "user:fix-flaky")
    assert error.message == (
        "user:fix-flaky: cairnd does not read user: or project: definitions itself"
    )


def test_a_confirmation_given_with_a_named_definition_must_be_its_hash(
    config: Path, wf: Path, project: Path, sent: list[LaunchRequest]
) -> None:
    user.install(wf, review_hash(SOURCE))
    other = review_hash(CHANGED)
    argv = ["launch", "user:fix-flaky", "--project", str(project), "--confirm", other]
    result = CliRunner().invoke(app, argv)
    assert isinstance(result.exception, PermissionDenied) and sent == []
    assert result.exception.message == (
        f"user:fix-flaky has review hash {review_hash(SOURCE)}, not the confirmed {other}"
    )
