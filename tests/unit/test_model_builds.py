"""Cairn's own models defer their build to their first use, and a threaded process can
build every loaded one before its threads start (:func:`build_loaded_models`)."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, cast

from pydantic import BaseModel, ConfigDict

from cairn.workflow import Model

# The library and the process folders, as the package installs them.
PACKAGES = ("cairn", "cairn.daemon", "cairn.broker", "cairn.coordinator", "cairn.worker")


def every_cairn_model() -> list[type[BaseModel]]:
    for package in PACKAGES:
        path = importlib.import_module(package).__path__
        for info in pkgutil.walk_packages(path, f"{package}."):
            if not info.name.endswith("__main__"):
                importlib.import_module(info.name)
    seen: list[type[BaseModel]] = []
    todo = [BaseModel]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("cairn.") and sub not in seen:
                seen.append(sub)
    return seen


def test_every_model_of_cairn_defers_its_build_except_workflow_models() -> None:
    # those a module defines (not the workflow models the review builds from a source)
    models = [m for m in every_cairn_model()
              if getattr(sys.modules[m.__module__], m.__name__, None) is m]
    assert len(models) > 100
    eager = [
        f"{m.__module__}.{m.__qualname__}"
        for m in models
        if not m.model_config.get("defer_build") and not issubclass(m, Model)
    ]
    assert eager == [], "add defer_build=True to their model_config"
    assert not Model.model_config.get("defer_build")


def test_build_loaded_models_builds_every_deferred_model_once() -> None:
    code = (
        "from cairn.protocol import broker, base\n"
        "pending = [m for m in base._subclasses(base.BaseModel)"
        " if m.__module__.startswith('cairn') and not m.__pydantic_complete__]\n"
        "print(len(pending), base.build_loaded_models(), base.build_loaded_models())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    pending, built, again = (int(n) for n in out)
    assert pending > 10  # importing the broker's protocol built none of them
    assert built == pending
    assert again == 0


def test_first_use_from_many_threads_at_once_validates_as_declared() -> None:
    class Base(BaseModel):
        model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)
        if TYPE_CHECKING:  # the fields each model below declares
            a: int
            b: list[str]

    models = [
        cast("type[Base]", type(f"M{i}", (Base,), {"__annotations__": {"a": int, "b": list[str]},
                                                  "__module__": __name__}))
        for i in range(20)
    ]
    problems: list[str] = []
    barrier = threading.Barrier(8)

    def use() -> None:
        barrier.wait()
        for model in models:
            try:
                assert model.model_validate({"a": 1, "b": ["x"]}).b == ["x"]
                model.model_validate({"a": 1, "b": [], "extra": 1})
                problems.append(f"{model.__name__} took an undeclared key")
            except ValueError as exc:
                if "extra" not in str(exc).lower():
                    problems.append(f"{model.__name__}: {exc}")

    threads = [threading.Thread(target=use) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert problems == []
