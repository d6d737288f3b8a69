"""Run budgets from the launch description: reserved before work, kept across restarts,
and an exhausted one refuses the next operation — never a boundary under way."""

from __future__ import annotations

from machine import Machine
from test_lanes import launch as launch_lanes
from test_lanes import wait
from test_recovery import launch, prepare, unit_starts, wait_finished


def test_agent_operation_budget_refuses_the_next_agent(machine: Machine) -> None:
    project, args = prepare(machine)
    run_id = launch(machine, project, [*args, "--limit", "max_agent_ops=2"])
    data = wait_finished(machine, run_id)
    assert data["run"]["state"] == "failed"
    assert "budget exhausted" in data["run"]["error"]
    states = [o["state"] for o in data["operations"]]
    assert states == ["committed", "committed", "not-started"]
    assert unit_starts(machine, run_id) == {"root-1": [1], "root-2": [1]}
    assert any(e["event"] == "budget-exhausted" for e in data["events"])
    # the first two boundaries are intact, and nothing was applied
    assert all(o["checkpoint"] for o in data["operations"][:2])
    assert data["settlement"] is None


def test_concurrent_agents_are_capped_and_queued_lanes_wait(machine: Machine) -> None:
    names = ["a", "b", "c", "d"]
    run_id, _project = launch_lanes(machine, names, "--limit", "max_concurrent_agents=2")
    data = wait(machine, run_id, lambda d: d["run"]["state"] in ("succeeded", "failed"))
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    spans = []
    for name in names:
        base = f"/var/lib/cairn/pool/runs/{run_id}/checkpoints/root-1-{name}-1"
        start = float(machine.exec(["cat", f"{base}/started-{name}"]).stdout)
        end = float(machine.exec(["cat", f"{base}/ended-{name}"]).stdout)
        spans.append((start, end))
    for start, _end in spans:  # never more than two lanes' agents at the same moment
        assert sum(1 for s, e in spans if s <= start < e) <= 2, spans
