"""Review the project: parallel read-only reviewers, each through its own lens on the
focus, then one verdict with the findings that hold. Nothing is written to the project:
the verdict is the run's output."""

from typing import Any, Literal

from cairn.workflow import Field, Model, agent, workflow

LENSES = [
    "correctness: wrong results, broken invariants, off-by-one and state errors",
    "error handling: failures that are swallowed, unclear or leave things half done",
    "security: untrusted input, privileges, secrets and injection",
    "tests: claims without a test that can fail, missing cases, flaky tests",
    "concurrency and crash safety: races, partial writes, recovery",
    "interfaces: names, contracts and documentation that mislead a caller",
    "performance: work that grows badly with input, needless I/O",
    "maintainability: duplication, dead code, misplaced responsibilities",
]


class Focus(Model):
    """What the review is about, and how many reviewers look at it."""

    focus: str = Field(min_length=1, max_length=20_000)
    reviewers: int = Field(default=3, ge=1, le=8)


class Finding(Model):
    """One problem: how serious, where (path:line), what is wrong, and what to do."""

    severity: Literal["high", "medium", "low"]
    where: str = Field(min_length=1, max_length=500)
    problem: str = Field(min_length=1, max_length=2_000)
    suggestion: str = Field(default="", max_length=2_000)


class Verdict(Model):
    """A verdict and the findings it rests on, most serious first."""

    verdict: Literal["approve", "changes-needed"]
    summary: str = Field(min_length=1, max_length=4_000)
    findings: list[Finding] = Field(default_factory=list, max_length=50)


reviewer = agent(profile="builtin:reviewer", access="read", network="none", output=Verdict)


@workflow(description="Parallel read-only reviewers, then one verdict with findings.",
          input=Focus, output=Verdict)
async def run(flow: Any, args: Focus) -> Verdict:
    def examine(number: int) -> Any:
        return flow.agent(
            reviewer,
            prompt=(
                f"Review the project with this focus: {args.focus}\n\nYou are reviewer "
                f"{number} of {args.reviewers}; look through this lens first: "
                f"{LENSES[number - 1]}. Report findings you verified, with path:line, most "
                "serious first."
            ),
            title=f"reviewer-{number}",
        )

    numbers = list(range(1, args.reviewers + 1))
    keys = [f"reviewer-{n}" for n in numbers]
    lanes = await flow.map(numbers, examine, key=lambda n: f"reviewer-{n}")
    heard = [key for key in keys if lanes[key].ok]
    reports = "\n\n".join(
        f"## {key}: {lanes[key].value.output.verdict}\n{lanes[key].value.output.summary}\n"
        + "\n".join(f"- [{f.severity}] {f.where}: {f.problem}"
                    for f in lanes[key].value.output.findings)
        for key in heard
    )
    failed = ", ".join(key for key in keys if not lanes[key].ok) or "none"
    verdict = await flow.agent(
        reviewer,
        prompt=(
            f"Focus of the review: {args.focus}\n\n{len(heard)} of {args.reviewers} "
            "reviewers reported; their boundaries are under /evidence/incoming. Check each "
            "finding against the project, drop what does not hold, merge duplicates, and "
            "give one verdict: approve only if no finding of high severity holds.\n\n"
            f"{reports}\n\nReviewers that failed: {failed}"
        ),
        title="verdict",
    )
    final: Verdict = verdict.output
    return final
