from typing import Any

from cairn.workflow import Field, Model, agent, workflow


class Goal(Model):
    goal: str = Field(min_length=1)


class Outcome(Model):
    summary: str


good = agent(profile="test:good", access="write", output=Outcome)
bad = agent(profile="test:bad", access="write", output=Outcome)
METRICS = {"score": {"unit": "points", "direction": "lower"}}


@workflow(description="A baseline, then one trial accepted and one rejected.", input=Goal,
          output=Outcome)
async def run(flow: Any, args: Goal) -> Outcome:
    baseline = await flow.measure_proposal("score", metrics=METRICS)
    await flow.settle_experiment(baseline, "accept")
    await flow.agent(good, prompt=args.goal)
    better = await flow.measure_proposal("score", metrics=METRICS)
    accepted = await flow.settle_experiment(better, "accept")
    await flow.agent(bad, prompt=args.goal)
    worse = await flow.measure_proposal("score", metrics=METRICS)
    rejected = await flow.settle_experiment(worse, "reject")
    return Outcome(summary=f"best {accepted['best']}, rejected {rejected['measurement']}")
