"""One definition of a plain relative path (cairn/pathrules.py), and every reader of a
path agreeing with it: checked over every string of up to six characters drawn from the
characters that make a path ambiguous."""

from __future__ import annotations

import itertools
import os

import pytest
from pydantic import TypeAdapter, ValidationError

from cairn import untrusted
from cairn.errors import UsageError
from cairn.pathrules import check_relative, is_plain_relative, plain_parts, printable_name
from cairn.protocol.launch import ScriptStep
from cairn.protocol.settlement import ProjectPath

ALPHABET = ("a", "b", "/", ".", "\0")
STRINGS = ["".join(chars) for n in range(7) for chars in itertools.product(ALPHABET, repeat=n)]
PROJECT_PATH: TypeAdapter[str] = TypeAdapter(ProjectPath)


def _ambiguous(path: str) -> bool:
    """What no call site should ever have accepted: a path with more than one spelling
    (an empty or '.' component) or none inside the tree ('..', absolute, empty, NUL)."""
    parts = path.split("/")
    return (not path or path.startswith("/") or "\0" in path
            or any(p in ("", ".", "..") for p in parts))


@pytest.mark.parametrize(("path", "parts"), [
    ("a", ["a"]), ("a/b", ["a", "b"]), (".a/..b/...", [".a", "..b", "..."]),
    ("", None), ("/a", None), ("a/", None), ("a//b", None), ("./a", None), ("a/.", None),
    ("a/../b", None), ("..", None), ("a\0b", None),
])
def test_plain_parts(path: str, parts: list[str] | None) -> None:
    assert plain_parts(path) == parts
    assert is_plain_relative(path) is (parts is not None)


def test_the_definition_refuses_exactly_the_ambiguous_paths() -> None:
    assert len(STRINGS) > 19_000
    assert [s for s in STRINGS if is_plain_relative(s) == _ambiguous(s)] == []


def _accepts(check: object, path: str, errors: tuple[type[Exception], ...]) -> bool:
    try:
        check(path)  # type: ignore[operator]
    except errors:
        return False
    return True


def test_every_reader_of_a_path_agrees_with_the_definition() -> None:
    readers = {
        "untrusted": (untrusted._parts, (untrusted.UntrustedFileError,)),
        "settle_paths": (check_relative, (UsageError,)),
        "protocol": (PROJECT_PATH.validate_python, (ValidationError,)),
    }
    disagree = {name: [s for s in STRINGS if _accepts(check, s, errors) != is_plain_relative(s)]
                for name, (check, errors) in readers.items()}
    assert disagree == {name: [] for name in readers}


def test_a_scripted_step_takes_no_path_or_a_plain_one() -> None:
    def step(path: str) -> ScriptStep:
        return ScriptStep(action="write", path=path)

    accepted = [s for s in STRINGS if _accepts(step, s, (ValidationError,))]
    assert accepted == [s for s in STRINGS if s == "" or is_plain_relative(s)]
    # it used to take a//b, ./a and a/ (the one set that shrank, and only there)
    for spelled_twice in ("a//b", "./a", "a/", "a/."):
        with pytest.raises(ValidationError, match="not a plain path below /workspace"):
            step(spelled_twice)


def test_a_name_that_is_not_utf8_is_reported_as_text() -> None:
    name = os.fsdecode(b"src/bad\xff\xfe.py")
    assert printable_name(name) == "src/bad\\xff\\xfe.py"
    assert printable_name("src/ok-é.py") == "src/ok-é.py"  # valid UTF-8 stays as it is
    printable_name(name).encode("utf-8")  # no surrogate left
