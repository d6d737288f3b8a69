"""Optimize a metric: a baseline measurement, then bounded trials, each an agent's change
measured and accepted or rejected (with a report of what it tried), until the target is
reached or the trials run out; the best accepted result settles into the project."""

from typing import Any

from cairn.workflow import Field, Model, OperationFailed, agent, workflow


class Objective(Model):
    """What to improve, the host evaluator that measures it (``bench`` unless named), the
    metric that evaluator reports for it, which way is better, how many trials to make at
    most, and the value that is good enough (no more trials once the best reaches it)."""

    objective: str = Field(min_length=1, max_length=20_000)
    evaluator: str = Field(default="bench", pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")
    metric: str = Field(default="runtime", pattern=r"^[a-z][a-z0-9_]{0,63}$")
    direction: str = Field(default="lower", pattern=r"^(lower|higher)$")
    max_trials: int = Field(default=3, ge=1, le=20)
    target: float | None = None


class Report(Model):
    """What the trials found."""

    summary: str = Field(min_length=1, max_length=4_000)
    trials: int
    accepted: int
    target_reached: bool


class Change(Model):
    """What one trial's agent changed and why."""

    summary: str = Field(min_length=1, max_length=4_000)


optimizer = agent(profile="builtin:implementer", access="write", network="none", output=Change)


@workflow(description="Measure, try bounded changes, keep only the ones that improve.",
          input=Objective, output=Report)
async def run(flow: Any, args: Objective) -> Report:
    metrics = {args.metric: {"unit": "", "direction": args.direction}}
    baseline = await flow.measure_proposal(args.evaluator, metrics=metrics)
    settled = await flow.settle_experiment(baseline, "accept", target=args.target)
    best = baseline["values"][args.metric]
    reached = args.target is not None and settled["target_reached"]
    accepted = 0
    trials = 0
    for _ in range(args.max_trials):
        if reached:
            break
        trials += 1
        prompt = (
            f"{args.objective}\n\nTrial {trials} of at most {args.max_trials}: make one "
            f"change that improves {args.metric} ({args.direction} is better; best so far "
            f"{best})."
        )
        done = await flow.agent(optimizer, prompt=prompt, title=f"trial {trials}")
        measured = await flow.measure_proposal(args.evaluator, metrics=metrics)
        value = measured["values"][args.metric]
        report = {
            "hypothesis": f"trial {trials}: a change can make {args.metric} {args.direction}",
            "intervention": done.output.summary,
            "conclusion": f"{args.metric} measured {value} against the best {best}",
        }
        try:
            settled = await flow.settle_experiment(measured, "accept", report=report,
                                                   target=args.target)
        except OperationFailed:
            settled = await flow.settle_experiment(measured, "reject", report=report,
                                                   target=args.target)
        else:
            accepted += 1
            best = value
        reached = args.target is not None and settled["target_reached"]
    stop = f"; target {args.target} reached" if reached else ""
    return Report(
        summary=f"{accepted} of {trials} trials accepted; {args.metric} went from "
        f"{baseline['values'][args.metric]} to {best}{stop}",
        trials=trials,
        accepted=accepted,
        target_reached=reached,
    )
