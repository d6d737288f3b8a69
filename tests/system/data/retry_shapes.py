"""Every shape a clean retry restores W in: a worklist (flow.unroll, as execute-plan), an
optimize trial (a measurement, then an accept, before an agent), and lanes (a lane's
first agent, a join and a question before an agent). Each agent writes its file, appends
to log.txt and lists what it sees of earlier boundaries' workspaces."""

from typing import Any

from cairn.workflow import Field, Model, agent, workflow


class Shape(Model):
    shape: str = Field(pattern=r"^(plan|trial|lanes)$")


class Step(Model):
    summary: str = Field(min_length=1)


class Choice(Model):
    colour: str = Field(min_length=1)


class Outcome(Model):
    summary: str


step = agent(profile="test:step", access="write", network="none", output=Step)
METRICS = {"score": {"unit": "points", "direction": "lower"}}


@workflow(description="A clean retry after each kind of predecessor.", input=Shape,
          output=Outcome)
async def run(flow: Any, args: Shape) -> Outcome:
    first = await flow.agent(step, prompt="first")
    done = [str(first.output.summary)]
    if args.shape == "plan":
        async def carry_out(point: str) -> str:
            result = await flow.agent(step, prompt=point)
            return str(result.output.summary)

        done += await flow.unroll(["one", "two", "three"], carry_out, title="Plan")
    elif args.shape == "trial":
        await flow.measure_proposal("score", metrics=METRICS)
        after_measure = await flow.agent(step, prompt="measured")
        measured = await flow.measure_proposal("score", metrics=METRICS)
        await flow.settle_experiment(measured, "accept")
        after_accept = await flow.agent(step, prompt="accepted")
        done += [str(after_measure.output.summary), str(after_accept.output.summary)]
    else:
        lanes = await flow.map(["x", "y"], lambda key: flow.agent(step, prompt=key),
                               key=lambda key: key)
        done += sorted(key for key, lane in lanes.items() if lane.ok)
        after_join = await flow.agent(step, prompt="joined")
        choice = await flow.ask("Which colour?", schema=Choice)
        after_ask = await flow.agent(step, prompt=choice.colour)
        done += [str(after_join.output.summary), str(after_ask.output.summary)]
    return Outcome(summary=",".join(done))
