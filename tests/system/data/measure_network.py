from typing import Any

from cairn.workflow import Field, Model, workflow


class Goal(Model):
    goal: str = Field(min_length=1)


class Reached(Model):
    allowed: float
    denied: float
    direct: float


METRICS = {name: {"unit": "hits", "direction": "higher"}
           for name in ("allowed", "denied", "direct")}


@workflow(description="One measurement by an evaluator its host lets reach a domain.",
          input=Goal, output=Reached)
async def run(flow: Any, args: Goal) -> Reached:
    measured = await flow.measure_proposal("netbench", metrics=METRICS, primary="allowed")
    values = measured["values"]
    return Reached(allowed=values["allowed"], denied=values["denied"], direct=values["direct"])
