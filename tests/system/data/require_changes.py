"""A write agent that edits, then one that only reads, asked twice to change the project:
once required (its failure comes back as OperationFailed), once not."""

from typing import Any

from cairn.workflow import Field, Model, OperationFailed, agent, workflow


class Goal(Model):
    goal: str = Field(min_length=1)


class Step(Model):
    summary: str = Field(min_length=1)


class Outcome(Model):
    edited: str
    required: str  # "changed", or the kind of the failure
    optional: str


editor = agent(profile="test:editor", access="write", output=Step)
reader = agent(profile="test:reader", access="write", output=Step)


@workflow(description="Require changes of write agents.", input=Goal, output=Outcome)
async def run(flow: Any, args: Goal) -> Outcome:
    edited = await flow.agent(editor, prompt=args.goal, require_changes=True)
    try:
        await flow.agent(reader, prompt="look", title="required", require_changes=True)
        required = "changed"
    except OperationFailed as failed:
        required = failed.kind
    optional = await flow.agent(reader, prompt="look again", title="optional")
    return Outcome(edited=edited.output.summary, required=required,
                   optional=optional.output.summary)
