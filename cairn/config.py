"""Reading the host's configuration files (``/etc/cairn``): every problem with its file,
its line (a TOML syntax error) or its field (a schema error), and what to do, all at once.

A loader records problems in a :class:`Problems` instead of stopping at the first one, so
files loaded together (a launch reads ``providers.toml``, ``policy.toml`` and the
profiles its agents name) are reported together, as one :class:`ConfigError`::

    2 errors in 2 config files:
      /etc/cairn/profiles.d/claude.toml: line 3, column 9: not valid TOML: Illegal character '\\n'
      /etc/cairn/profiles.d/codex.toml: max_steps: Input should be a valid integer (got 'many')

No other module parses a configuration file itself (a unit test checks that no other
module calls :mod:`tomllib`), so no TOML or schema error can reach a caller without its
file name, or reach cairnd's socket as an internal error.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from cairn.errors import CairnError

M = TypeVar("M", bound=BaseModel)

SYNTAX_FIX = "fix the TOML syntax at that line (strings need double quotes; see toml.io)"
_POSITION = re.compile(r"^(?P<what>.*?)\s*\(at line (?P<line>\d+), column (?P<column>\d+)\)$")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


@dataclass(frozen=True)
class Problem:
    """One thing wrong in one file: ``where`` is ``line L, column C``, a dotted field path
    (``providers.openai.model``), or empty when it is about the whole file."""

    file: Path
    where: str
    message: str
    fix: str = ""

    def __str__(self) -> str:
        where = f" {self.where}:" if self.where else ""
        return f"{self.file}:{where} {self.message}"


class ConfigError(CairnError):
    """One or more configuration files are unreadable, not TOML, or do not match their
    schema. The message's first line is the summary; each problem is one line after it."""

    code = "config"

    def __init__(self, problems: Sequence[Problem], *, hint: str | None = None) -> None:
        self.problems = tuple(problems)
        super().__init__(summary(self.problems), hint=hint or _fixes(self.problems))


def summary(problems: Sequence[Problem]) -> str:
    """One line for one problem; otherwise a count, then one indented line per problem."""
    if len(problems) == 1:
        return str(problems[0])
    files = len({p.file for p in problems})
    head = f"{len(problems)} errors in {files} config file{'s' if files != 1 else ''}:"
    return "\n".join([head, *(f"  {p}" for p in problems)])


def _fixes(problems: Sequence[Problem]) -> str | None:
    fixes = list(dict.fromkeys(p.fix for p in problems if p.fix))
    return "; ".join(fixes) or None


def field_path(loc: Sequence[int | str], *, top: str = "") -> str:
    """A pydantic location as a TOML key path: ``capabilities."network:host"``."""
    parts = [
        str(part) if isinstance(part, int) or _BARE_KEY.match(part) else f'"{part}"'
        for part in loc
    ]
    return ".".join(parts) or top


def _describe(error: ErrorDetails) -> str:
    kind, message, value = error["type"], error["msg"], error.get("input")
    if kind == "extra_forbidden":
        return "unknown field: remove it or correct its name"
    if kind == "missing":
        return "required field is missing"
    if kind == "value_error":
        return str(message).removeprefix("Value error, ")
    if isinstance(value, str | int | float | bool):
        shown = repr(value)
        return f"{message} (got {shown[:60] + '…' if len(shown) > 60 else shown})"
    return str(message)


class Problems:
    """Problems found so far in files loaded together; :meth:`check` raises them all."""

    def __init__(self) -> None:
        self.items: list[Problem] = []
        # "sha256:<hex>" of the bytes of every file read, as read: what a launch freezes
        # so root can re-read the same file (broker/hostfiles.py).
        self.read_sha256: dict[Path, str] = {}

    def __len__(self) -> int:
        return len(self.items)

    def add(self, file: Path, where: str, message: str, fix: str = "") -> None:
        self.items.append(Problem(file, where, message, fix))

    def toml(self, file: Path) -> dict[str, object] | None:
        """The table in ``file``, or None when it is missing or has a problem (recorded)."""
        try:
            raw = file.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self.add(file, "", f"cannot be read: {exc.strerror}",
                     "make it readable by the user cairn, as which Cairn's services read it")
            return None
        self.read_sha256[file] = "sha256:" + hashlib.sha256(raw).hexdigest()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw[: exc.start].count(b"\n") + 1
            self.add(file, f"line {line}", "not UTF-8 text", "save the file as UTF-8")
            return None
        return self.toml_text(file, text)

    def toml_text(self, file: Path, text: str) -> dict[str, object] | None:
        """The table ``text`` holds, as the content ``file`` would have (a command about to
        write it checks it first), or None when it has a problem (recorded)."""
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            found = _POSITION.match(str(exc))
            if found is None:
                self.add(file, "", f"not valid TOML: {exc}", SYNTAX_FIX)
            else:
                where = f"line {found['line']}, column {found['column']}"
                self.add(file, where, f"not valid TOML: {found['what']}", SYNTAX_FIX)
            return None

    def model(
        self,
        file: Path,
        model: type[M],
        data: Mapping[str, object],
        *,
        fix: str = "",
        at: tuple[str, ...] = (),
    ) -> M | None:
        """``data`` (the table at key path ``at`` of ``file``) validated as ``model``, or
        None with every schema error recorded. Strict: TOML has types, so ``"60"`` where a
        number belongs is an error, not 60."""
        try:
            return model.model_validate(data, strict=True)
        except ValidationError as exc:
            self.invalid(file, exc, fix=fix, at=at)
            return None

    def invalid(
        self, file: Path, exc: ValidationError, *, fix: str = "", at: tuple[str, ...] = ()
    ) -> None:
        """Record every error of ``exc``, each at its field path."""
        for error in exc.errors():
            self.add(file, field_path((*at, *error["loc"])), _describe(error), fix)

    def load(self, file: Path, model: type[M], *, fix: str = "") -> M | None:
        """``file`` read and validated as ``model``; None if it is missing or has problems
        (compare ``len()`` before and after to tell them apart)."""
        data = self.toml(file)
        return None if data is None else self.model(file, model, data, fix=fix)

    def check(self, error: type[ConfigError] = ConfigError) -> None:
        """Raise every problem recorded so far as one ``error``."""
        if self.items:
            raise error(self.items)


def load_file(file: Path, model: type[M], *, fix: str = "",
              error: type[ConfigError] = ConfigError) -> M | None:
    """``file`` as ``model`` on its own (None when it is missing); all its problems raised
    together as ``error``."""
    problems = Problems()
    loaded = problems.load(file, model, fix=fix)
    problems.check(error)
    return loaded
