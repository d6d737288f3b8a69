"""Optimize a metric: a baseline measurement, then bounded trials, each an agent's change
measured and accepted or rejected; the best accepted result settles into the project."""

from typing import Any

from cairn.workflow import Field, Model, OperationFailed, agent, workflow


class Objective(Model):
    """What to improve, the host evaluator that measures it (``bench`` unless named), the
    metric that evaluator reports for it, which way is better, and how many trials to make."""

    objective: str = Field(min_length=1, max_length=20_000)
    evaluator: str = Field(default="bench", pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")
    metric: str = Field(default="runtime", pattern=r"^[a-z][a-z0-9_]{0,63}$")
    direction: str = Field(default="lower", pattern=r"^(lower|higher)$")
    max_trials: int = Field(default=3, ge=1, le=20)


class Report(Model):
    """What the trials found."""

    summary: str = Field(min_length=1, max_length=4_000)
    trials: int
    accepted: int


class Change(Model):
    """What one trial's agent changed and why."""

    summary: str = Field(min_length=1, max_length=4_000)


optimizer = agent(profile="builtin:implementer", access="write", network="none", output=Change)


@workflow(description="Measure, try bounded changes, keep only the ones that improve.",
          input=Objective, output=Report)
async def run(flow: Any, args: Objective) -> Report:
    metrics = {args.metric: {"unit": "", "direction": args.direction}}
    baseline = await flow.measure_proposal(args.evaluator, metrics=metrics)
    await flow.settle_experiment(baseline, "accept")
    best = baseline["values"][args.metric]
    accepted = 0
    for trial in range(args.max_trials):
        prompt = (
            f"{args.objective}\n\nTrial {trial + 1} of {args.max_trials}: make one change "
            f"that improves {args.metric} ({args.direction} is better; best so far {best})."
        )
        await flow.agent(optimizer, prompt=prompt)
        measured = await flow.measure_proposal(args.evaluator, metrics=metrics)
        try:
            await flow.settle_experiment(measured, "accept")
        except OperationFailed:
            await flow.settle_experiment(measured, "reject")
            continue
        accepted += 1
        best = measured["values"][args.metric]
    return Report(
        summary=f"{accepted} of {args.max_trials} trials accepted; {args.metric} went from "
        f"{baseline['values'][args.metric]} to {best}",
        trials=args.max_trials,
        accepted=accepted,
    )
