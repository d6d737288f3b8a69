"""What each process a run starts loads at start: only what its normal path uses. A run
starts a coordinator (with its control worker), model egress, an import unit, an agent worker, a
candidate unit and an apply unit, and 32 concurrent runs start each of them 32 times, so a
module one of them loads for nothing costs every run. Checked in a fresh ``python -I``: the
test process has imported everything long before."""

from __future__ import annotations

import json
import sys

import pytest

from cairn.proc import run

# Never at the start of any of these processes: the CLI's toolkit and the daemon's review.
NOT_A_HELPERS = frozenset({"typer", "click", "rich", "cairn.cli", "cairn.workflow.review"})
# The model relay's client and server (http.client, ssl, ...): only for an agent or a run
# that reaches a model.
MODEL_HTTP = frozenset({"http.client", "http.server", "ssl", "socketserver"})
PYDANTIC_ITSELF = frozenset({"pydantic", "pydantic_core", "annotated_types"})
PYDANTIC = PYDANTIC_ITSELF | {"cairn.protocol"}

NOT_AT_START = {
    # The apply unit applies a plan: no stream parser, no storage, no broker protocol, and
    # no pydantic (root checks what it writes; docs/decisions/helpers-without-pydantic.md).
    "cairn.worker.apply": NOT_A_HELPERS | MODEL_HTTP | PYDANTIC | {
        "cairn.protocol.broker",
        "cairn.settle.candidate",
        "cairn.settle.changes",
        "cairn.storage",
        "btrfsutil",
        "cairn.proc",
        "subprocess",
        "jeepney",
        "sqlite3",
    },
    # The candidate unit parses the stream it is handed; root made it. No pydantic either
    # (its bounds come from cairn.protocol.limits, plain numbers).
    "cairn.worker.candidate": NOT_A_HELPERS | MODEL_HTTP | PYDANTIC_ITSELF | {
        "cairn.protocol.settlement",
        "cairn.protocol.base",
        "cairn.protocol.broker",
        "cairn.storage",
        "btrfsutil",
        "jeepney",
        "sqlite3",
    },
    # A scripted or command agent: the llm agent's code and the relay shim load on use.
    "cairn.worker.__main__": NOT_A_HELPERS | MODEL_HTTP | {
        "cairn.worker.llm",
        "cairn.worker.retry",
        "cairn.worker.shim",
        "cairn.forwarding",
        "cairn.protocol.broker",
        "jeepney",
        "sqlite3",
    },
    # The control worker runs the reviewed source: not the launch description's models.
    "cairn.workflow.runtime": NOT_A_HELPERS | MODEL_HTTP | {
        "cairn.protocol.launch",
        "cairn.protocol.broker",
        "jeepney",
        "sqlite3",
    },
    # The coordinator's whole run (main imports core): a relay only for runs with models.
    "cairn.coordinator.core": (NOT_A_HELPERS - {"cairn.workflow.review"}) | MODEL_HTTP | {
        "cairn.coordinator.relay",
    },
    # Model egress admits CONNECTs to the launch description's routes: it reads no intents.
    "cairn.coordinator.egress": NOT_A_HELPERS | MODEL_HTTP | {
        "cairn.protocol.broker",
        "cairn.storage",
        "jeepney",
    },
    "cairn.importer": NOT_A_HELPERS | MODEL_HTTP | PYDANTIC | {
        "cairn.protocol.broker",
        "jeepney",
        "sqlite3",
    },
}

REPORT = "import json, sys; print(json.dumps(sorted(sys.modules)))"


def modules_at_start(module: str) -> set[str]:
    proc = run([sys.executable, "-I", "-c", f"import {module}\n{REPORT}"], timeout=60)
    return set(json.loads(proc.stdout.decode().splitlines()[-1]))


def loaded_under(names: frozenset[str] | set[str], loaded: set[str]) -> list[str]:
    """The ``names`` (or a submodule of one) that are in ``loaded``."""
    return sorted(n for n in names if any(m == n or m.startswith(f"{n}.") for m in loaded))


@pytest.mark.parametrize("module", sorted(NOT_AT_START))
def test_a_run_process_loads_nothing_its_normal_path_does_not_use(module: str) -> None:
    loaded = modules_at_start(module)
    assert module in loaded  # it really was imported
    assert ("pydantic" in loaded) is ("pydantic" not in NOT_AT_START[module])
    assert loaded_under(NOT_AT_START[module], loaded) == []


def test_the_coordinator_still_reviews_its_pinned_source_at_start() -> None:
    """The coordinator re-reviews the source before it resumes (check_pinned_source), so
    the review is the one heavy part it keeps."""
    assert "cairn.workflow.review" in modules_at_start("cairn.coordinator.core")
