"""One write agent run by the opencode example profile (a real opencode run) through the relay."""

from typing import Any

from cairn.workflow import Field, Model, agent, workflow


class Goal(Model):
    goal: str = Field(min_length=1)


class Report(Model):
    summary: str = Field(min_length=1)


edit = agent(profile="opencode", access="write", network="none", output=Report)


@workflow(description="Have opencode change the project.", input=Goal, output=Report)
async def run(flow: Any, args: Goal) -> Report:
    result = await flow.agent(edit, prompt=args.goal)
    report: Report = result.output
    return report
