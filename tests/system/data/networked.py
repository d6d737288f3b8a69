"""One write-capable agent that may reach the network: a lost attempt is uncertain."""

from typing import Any

from cairn.workflow import Field, Model, agent, workflow


class Goal(Model):
    goal: str = Field(min_length=1)


class Report(Model):
    summary: str = Field(min_length=1)


fetch = agent(profile="test:fetch", access="write", network="host", output=Report)


@workflow(description="One networked step.", input=Goal, output=Report)
async def run(flow: Any, args: Goal) -> Report:
    result = await flow.agent(fetch, prompt=args.goal)
    report: Report = result.output
    return report
