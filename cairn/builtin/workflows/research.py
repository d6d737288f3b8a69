"""Research a question: parallel read-only lines of inquiry, each in its own workspace, then
one synthesis that reads every line as evidence and returns the answer. Nothing is
written to the project: the answer is the run's output."""

from typing import Any

from cairn.workflow import Field, Model, agent, workflow

ANGLES = [
    "where the behaviour is defined and how it works, from the code itself",
    "how it is used and tested: callers, tests, configuration and examples",
    "what the documentation, comments and history of the project say about it",
    "edge cases, failure modes and limits, checked by running small experiments",
    "how the parts involved depend on each other and on outside components",
    "what could make the obvious answer wrong: contradicting code or documents",
    "performance and resource use, measured where it matters",
    "security and trust boundaries touching the question",
]


class Question(Model):
    """What to find out about the project, and how many lines of inquiry to run."""

    question: str = Field(min_length=1, max_length=20_000)
    lines: int = Field(default=3, ge=1, le=8)


class Answer(Model):
    """An answer with the evidence it rests on (file paths with line numbers, commands
    and their output), and what is still open."""

    answer: str = Field(min_length=1, max_length=8_000)
    evidence: list[str] = Field(default_factory=list, max_length=50)
    open_questions: list[str] = Field(default_factory=list, max_length=20)


class Research(Model):
    """The synthesised answer and how many lines of inquiry it drew on."""

    answer: str
    evidence: list[str]
    open_questions: list[str]
    lines: int
    lines_answered: int


researcher = agent(profile="builtin:researcher", access="read", network="none", output=Answer)


@workflow(description="Parallel lines of inquiry, then one answer drawn from all of them.",
          input=Question, output=Research)
async def run(flow: Any, args: Question) -> Research:
    keys = [f"line-{n}" for n in range(1, args.lines + 1)]

    def inquire(key: str) -> Any:
        angle = ANGLES[keys.index(key)]
        return flow.agent(
            researcher,
            prompt=(
                f"Question: {args.question}\n\nYou are {key} of {args.lines} independent "
                f"lines of inquiry. Look at it from this angle: {angle}. Answer with the "
                "evidence you found; say what you could not determine."
            ),
            title=key,
        )

    lanes = await flow.map(keys, inquire, key=lambda key: key)
    answered = [key for key in keys if lanes[key].ok]
    failed = [f"{key}: {lanes[key].error}" for key in keys if not lanes[key].ok]
    heard = "\n\n".join(
        f"## {key}\n{lanes[key].value.output.answer}" for key in answered
    )
    missing = "\n".join(failed) if failed else "none"
    synthesis = await flow.agent(
        researcher,
        prompt=(
            f"Question: {args.question}\n\n{len(answered)} of {args.lines} lines of inquiry "
            "answered; their boundaries (handoff, result, workspace) are under "
            "/evidence/incoming. Weigh them as evidence, verify claims that conflict "
            "against the project itself, and write one answer with its evidence.\n\n"
            f"{heard}\n\nLines that failed: {missing}"
        ),
        title="synthesis",
    )
    final: Answer = synthesis.output
    return Research(
        answer=final.answer,
        evidence=list(final.evidence),
        open_questions=list(final.open_questions),
        lines=args.lines,
        lines_answered=len(answered),
    )
