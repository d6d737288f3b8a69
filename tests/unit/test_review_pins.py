"""Pins of review outcomes: a refactor of the review may not change a single hash.

``PASSED`` holds the ``review_hash`` of every builtin workflow (a person confirmed exactly
these; a changed hash would ask every installation to confirm again) and of the other
workflows the tests ship. ``REJECTED`` holds a fingerprint of every rejection fixture's
full violation list (line, column, rule and message), so the wording stays too.

Changing a pin is a behaviour change of the review: say so where you change it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from cairn.workflow.review import ReviewRejected, review_source

ROOT = Path(__file__).parents[2]
FIXTURES = ROOT / "tests" / "unit" / "fixtures" / "workflows"

PASSED = {
    "cairn/builtin/workflows/execute_plan.py":
        "sha256:30140b458a9024d9d705468b8c4e6eff4a0c7543b5bb5fce873825e5e31f38dd",
    # Changed when a launch argument could name the evaluator: goal's check argument names
    # it (it named the metric of the host's "check" evaluator), its metric is an argument.
    "cairn/builtin/workflows/goal.py":
        "sha256:52264661aacf9ead224479e43ca55dccafbb855aa31a0ba6d6293d35354d2e4c",
    "cairn/builtin/workflows/implement.py":
        "sha256:2dd94c1000f26fb6947e962eed648abff0201040d9be5f4a084bb4315b6d8733",
    # Changed when a launch argument could name the evaluator: optimize takes
    # evaluator (default "bench", the one it always used). Changed again when it took a
    # target (no more trials once reached) and gave each trial's settlement a report.
    "cairn/builtin/workflows/optimize.py":
        "sha256:2d23961dbcd6a8d0b6dd0195a6fbcf9ac29e725fdd274b9ead26617a10d4e735",
    "cairn/builtin/workflows/research.py":
        "sha256:f4c0014ecba1471e4eed790a7c2c459fd061b5302207436bea187aa4c9b114a7",
    "cairn/builtin/workflows/review.py":
        "sha256:2b89e42f1515362c9a393440cdb75a81f332397888aeef754fcbbdc23ce9d7da",
    "tests/unit/fixtures/workflows/good_idioms.py":
        "sha256:864ed08d1d47e32aa5ac85d7d0a7460d4a7c10e6a431fbbd294afbad1de5de5e",
    # Changed when the review began refusing the kinds this release does not carry out:
    # the fixture's flow.measure_proposal and flow.settle_experiment became an agent call
    # (they were in bad_flow_not_available until experiments were carried out).
    "tests/unit/fixtures/workflows/good_multi.py":
        "sha256:a8c11fdfc636605c0ae96475e2b3939e0a1c3b414d166f7e7e85993245cdaab8",
    "tests/system/data/command_client.py":
        "sha256:ed49324625bce8089a61fe3b1c726b59e5e1acc9b888ea4237dfa43896ce6a08",
    "tests/system/data/fetching.py":
        "sha256:4ceeeeb2f1495c49493dbfa42a499586d29d98260a43ceaa943c46070ee48eb1",
    "tests/system/data/lanes.py":
        "sha256:900302b4a38a055b8866336935ae0c183f31d20f4be3137ab6a71a254093ab2d",
    "tests/system/data/networked.py":
        "sha256:001d644f211803ef0bb25ad06ec961aba1e6a6a7931538d8b546def2ce557152",
    "tests/system/data/three_steps.py":
        "sha256:f121385880f56e751a56600b273f31aa553d4edc4c3ba4744dc43fd395e735a2",
}
REJECTED = {
    "bad_agent_allowlist": "d5b1e76a50f3b121",
    "bad_agent_in_function": "7a761a95f90ba93d",
    "bad_agent_nonliteral": "6f749c9be54c0467",
    "bad_agent_output": "09c14727c6b67fbb",
    "bad_async_for": "91c381fc6dfcf4ba",
    "bad_async_generator": "9448ccad504403ac",
    "bad_bare_except": "13595394b0abdd1d",
    "bad_class_base": "e6d9afa9329a3cb8",
    "bad_class_nested": "6838c94da748345f",
    "bad_decorator": "c4857d0a4c86dee2",
    "bad_dunder_attribute": "2dbd0b8060e87963",
    "bad_dunder_name": "bacdd0a915cfaedb",
    "bad_dunder_subscript": "4fe4b0f6767f1110",
    "bad_eval": "031bba9b8a956d88",
    "bad_except_base": "7e2ef6dfa848a8d1",
    "bad_except_unknown": "2fad72a4ac60a9ce",
    "bad_factory_elsewhere": "d5e1b295e44f35e1",
    "bad_factory_fit": "f7d3bd9011aac10a",
    "bad_factory_lambda": "8a08ca541a6e24ac",
    "bad_finally_return": "558c7cadd2a02782",
    "bad_flow_ask_schema": "e1b4d1210deb3aa8",
    "bad_flow_descriptor_var": "d8935a7fe8cbfd42",
    "bad_flow_escape": "abbc7717e6611780",
    "bad_flow_require_changes": "dcd733a56b68bb87",
    # Changed when the review began refusing the kinds this release does not carry out:
    # the message lists only the operations a reviewed workflow may call.
    # The list of operations in its message grew by measure_proposal, settle_experiment,
    # then by approve, then by restore.
    "bad_flow_unknown": "8f2d3b2724eaec97",
    "bad_format": "73ebe8615ab9ef84",
    "bad_format_attribute": "b0710ae2a2658d17",
    "bad_format_index": "9f527080438a8bb1",
    "bad_format_nested": "0fe3614eb45b6be6",
    "bad_frame": "fa65f8e6bfd27d06",
    "bad_getattr": "db98a035e3ed6314",
    "bad_global": "b31f0e6be22fa802",
    "bad_id": "b4c1c8e352538552",
    "bad_import_api_alias": "44609ac9372e2ea8",
    "bad_import_nested": "443858304a997a63",
    "bad_import_os": "b48c92571ab866f4",
    "bad_import_relative": "132fc142b810fb8a",
    "bad_import_time": "4f3645374408aa2e",
    "bad_iter_sentinel": "f6318e355a0bdd5c",
    "bad_itertools_count": "da9e7fa07e7ce37b",
    # Changed when a launch argument could name the evaluator: the fixture's args.text
    # became args.text.lower(), and the message names both accepted forms and why not.
    "bad_measure_nonliteral": "aad92ced04849f7b",
    "bad_model_body": "5ae7bdf3d0264978",
    "bad_model_constraint_type": "254955930b30db62",
    # Changed when default_factory became supported: the fixture's keyword was
    # default_factory=list (now accepted), it is alias= now, and the message lists
    # default_factory among the keywords to use.
    "bad_model_field_kw": "5a6d9be34dfc634f",
    "bad_model_field_name": "980e32d93f4dfb61",
    "bad_model_field_v1": "29d1c2f2fcc92234",
    "bad_model_type": "737aaa9efb05a820",
    "bad_module_object": "28f34980758f05c3",
    "bad_module_private": "a773fe88ec7e88eb",
    "bad_module_submodule": "e05f10b9f5486ca2",
    "bad_nonlocal": "f1d2d93240904bbd",
    "bad_open": "bb29348c5a0b37f1",
    "bad_print": "66ea4d3e569b1e15",
    "bad_rebind_descriptor": "a82d8ed00dd15b1f",
    "bad_rebind_exception": "87df98bc630c5cfe",
    "bad_two_workflows": "2340cb9c9de31dd7",
    "bad_typing_eval": "c460c24fb371c42b",
    # Changed when a 'while' with a literal bound became allowed (ARCHITECTURE §4.2): the
    # refusal says what bound would do.
    "bad_while": "c183449c7c531847",
    "bad_workflow_description": "4c2984949d01a458",
}


def fingerprint(error: ReviewRejected) -> str:
    rows = [[v.line, v.col, v.rule, v.message] for v in error.violations]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


def test_every_builtin_workflow_is_pinned() -> None:
    folder = ROOT / "cairn" / "builtin" / "workflows"
    builtin = {str(path.relative_to(ROOT)) for path in folder.glob("*.py")}
    assert builtin and builtin <= set(PASSED)


def test_every_rejection_fixture_is_pinned() -> None:
    assert {path.stem for path in FIXTURES.glob("bad_*.py")} == set(REJECTED)


@pytest.mark.parametrize("name", sorted(PASSED))
def test_review_hash_is_pinned(name: str) -> None:
    path = ROOT / name
    review = review_source(path.read_text(), filename=path.name)
    assert review.review_hash == PASSED[name]


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_rejection_is_pinned(name: str) -> None:
    path = FIXTURES / f"{name}.py"
    with pytest.raises(ReviewRejected) as info:
        review_source(path.read_text(), filename=path.name)
    assert fingerprint(info.value) == REJECTED[name]
