"""Three sequential write-capable agents sharing one workspace, then settlement."""

from typing import Any

from cairn.workflow import Field, Model, agent, workflow


class Goal(Model):
    goal: str = Field(min_length=1)


class Step(Model):
    summary: str = Field(min_length=1)


first = agent(profile="test:first", access="write", output=Step)
second = agent(profile="test:second", access="write", output=Step)
third = agent(profile="test:third", access="write", output=Step)


@workflow(description="Three steps in one workspace.", input=Goal, output=Step)
async def run(flow: Any, args: Goal) -> Step:
    a = await flow.agent(first, prompt=args.goal)
    b = await flow.agent(second, prompt=a.output.summary)
    c = await flow.agent(third, prompt=b.output.summary)
    result: Step = c.output
    return result
