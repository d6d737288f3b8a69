"""The man pages: rendered by pandoc from docs/man (as the package builds do), clean
under ``man --warnings`` and readable by ``lexgrog``; cairn(1) lists every visible
command and no hidden one, and has the sections a reader looks for; each section-5 page
names every key its configuration file accepts."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from cairn.policy import Policy
from cairn.proc import run
from cairn.protocol.launch import ProfileSpec
from cairn.providers import ProviderEntry, ProvidersFile
from cairn.retention import StoragePolicy
from cairn.schedules import HostScheduleConfig
from cairn.verifiers import VerifierConfig, VerifierMatch

REPO = Path(__file__).resolve().parents[2]
PAGES = {
    "cairn.1", "cairnd.8", "cairn-broker.8", "cairn-providers.toml.5",
    "cairn-policy.toml.5", "cairn-profiles.5", "cairn-schedules.toml.5",
    "cairn-storage.toml.5", "cairn-verifiers.5", "cairn-notify.5", "cairn-workflow.7",
}
# Each file page and the models of the keys its file accepts.
FILE_PAGES: dict[str, tuple[type[BaseModel], ...]] = {
    "cairn-providers.toml.5": (ProvidersFile, ProviderEntry),
    "cairn-policy.toml.5": (Policy,),
    "cairn-profiles.5": (ProfileSpec,),
    "cairn-schedules.toml.5": (HostScheduleConfig,),
    "cairn-storage.toml.5": (StoragePolicy,),
    "cairn-verifiers.5": (VerifierConfig, VerifierMatch),
}
# a profile's name is its file's name; its config hash is taken of the file at launch
NOT_IN_A_FILE = {"name", "config_sha256"}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("pandoc", path="/usr/bin:/bin") is None:
        pytest.skip("pandoc is not installed (apt-get install pandoc; ./dev installs it)")
    out = tmp_path_factory.mktemp("man")
    run([sys.executable, REPO / "packaging" / "gen-man.py", "--out", out], timeout=120)
    run([REPO / "packaging" / "render-man.sh", out], timeout=120)
    return out


def test_every_page_is_rendered(rendered: Path) -> None:
    assert {p.name for p in rendered.iterdir() if not p.name.endswith(".md")} == PAGES


@pytest.mark.parametrize("page", sorted(PAGES))
def test_page_has_no_man_warnings_and_a_name_line(rendered: Path, page: str) -> None:
    env = {"MANWIDTH": "80", "MAN_DISABLE_SECCOMP": "1"}
    shown = run(["man", "--warnings", "-E", "UTF-8", "-l", rendered / page], env=env)
    assert shown.stderr.decode() == ""
    assert b"NAME" in shown.stdout
    name = run(["lexgrog", rendered / page]).stdout.decode()
    title = page.rsplit(".", 1)[0]
    assert re.fullmatch(rf'{re.escape(str(rendered / page))}: "{re.escape(title)} - .+"\n', name)


def _sections(markdown: str) -> list[str]:
    return re.findall(r"^# (.+)$", markdown, re.MULTILINE)


def test_cairn_1_has_the_sections_a_reader_looks_for(rendered: Path) -> None:
    source = (rendered / "cairn.1.md").read_text()
    sections = _sections(source)
    for wanted in ("NAME", "SYNOPSIS", "DESCRIPTION", "COMMANDS", "EXAMPLES", "ENVIRONMENT",
                   "FILES", "EXIT STATUS", "SEE ALSO"):
        assert wanted in sections, wanted
    files = source.split("# FILES", 1)[1].split("\n# ", 1)[0]
    for path in ("/etc/cairn/providers.toml", "/etc/cairn/policy.toml",
                 "/etc/cairn/profiles.d/", "/etc/cairn/schedules.toml"):
        assert path in files, path
    status = source.split("# EXIT STATUS", 1)[1].split("\n# ", 1)[0]
    assert re.findall(r"^\*\*(\d+)\*\*$", status, re.MULTILINE) == ["0", "1", "2", "130"]


def test_cairn_1_lists_every_visible_command_and_no_hidden_one(rendered: Path) -> None:
    source = (rendered / "cairn.1.md").read_text()
    listed = re.findall(r"^## (cairn .+)$", source, re.MULTILINE)

    from cairn.cli.commands import app

    visible: list[str] = []
    hidden: list[str] = []
    stack = [(app, ["cairn"])]
    while stack:
        command, path = stack.pop()
        subcommands = getattr(command, "commands", None)
        if subcommands is None:
            (hidden if command.hidden else visible).append(" ".join(path))
            continue
        stack += [(sub, [*path, name]) for name, sub in subcommands.items()]
    assert hidden, "the CLI has a hidden command (schedule fire) this test must see"
    assert sorted(listed) == sorted(visible)
    assert not set(listed) & set(hidden)


@pytest.mark.parametrize("page", sorted(FILE_PAGES))
def test_file_page_names_every_key(page: str) -> None:
    source = (REPO / "docs" / "man" / f"{page}.md").read_text()
    assert "# SYNOPSIS" in source and "# EXAMPLE" in source
    for model in FILE_PAGES[page]:
        for key in set(model.model_fields) - NOT_IN_A_FILE:
            assert f"**{key}" in source, f"{page} does not describe {model.__name__}.{key}"


def test_units_point_to_pages_that_exist() -> None:
    for unit in sorted((REPO / "units").rglob("*.service")) + sorted(
        (REPO / "units").glob("*.socket")
    ):
        line = next(
            (x for x in unit.read_text().splitlines() if x.startswith("Documentation=")), None
        )
        assert line is not None, f"{unit.name} has no Documentation="
        for ref in re.findall(r"man:([a-z.-]+)\((\d)\)", line):
            if ref[0].startswith("cairn"):
                assert f"{ref[0]}.{ref[1]}" in PAGES, f"{unit.name}: {ref}"



def test_cairn_1_schedule_example_names_a_definition_that_schedules() -> None:
    """The EXAMPLES schedule is of a definition the example installs, with arguments its
    input takes and a calendar systemd reads (a workflow file is refused by the CLI)."""
    import json
    import shlex

    from cairn.daemon.launch import validate_args
    from cairn.definitions.user import draft_source
    from cairn.protocol.definitions import DEFINITION_RE
    from cairn.schedules import normalize_calendar
    from cairn.workflow.review import review_source

    source = (REPO / "docs" / "man" / "cairn.1.md").read_text()
    examples = source.split("# EXAMPLES", 1)[1].split("\n# ", 1)[0].replace("\\\n", " ")
    (line,) = [x for x in examples.splitlines() if "cairn schedule create" in x]
    argv = shlex.split(line)
    options = dict(zip(argv[5::2], argv[6::2], strict=True))
    definition = argv[4]
    match = DEFINITION_RE.match(definition)
    assert match is not None and match.group(1) == "user", definition
    name = match.group(2)
    assert f"cairn workflow draft {name}\n" in examples
    assert f"cairn workflow install ~/.config/cairn/drafts/{name}.py --confirm" in examples
    review = review_source(draft_source(name), filename=f"{name}.py")
    assert validate_args(review, json.loads(options["--args"]))
    assert normalize_calendar(options["--calendar"], options["--timezone"])


def test_every_page_carries_the_one_date_of_the_release(rendered: Path) -> None:
    """The sources say ``% @DATE@``; the pages get the month of debian/changelog's newest
    entry, so no page can carry another date."""
    import email.utils

    changelog = (REPO / "packaging/debian/changelog").read_text()
    stamp = re.search(r"^ -- .+?  (.+)$", changelog, re.M)
    assert stamp is not None
    month = email.utils.parsedate_to_datetime(stamp.group(1)).strftime("%B %Y")
    for source in sorted((REPO / "docs/man").glob("*.md")):
        assert source.read_text().split("\n")[:3][2] == "% @DATE@", source.name
        assert (rendered / source.name).read_text().split("\n")[2] == f"% {month}", source.name


@pytest.mark.parametrize("page", ["cairnd.8", "cairn-broker.8"])
def test_section_8_pages_say_how_they_exit_and_show_examples(rendered: Path, page: str) -> None:
    env = {"MANWIDTH": "80", "MAN_DISABLE_SECCOMP": "1"}
    shown = run(["man", "-E", "UTF-8", "-l", rendered / page], env=env).stdout.decode()
    headings = [line for line in shown.splitlines() if line and not line.startswith(" ")]
    assert "EXIT STATUS" in headings and "EXAMPLES" in headings, headings


def test_the_workflow_pages_synopsis_passes_review_and_names_what_the_runtime_has() -> None:
    from cairn.workflow import runtime
    from cairn.workflow.review import review_source

    text = (REPO / "docs/man/cairn-workflow.7.md").read_text()
    synopsis = text.split("# SYNOPSIS\n", 1)[1].split("\n# ", 1)[0]
    source = "\n".join(line[4:] for line in synopsis.splitlines() if line.startswith("    "))
    review = review_source(source + "\n", filename="synopsis.py")
    assert review.models and review.review_hash.startswith("sha256:")
    # every flow call the page lists is one the runtime's flow object has
    listed = set(re.findall(r"flow\.([a-z_]+)\(", text))
    assert listed >= {"agent", "ask", "approve", "parallel", "map", "repeat_until"}
    assert all(callable(getattr(runtime.Flow, name, None)) for name in listed), listed
