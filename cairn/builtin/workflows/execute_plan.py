"""Execute a written plan: a planner turns the plan file into an ordered worklist, then one
write-capable agent carries out each point in turn (a durable worklist: a resumed run
continues at the point it was on)."""

from typing import Any

from cairn.workflow import Field, Model, agent, workflow


class PlanFile(Model):
    """The plan: a file of the project, by its path relative to the project's root."""

    plan: str = Field(
        min_length=1,
        max_length=1_024,
        pattern=r"^\.?[A-Za-z0-9_][A-Za-z0-9_.-]*(/\.?[A-Za-z0-9_][A-Za-z0-9_.-]*)*$",
    )


class Worklist(Model):
    """The plan's points, in the order they are to be carried out."""

    points: list[str] = Field(min_length=1, max_length=50)


class Step(Model):
    """What one point's agent changed."""

    summary: str = Field(min_length=1, max_length=4_000)


class Outcome(Model):
    """The points carried out, in order, with what each agent reported."""

    summary: str
    done: list[str]
    reports: list[str]


planner = agent(profile="builtin:planner", access="read", network="none", output=Worklist)
implement = agent(profile="builtin:implementer", access="write", network="none", output=Step)


@workflow(description="Turn a plan file into a worklist and carry out each point in order.",
          input=PlanFile, output=Outcome)
async def run(flow: Any, args: PlanFile) -> Outcome:
    planned = await flow.agent(
        planner,
        prompt=(
            f"Read the plan in the project file {args.plan} and return its points as an "
            "ordered worklist: one entry per point, each a self-contained instruction "
            "(what to change, where, how to check it) of at most 120 characters if it can "
            "be, in the order the plan gives. Do not add points the plan does not ask for."
        ),
        title="worklist",
    )
    points: list[str] = list(planned.output.points)
    started: list[str] = []  # points may repeat: count the calls, not look the point up

    async def carry_out(point: str) -> str:
        started.append(point)
        number = len(started)
        done = await flow.agent(
            implement,
            prompt=(
                f"Carry out point {number} of {len(points)} of the plan in {args.plan}:\n\n"
                f"{point}\n\nDo only this point; the earlier points are done (their "
                "boundaries are under /evidence) and the later ones come after you."
            ),
            title=f"point {number}",
        )
        return str(done.output.summary)

    reports = await flow.unroll(points, carry_out, title="Plan")
    return Outcome(
        summary=f"{len(points)} of {len(points)} points of {args.plan} done",
        done=points,
        reports=reports,
    )
