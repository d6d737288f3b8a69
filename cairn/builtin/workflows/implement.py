"""Implement one reviewed objective with one write-capable agent."""

from typing import Any

from cairn.workflow import Field, Model, agent, workflow


class Objective(Model):
    """What to change in the project, in plain words."""

    objective: str = Field(min_length=1, max_length=20_000)


class Summary(Model):
    """What the agent changed and why."""

    summary: str = Field(min_length=1, max_length=4_000)


implement = agent(profile="builtin:implementer", access="write", network="none", output=Summary)


@workflow(description="Implement one reviewed objective.", input=Objective, output=Summary)
async def run(flow: Any, args: Objective) -> Summary:
    result = await flow.agent(implement, prompt=args.objective)
    summary: Summary = result.output
    return summary
