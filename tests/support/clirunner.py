"""click's test runner, the same on every click the CLI supports: click 8.1 (Debian 13)
mixes stderr into stdout unless told not to and then leaves it out of ``output``; 8.2 and
later keep both apart and print both in ``output``. Here, on either, ``result.stdout`` and
``result.stderr`` are each alone and ``result.output`` has both."""

from __future__ import annotations

import inspect
from typing import Any

import click.testing

_SPLITS_BY_DEFAULT = "mix_stderr" not in inspect.signature(click.testing.CliRunner).parameters


class _Result(click.testing.Result):
    @property
    def output(self) -> str:
        return self.stdout + self.stderr


class CliRunner(click.testing.CliRunner):
    def __init__(self, **kwargs: Any) -> None:
        if not _SPLITS_BY_DEFAULT:
            kwargs["mix_stderr"] = False
        super().__init__(**kwargs)

    def invoke(self, *args: Any, **kwargs: Any) -> click.testing.Result:
        kwargs.setdefault("prog_name", "cairn")
        result = super().invoke(*args, **kwargs)
        if not _SPLITS_BY_DEFAULT:
            result.__class__ = _Result
        return result
