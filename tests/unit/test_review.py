"""Static review: every rejection rule, the effect manifest and the review hash."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import cast

import pytest

from cairn.errors import CairnError
from cairn.workflow import RUNTIME_API_VERSION
from cairn.workflow.review import (
    Review,
    ReviewRejected,
    canonical_json,
    render_review,
    review_source,
)
from cairn.workflow.review.manifest import ReviewError

FIXTURES = Path(__file__).parent / "fixtures" / "workflows"
BUILTIN = Path(__file__).parents[2] / "cairn" / "builtin" / "workflows"
BAD = sorted(FIXTURES.glob("bad_*.py"))
MARK = re.compile(r"#\s*REJECT:\s*([a-z-]+)")


def expected_violations(source: str) -> list[tuple[int, str]]:
    """(line, rule) of every line marked ``# REJECT: rule`` in a fixture."""
    return [(number, match.group(1))
            for number, line in enumerate(source.splitlines(), start=1)
            if (match := MARK.search(line))]


def reject(source: str, filename: str = "wf.py") -> ReviewRejected:
    with pytest.raises(ReviewRejected) as info:
        review_source(source, filename=filename)
    return info.value


@pytest.mark.parametrize("path", BAD, ids=[p.stem.removeprefix("bad_") for p in BAD])
def test_each_rule_rejects_its_fixture_at_the_marked_line(path: Path) -> None:
    source = path.read_text()
    expected = expected_violations(source)
    assert expected, f"{path.name} marks no line with '# REJECT: rule'"
    error = reject(source, filename=path.name)
    found = [(v.line, v.rule) for v in error.violations]
    assert found == expected, error.message
    first = error.violations[0]
    assert error.message.startswith(f"{path.name}:{first.line}:{first.col}: ")
    assert f"[{first.rule}]" in error.message
    assert "\n" not in error.message
    assert isinstance(error, ReviewError) and isinstance(error, CairnError)


def test_rule_count_covers_every_rule_family() -> None:
    rules = {rule for path in BAD for _, rule in expected_violations(path.read_text())}
    assert rules >= {
        "import", "forbidden-name", "dunder", "scope", "while", "try", "async-generator",
        "async", "agent", "literal", "workflow", "flow", "model-type", "model-body",
        "model-field", "class", "module-member", "loop", "format", "introspection",
        "decorator", "rebind",
    }


def test_message_names_file_line_column_and_reason() -> None:
    source = (FIXTURES / "bad_open.py").read_text()
    line = next(n for n, _ in expected_violations(source))
    error = reject(source, filename="implement.py")
    assert error.message == (
        f"implement.py:{line}:14: 'open' is not allowed in a workflow (workflows reach "
        "the outside only through flow.* calls) [forbidden-name]"
    )


def test_all_violations_are_collected_and_the_message_stays_one_line() -> None:
    source = (FIXTURES / "bad_open.py").read_text().replace(
        "    result = await flow.agent",
        "    eval('1')\n    exec('2')\n    compile('3', 'x', 'eval')\n"
        "    result = await flow.agent",
    )
    error = reject(source)
    assert [v.rule for v in error.violations] == ["forbidden-name"] * 4
    assert error.message.endswith("(and 1 more)")
    assert error.message.count("wf.py:") == 3


def test_syntax_error_is_a_review_error_with_position() -> None:
    error = reject("async def run(flow, args):\n    return (\n", filename="broken.py")
    assert error.violations[0].rule == "syntax"
    assert error.message.startswith("broken.py:")


