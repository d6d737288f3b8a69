"""One agent that may reach only allowed.test, through the run's allowlist proxy."""

from typing import Any

from cairn.workflow import Field, Model, agent, workflow


class Goal(Model):
    goal: str = Field(min_length=1)


class Report(Model):
    summary: str = Field(min_length=1)


fetch = agent(
    profile="builtin:implementer",
    access="write",
    network="allowlist",
    allowlist=("allowed.test",),
    output=Report,
)


@workflow(description="Fetch from a reviewed domain.", input=Goal, output=Report)
async def run(flow: Any, args: Goal) -> Report:
    result = await flow.agent(fetch, prompt=args.goal)
    report: Report = result.output
    return report
