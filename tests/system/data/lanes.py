"""Fork one lane per name, each in its own workspace; then one agent sees them all."""

from typing import Any

from cairn.workflow import Field, Model, agent, workflow


class Plan(Model):
    lanes: list[str] = Field(min_length=1)


class Note(Model):
    text: str


lane_agent = agent(profile="test:lane", access="write", output=Note)
gather = agent(profile="test:gather", access="write", output=Note)


@workflow(description="Lanes, then a gathering agent.", input=Plan, output=Note)
async def run(flow: Any, args: Plan) -> Note:
    results = await flow.map(
        args.lanes, lambda name: flow.agent(lane_agent, prompt=name), key=lambda name: name
    )
    done = ",".join(sorted(key for key, lane in results.items() if lane.ok))
    final = await flow.agent(gather, prompt=done)
    note: Note = final.output
    return note