def test_review_never_executes_the_source(tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    source = (f"from pathlib import Path\nPath({str(marker)!r}).write_text('x')\n"
              + (BUILTIN / "implement.py").read_text())
    error = reject(source)
    assert error.violations[0].rule == "import"
    assert not marker.exists()


def test_missing_workflow_function_is_rejected() -> None:
    error = reject("from cairn.workflow import Model\n\nclass A(Model):\n    x: int\n")
    assert [v.rule for v in error.violations] == ["workflow"]


def test_workflow_function_must_take_flow_and_args() -> None:
    source = (BUILTIN / "implement.py").read_text().replace(
        "async def run(flow: Any, args: Objective)", "async def run(flow, args: Objective, x)")
    assert [v.rule for v in reject(source).violations] == ["workflow"]


def test_flow_passed_to_a_helper_under_another_name_is_rejected() -> None:
    source = (FIXTURES / "good_multi.py").read_text()
    source = source.replace("async def review_point(flow, point: Point)",
                            "async def review_point(f, point: Point)")
    source = source.replace('result = await flow.agent(researcher, prompt=f"Check',
                            'result = await f.agent(researcher, prompt=f"Check')
    error = reject(source)
    assert [v.rule for v in error.violations] == ["flow", "flow"]
    assert all("review_point" in source.splitlines()[v.line - 1] for v in error.violations)


def test_finally_may_break_out_of_its_own_loop_but_not_out_of_the_finally() -> None:
    builtin = (BUILTIN / "implement.py").read_text()
    allowed = builtin.replace(
        "    result = await flow.agent",
        "    try:\n        pass\n    finally:\n        for _ in range(2):\n            break\n"
        "    result = await flow.agent",
    )
    review_source(allowed, filename="ok.py")
    refused = builtin.replace(
        "    result = await flow.agent",
        "    for _ in range(2):\n        try:\n            pass\n        finally:\n"
        "            continue\n    result = await flow.agent",
    )
    assert [v.rule for v in reject(refused).violations] == ["try"]


def test_except_exception_and_allowed_module_exceptions_pass() -> None:
    source = (BUILTIN / "implement.py").read_text().replace(
        "from cairn.workflow import",
        "import decimal\nfrom json import JSONDecodeError\nfrom cairn.workflow import",
    ).replace(
        "    result = await flow.agent",
        "    try:\n        pass\n    except Exception:\n        pass\n"
        "    try:\n        pass\n    except (JSONDecodeError, decimal.InvalidOperation):\n"
        "        pass\n    result = await flow.agent",
    )
    review = review_source(source, filename="ok.py")
    assert [c.kind for c in review.calls] == ["agent"]


def test_builtin_implement_manifest() -> None:
    source = (BUILTIN / "implement.py").read_text()
    review = review_source(source, filename="implement.py")
    assert review.api_version == RUNTIME_API_VERSION == "cairn.workflow/1"
    assert review.workflow.model_dump() == {
        "function": "run", "description": "Implement one reviewed objective.",
        "input": "Objective", "output": "Summary",
    }
    assert review.agents["implement"].model_dump() == {
        "profile": "builtin:implementer", "access": "write", "network": "none",
        "output": "Summary", "allowlist": (),
    }
    call_line = next(n for n, line in enumerate(source.splitlines(), 1) if "flow.agent(" in line)
    assert [(c.kind, c.line, c.descriptor, c.capabilities) for c in review.calls] == [
        ("agent", call_line, "implement", ["profile:builtin:implementer", "write"]),
    ]
    assert review.calls[0].col == source.splitlines()[call_line - 1].index("flow.agent") + 1
    assert review.capabilities == ["profile:builtin:implementer", "write"]
    assert [f.name for f in review.models["Objective"].fields] == ["objective"]
    assert review.models["Objective"].fields[0].constraints == {
        "min_length": 1, "max_length": 20_000}
    assert review.source_sha256 == hashlib.sha256(source.encode()).hexdigest()


def test_multi_call_manifest() -> None:
    review = review_source((FIXTURES / "good_multi.py").read_text(), filename="good_multi.py")
    kinds = [c.kind for c in review.calls]
    assert kinds == ["agent", "agent", "parallel", "agent", "map", "agent", "unroll", "item",
                     "ask", "agent", "repeat_until"]
    assert [c.line for c in review.calls] == sorted(c.line for c in review.calls)
    by_kind = {c.kind: c for c in review.calls}
    assert by_kind["ask"].capabilities == ["human"]
    assert by_kind["ask"].answer_schema == "Approval"
    assert by_kind["parallel"].descriptor is None and by_kind["parallel"].capabilities == []
    assert sorted({cast(str, c.descriptor) for c in review.calls if c.kind == "agent"}) == [
        "implementer", "planner", "researcher"]
    research = [c for c in review.calls if c.descriptor == "researcher"]
    assert all(c.capabilities == ["network:allowlist", "profile:user:researcher"]
               for c in research)
    assert review.capabilities == [
        "human", "network:allowlist", "profile:builtin:implementer",
        "profile:builtin:planner", "profile:user:researcher", "write"]
    assert review.agents["researcher"].allowlist == ("docs.python.org", "*.debian.org")
    assert list(review.models) == ["Point", "Plan", "Verdict", "Approval", "Report"]
    plan = {f.name: f for f in review.models["Plan"].fields}
    assert plan["points"].type.render() == "list[Point]"
    assert plan["reviewer"].type.render() == "str | None"
    assert plan["budget"].type.kind == "optional" and plan["budget"].has_default
    assert plan["mode"].type.values == ("fast", "careful")


def test_hash_is_stable_and_covers_every_character() -> None:
    source = (BUILTIN / "implement.py").read_text()
    first = review_source(source, filename="implement.py")
    again = review_source(source, filename="implement.py")
    assert first.review_hash == again.review_hash
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", first.review_hash)
    changed = review_source(source.replace("one reviewed", "one  reviewed"),
                            filename="implement.py")
    assert changed.review_hash != first.review_hash
    comment_only = review_source(source + "# trailing note\n", filename="implement.py")
    assert comment_only.review_hash != first.review_hash


def test_hash_does_not_depend_on_the_filename() -> None:
    source = (BUILTIN / "implement.py").read_text()
    here = review_source(source, filename="implement.py")
    there = review_source(source, filename="/home/someone/.config/cairn/workflows/x.py")
    assert here.review_hash == there.review_hash
    assert here.filename != there.filename


def test_hash_is_sha256_of_canonical_json_of_version_source_and_manifest() -> None:
    source = (BUILTIN / "implement.py").read_text()
    review = review_source(source, filename="implement.py")
    manifest = review.model_dump(mode="json", exclude={
        "api_version", "filename", "source_sha256", "review_hash"})
    document = {"api_version": "cairn.workflow/1", "source": source, "manifest": manifest}
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert canonical_json(document) == text
    assert review.review_hash == "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    assert review.manifest() == manifest


def test_review_round_trips_through_json() -> None:
    review = review_source((FIXTURES / "good_multi.py").read_text(), filename="m.py")
    assert Review.model_validate_json(review.model_dump_json()) == review


def test_render_review_lists_calls_and_ends_with_the_hash() -> None:
    source = (BUILTIN / "implement.py").read_text()
    review = review_source(source, filename="implement.py")
    text = render_review(review)
    lines = text.splitlines()
    assert lines[-1] == f"review_hash: {review.review_hash}"
    call = review.calls[0]
    assert f"  line {call.line}  agent  implement  [profile:builtin:implementer, write]" in lines
    assert "description   Implement one reviewed objective." in lines
    assert "  objective: str  (min_length=1, max_length=20000)" in lines


WRITE_PATHS_SOURCE = (BUILTIN / "implement.py").read_text()


def with_write_paths(literal: str) -> str:
    marker = "@workflow("
    assert marker in WRITE_PATHS_SOURCE
    return WRITE_PATHS_SOURCE.replace(marker, f"{marker}write_paths={literal}, ", 1)


def test_declared_write_paths_are_reviewed_into_the_manifest() -> None:
    review = review_source(with_write_paths('["src/**", "docs/*.md"]'), filename="wf.py")
    assert review.workflow.write_paths == ["src/**", "docs/*.md"]
    assert review.manifest()["workflow"]["write_paths"] == ["src/**", "docs/*.md"]
    assert "write paths   src/**, docs/*.md" in render_review(review)
    undeclared = review_source(WRITE_PATHS_SOURCE, filename="wf.py")
    assert "write_paths" not in undeclared.manifest()["workflow"]  # older hashes stand
    assert Review.model_validate_json(review.model_dump_json()) == review


@pytest.mark.parametrize(
    ("literal", "reason"),
    [
        ('"src/**"', "write_paths= must be a literal list of project-relative globs"),
        ("[]", "write_paths= must be a literal list of project-relative globs"),
        ("[name]", "write_paths= must be a literal list of project-relative globs"),
        ('["../etc/**"]', "glob '../etc/**' is not a normalized path inside the project"),
        ('["/etc/**"]', "glob '/etc/**' is not a normalized path inside the project"),
        ('["src//x"]', "glob 'src//x' is not a normalized path inside the project"),
        ('["src/[z-a]"]', "glob 'src/[z-a]' is not a valid glob: bad character range"),
    ],
)
def test_bad_write_paths_are_refused_with_the_reason(literal: str, reason: str) -> None:
    error = reject(with_write_paths(literal))
    assert reason in error.message
    assert [v.rule for v in error.violations] == ["workflow"]
