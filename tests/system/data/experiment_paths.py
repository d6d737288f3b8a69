from typing import Any

from cairn.workflow import Field, Model, OperationFailed, agent, workflow


class Goal(Model):
    goal: str = Field(min_length=1)


class Outcome(Model):
    summary: str


gamer = agent(profile="test:gamer", access="write", output=Outcome)
METRICS = {"score": {"unit": "points", "direction": "lower"}}


@workflow(description="A trial that changed paths outside src/ is never accepted.",
          input=Goal, output=Outcome, write_paths=["src/**"])
async def run(flow: Any, args: Goal) -> Outcome:
    baseline = await flow.measure_proposal("score", metrics=METRICS)
    await flow.settle_experiment(baseline, "accept")
    await flow.agent(gamer, prompt=args.goal)
    trial = await flow.measure_proposal("score", metrics=METRICS)
    try:
        settled = await flow.settle_experiment(trial, "accept")
    except OperationFailed:
        settled = await flow.settle_experiment(trial, "reject")
    return Outcome(summary=f"{settled['disposition']} {trial['measurement']}: "
                   f"{trial['refused_count']} changes the settlement refuses")
