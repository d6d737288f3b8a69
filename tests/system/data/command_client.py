"""One agent run by a host-configured command (an OpenAI-style client) through the relay."""

from typing import Any

from cairn.workflow import Field, Model, agent, workflow


class Goal(Model):
    goal: str = Field(min_length=1)


class Report(Model):
    summary: str = Field(min_length=1)


ask = agent(profile="client", access="write", network="none", output=Report)


@workflow(description="Ask the model through an external client.", input=Goal, output=Report)
async def run(flow: Any, args: Goal) -> Report:
    result = await flow.agent(ask, prompt=args.goal)
    report: Report = result.output
    return report
