"""Work until a checked goal holds: the host evaluator the ``check`` argument names is run
over W; while its ``metric`` (``holds`` unless named) is below 1, a write-capable agent
makes another attempt, at most ``max_attempts`` times. A goal that still does not hold
fails the run, so nothing half-done settles into the project."""

from typing import Any

from cairn.workflow import Field, Model, agent, workflow


class Goal(Model):
    """What should become true, the check that shows it (a host evaluator printing the
    metric ``metric``: 1 when it holds, 0 when not), and how many attempts to make."""

    goal: str = Field(min_length=1, max_length=20_000)
    check: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")
    metric: str = Field(default="holds", pattern=r"^[a-z][a-z0-9_]{0,63}$")
    max_attempts: int = Field(default=5, ge=1, le=20)


class Change(Model):
    """What one attempt's agent changed and why."""

    summary: str = Field(min_length=1, max_length=4_000)


class Reached(Model):
    """How the goal came to hold."""

    summary: str
    attempts: int
    changes: list[str]


worker = agent(profile="builtin:implementer", access="write", network="none", output=Change)


@workflow(description="Attempt changes until the host's check says the goal holds.",
          input=Goal, output=Reached)
async def run(flow: Any, args: Goal) -> Reached:
    metrics = {args.metric: {"unit": "", "direction": "higher"}}

    async def holds(_step: Any = None) -> bool:
        measured = await flow.measure_proposal(args.check, metrics=metrics)
        return bool(measured["values"][args.metric] >= 1)

    if await holds():
        return Reached(summary=f"{args.check} already held; nothing changed", attempts=0,
                       changes=[])
    changes: list[str] = []

    async def attempt(number: int) -> str:
        done = await flow.agent(
            worker,
            prompt=(
                f"Goal: {args.goal}\n\nAttempt {number} of {args.max_attempts}. The host's "
                f"check {args.check!r} does not hold yet"
                + (" after the earlier attempts (their boundaries are under /evidence)"
                   if number > 1 else "")
                + ". Make the change that makes it hold."
            ),
            title=f"attempt {number}",
        )
        changes.append(done.output.summary)
        return str(done.output.summary)

    outcome = await flow.repeat_until(attempt, holds, max_attempts=args.max_attempts)
    if not outcome.passed:
        raise ValueError(
            f"the check {args.check} still does not hold after {outcome.attempts} attempts"
        )
    return Reached(
        summary=f"{args.check} holds after {outcome.attempts} of {args.max_attempts} attempts",
        attempts=outcome.attempts,
        changes=changes,
    )
