"""Host-configured evaluators: the commands ``flow.measure_proposal`` runs (ARCHITECTURE §4.1).

One file per evaluator, ``/etc/cairn/evaluators.d/NAME.toml``::

    argv = ["/usr/local/bin/bench", "--json"]  # run in a snapshot of W; argv[0] absolute
    timeout_sec = 600                           # each run (warm-up or sample)
    warmups = 1                                 # runs whose values are discarded
    samples = 5                                 # runs whose values are recorded
    network = false                             # the only value this release accepts
    [environment]
    LANG = "C.UTF-8"

A workflow names an evaluator (``flow.measure_proposal("bench", ...)``), never its argv.
The review records the names a workflow uses; a launch freezes those evaluators into its
launch description (a run never re-reads this directory) and refuses a launch that names
one the host does not configure. Each run prints the metric values as one JSON line
(:mod:`cairn.protocol.measurement`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import Field

from cairn import paths
from cairn.config import Problems
from cairn.protocol.launch import VERIFIER_NAME_RE, EvaluatorSpec
from cairn.verifiers import CommandConfig

FIX = (
    "an evaluator has argv (argv[0] an absolute path), timeout_sec, warmups, samples, "
    "network = false and an optional [environment] (see docs/writing-workflows.md)"
)


class EvaluatorConfig(CommandConfig):
    """One ``evaluators.d/NAME.toml``."""

    warmups: int = Field(default=0, ge=0, le=100)
    samples: int = Field(default=1, ge=1, le=1000)
    network: Literal[False] = False


def evaluators_dir() -> Path:
    return paths.config_dir() / "evaluators.d"


def load_evaluators(problems: Problems) -> dict[str, EvaluatorConfig]:
    """Every ``evaluators.d/*.toml`` by name; problems recorded in ``problems``."""
    found: dict[str, EvaluatorConfig] = {}
    directory = evaluators_dir()
    if not directory.is_dir():
        return found
    for file in sorted(directory.glob("*.toml")):
        if not VERIFIER_NAME_RE.fullmatch(file.stem):
            problems.add(file, "", f"evaluator name {file.stem!r} is not [a-z0-9][a-z0-9_-]*",
                         "rename the file")
            continue
        loaded = problems.load(file, EvaluatorConfig, fix=FIX)
        if loaded is not None:
            found[file.stem] = loaded
    return found


def frozen_evaluators(names: Iterable[str], problems: Problems) -> list[EvaluatorSpec]:
    """The evaluators a reviewed workflow names, as its launch freezes them (sorted by
    name); a name the host does not configure is a problem. A workflow that measures
    nothing reads no evaluator file, so a broken one refuses only the launches using it."""
    wanted = sorted(set(names))
    if not wanted:
        return []
    configured = load_evaluators(problems)
    specs: list[EvaluatorSpec] = []
    for name in wanted:
        config = configured.get(name)
        if config is None:
            problems.add(evaluators_dir() / f"{name}.toml", "",
                         f"the workflow measures with evaluator {name!r}, which is not configured",
                         f"an administrator adds it: {FIX}")
            continue
        specs.append(EvaluatorSpec(
            name=name,
            argv=config.argv,
            timeout_sec=config.timeout_sec,
            environment=config.environment,
            warmups=config.warmups,
            samples=config.samples,
            config_sha256=config.config_sha256(),
        ))
    return specs
