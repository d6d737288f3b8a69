"""Host-configured checks of a proposal before it reaches the live project (ARCHITECTURE §9).

One file per check, ``/etc/cairn/verifiers.d/NAME.toml``::

    argv = ["/usr/bin/make", "check"]   # run in the proposal's tree; argv[0] absolute
    timeout_sec = 600
    [environment]
    LANG = "C.UTF-8"
    [match]                              # at least one of the two
    projects = ["/home/alice/src/app"]   # that directory or any project below it
    definitions = ["builtin:implement"]  # runs of these definitions

The checks that match a launch are frozen into its launch description (a run never
re-reads this directory). At settlement each runs, in file-name order, over a disposable
writable snapshot of F, as the project's owner, in a sandboxed unit without network; the
first that fails stops the settlement and nothing reaches the live project. Only the
administrator writes these files: a workflow never supplies argv.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from cairn import paths
from cairn.config import Problems
from cairn.protocol.launch import VerifierSpec
from cairn.protocol.names import is_verifier_name

FIX = (
    "a verifier has argv (argv[0] an absolute path), timeout_sec, optional [environment] "
    "and [match] with projects and/or definitions (see /usr/share/doc/cairn/docs/settlement.md)"
)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class VerifierMatch(BaseModel):
    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)

    projects: list[str] = []
    definitions: list[str] = []

    @field_validator("projects")
    @classmethod
    def _absolute(cls, projects: list[str]) -> list[str]:
        for project in projects:
            if not project.startswith("/") or "\0" in project:
                raise ValueError(f"{project!r} is not an absolute path")
        return projects


class CommandConfig(BaseModel):
    """A command the administrator configures for Cairn to run as a project's owner:
    ``argv`` (argv[0] absolute), ``timeout_sec`` and ``environment`` (also the base of an
    evaluator, :mod:`cairn.evaluators`)."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)

    argv: list[str] = Field(min_length=1, max_length=256)
    timeout_sec: int = Field(ge=1, le=86_400)
    environment: dict[str, str] = {}

    @field_validator("argv")
    @classmethod
    def _argv(cls, argv: list[str]) -> list[str]:
        if not argv[0].startswith("/"):
            raise ValueError(f"argv[0] {argv[0]!r} must be an absolute path")
        if any("\0" in a for a in argv):
            raise ValueError("argv contains a NUL byte")
        return argv

    @field_validator("environment")
    @classmethod
    def _environment(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not _ENV_NAME.fullmatch(name) or "\0" in value:
                raise ValueError(f"invalid environment variable {name!r}")
        return env


class VerifierConfig(CommandConfig):
    """One ``verifiers.d/NAME.toml``."""

    match: VerifierMatch

    def applies_to(self, project: str, definition: str) -> bool:
        below = any(project == p.rstrip("/") or project.startswith(p.rstrip("/") + "/")
                    for p in self.match.projects)
        return below or definition in self.match.definitions


def verifiers_dir() -> Path:
    return paths.config_dir() / "verifiers.d"


def load_verifiers(problems: Problems) -> dict[str, VerifierConfig]:
    """Every ``verifiers.d/*.toml`` by name; problems recorded in ``problems``."""
    found: dict[str, VerifierConfig] = {}
    directory = verifiers_dir()
    if not directory.is_dir():
        return found
    for file in sorted(directory.glob("*.toml")):
        name = file.stem
        if not is_verifier_name(name):
            problems.add(file, "", f"verifier name {name!r} is not [a-z0-9][a-z0-9_-]*",
                         "rename the file")
            continue
        loaded = problems.load(file, VerifierConfig, fix=FIX)
        if loaded is not None:
            if not (loaded.match.projects or loaded.match.definitions):
                problems.add(file, "match", "matches nothing: give projects or definitions", FIX)
                continue
            found[name] = loaded
    return found


def matching_verifiers(project: str, definition: str, problems: Problems) -> list[VerifierSpec]:
    """The checks a launch on ``project`` of ``definition`` freezes, in file-name order."""
    return [
        VerifierSpec(
            name=name,
            argv=config.argv,
            timeout_sec=config.timeout_sec,
            environment=config.environment,
            config_sha256=problems.read_sha256[verifiers_dir() / f"{name}.toml"],
        )
        for name, config in load_verifiers(problems).items()
        if config.applies_to(project, definition)
    ]
