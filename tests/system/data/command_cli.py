"""One write agent run by an agent CLI's example profile through the relay; the test puts
the profile's name in place of PROFILE before it is reviewed."""

from typing import Any

from cairn.workflow import Field, Model, agent, workflow


class Goal(Model):
    goal: str = Field(min_length=1)


class Report(Model):
    summary: str = Field(min_length=1)


edit = agent(profile="PROFILE", access="write", network="none", output=Report)


@workflow(description="Have an agent CLI change the project.", input=Goal, output=Report)
async def run(flow: Any, args: Goal) -> Report:
    result = await flow.agent(edit, prompt=args.goal)
    report: Report = result.output
    return report
