"""Import rules over the installed layout: the import-linter contracts of ``.importlinter``,
no import cycle anywhere, and the size of what the root broker imports.

``broker/`` is ``cairn.broker`` only once installed (``package-dir`` in pyproject.toml), and
import-linter finds a package's modules by walking its directory, so both checks run over
a staged copy of that layout, the way ``tests/typecheck.sh`` stages it for mypy.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROCESSES = ("broker", "coordinator", "daemon", "worker")

# The root broker's closure: cairn.broker.__main__ and cairn.broker.verbs with everything
# they import, transitively, including imports inside functions and the packages above each
# module, excluding imports made only for type checking. Its size in lines was capped here
# (5,897 when first counted, 3,812 when issue 26 began); issue 26 measures root by what it
# trusts instead: the trust inventory (docs/architecture.md) and branch coverage of broker/
# and this closure (tests/unit/test_broker_coverage.py, the gate in pyproject.toml).
BROKER_ENTRY_MODULES = ("cairn.broker.__main__", "cairn.broker.verbs")

# Run in the staged layout: print the broker's closure as JSON (module -> file).
_STATIC_CLOSURE = """
import json, sys
import grimp

graph = grimp.build_graph("cairn", cache_dir=None, exclude_type_checking_imports=True)
seen, todo = set(), set(sys.argv[1:])
while todo:
    module = todo.pop()
    if module in seen:
        continue
    seen.add(module)
    todo |= graph.find_modules_directly_imported_by(module)
    parts = module.split(".")
    todo |= {".".join(parts[:i]) for i in range(1, len(parts))}
print(json.dumps(sorted(seen)))
"""

_RUNTIME_CLOSURE = """
import importlib, json, sys

try:
    for name in sys.argv[1:]:
        importlib.import_module(name)
except ModuleNotFoundError as exc:
    if exc.name == "cairn" or (exc.name or "").startswith("cairn."):
        raise
    print(json.dumps({"missing": exc.name}))
else:
    print(json.dumps(sorted(m for m in sys.modules if m == "cairn" or m.startswith("cairn."))))
"""


# Run in the staged layout: print every import cycle (a strongly connected set of modules,
# imports inside functions included, type-checking imports not) as a JSON list.
_CYCLES = """
import json, sys
import grimp

graph = grimp.build_graph("cairn", cache_dir=None, exclude_type_checking_imports=True)
order, low, stack, on_stack, cycles = {}, {}, [], set(), []
for root in sorted(graph.modules):
    if root in order:
        continue
    work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
    order[root] = low[root] = len(order)
    stack.append(root)
    on_stack.add(root)
    while work:
        module, children = work[-1]
        child = next(children, None)
        if child is not None:
            if child not in order:
                order[child] = low[child] = len(order)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
            elif child in on_stack:
                low[module] = min(low[module], order[child])
            continue
        work.pop()
        if work:
            low[work[-1][0]] = min(low[work[-1][0]], low[module])
        if low[module] == order[module]:
            members = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                members.append(member)
                if member == module:
                    break
            if len(members) > 1:
                cycles.append(sorted(members))
print(json.dumps(cycles))
"""


@pytest.fixture(scope="module")
def installed_layout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """cairn/ with the process folders inside it, as the package installs them."""
    stage = tmp_path_factory.mktemp("installed")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "cairn", stage / "cairn", ignore=ignore)
    for process in PROCESSES:
        shutil.copytree(REPO / process, stage / "cairn" / process, ignore=ignore)
    yield stage
    shutil.rmtree(stage, ignore_errors=True)


def _run_in(stage: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(stage), "NO_COLOR": "1"}
    return subprocess.run(
        argv, cwd=stage, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def _lint_imports() -> str:
    beside = Path(sys.executable).parent / "lint-imports"
    found = str(beside) if beside.exists() else shutil.which("lint-imports")
    assert found, "lint-imports is missing: install import-linter (DEV_PYTHON_PACKAGES in ./dev)"
    return found


def test_import_linter_contracts_hold(installed_layout: Path) -> None:
    config = REPO / ".importlinter"
    proc = _run_in(installed_layout, [_lint_imports(), "--config", str(config), "--no-cache"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout, proc.stdout


# What cairn.protocol may import besides the standard library and pydantic.
PROTOCOL_MAY_IMPORT = {"cairn.protocol", "cairn.errors", "cairn.canonical", "cairn.leanjson",
                       "cairn.operation_kinds", "cairn.pathrules"}


def test_no_import_cycles_anywhere(installed_layout: Path) -> None:
    proc = _run_in(installed_layout, [sys.executable, "-c", _CYCLES])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


def test_the_cycle_finder_finds_one(tmp_path: Path) -> None:
    package = tmp_path / "cairn"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from cairn import b\n")
    (package / "b.py").write_text("def f():\n    from cairn import c\n")
    (package / "c.py").write_text("import cairn.a\n")
    (package / "d.py").write_text("from cairn import a\n")
    proc = _run_in(tmp_path, [sys.executable, "-c", _CYCLES])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [["cairn.a", "cairn.b", "cairn.c"]]


def test_protocol_contract_forbids_every_other_module() -> None:
    """The protocol contract lists every other top-level module of the installed layout,
    so a module added later is forbidden to the protocols too, not silently allowed."""
    config = configparser.ConfigParser()
    config.read(REPO / ".importlinter")
    listed = set(config["importlinter:contract:protocol"]["forbidden_modules"].split())
    top_level = {
        f"cairn.{p.stem if p.suffix == '.py' else p.name}"
        for p in (REPO / "cairn").iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()
    } | {f"cairn.{process}" for process in PROCESSES}
    assert listed == top_level - PROTOCOL_MAY_IMPORT


# Imported by every process (cairn.paths) or every ``cairn`` start: plain code, no pydantic
# (defining one model loads pydantic's whole schema machinery, about a tenth of a second).
WITHOUT_PYDANTIC = ("cairn.paths", "cairn.protocol.names", "cairn.protocol.requestchecks")

_LOADED = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(sys.modules)))
"""


def test_paths_and_the_plain_protocol_checks_load_no_pydantic(installed_layout: Path) -> None:
    proc = _run_in(installed_layout, [sys.executable, "-c", _LOADED, *WITHOUT_PYDANTIC])
    assert proc.returncode == 0, proc.stderr
    loaded = set(json.loads(proc.stdout))
    assert set(WITHOUT_PYDANTIC) <= loaded
    assert sorted(m for m in loaded if m.split(".")[0] in ("pydantic", "pydantic_core")) == []


def _module_file(stage: Path, module: str) -> Path:
    base = stage.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


DOC_SECTION = "### What the root broker loads"


def _documented_closure() -> set[str]:
    """The files in the first column of that section's table in docs/architecture.md."""
    text = (REPO / "docs" / "architecture.md").read_text()
    assert DOC_SECTION in text, f"docs/architecture.md has no section {DOC_SECTION!r}"
    section = text.split(DOC_SECTION, 1)[1].split("\n### ", 1)[0]
    return {m.group(1) for m in re.finditer(r"^\| `([^`]+)` \|", section, re.MULTILINE)}


def test_the_broker_closure_is_the_documented_one(installed_layout: Path) -> None:
    python = sys.executable
    static = _run_in(installed_layout, [python, "-c", _STATIC_CLOSURE, *BROKER_ENTRY_MODULES])
    assert static.returncode == 0, static.stderr
    closure = set(json.loads(static.stdout))
    library = {
        m: len(_module_file(installed_layout, m).read_text().splitlines())
        for m in closure
        if m != "cairn.broker" and not m.startswith("cairn.broker.")
    }
    total = sum(library.values())
    largest = ", ".join(
        f"{m} {n}" for m, n in sorted(library.items(), key=lambda item: -item[1])[:8]
    )
    print(f"root broker's project imports: {total} lines in {len(library)} modules; "
          f"largest: {largest}")

    # docs/architecture.md lists exactly these files, each with why root runs it.
    listed = _documented_closure()
    files = {str(_module_file(installed_layout, m).relative_to(installed_layout)) for m in library}
    assert listed == files, (
        f"docs/architecture.md ({DOC_SECTION}) lists files the broker does not load: "
        f"{sorted(listed - files)}; and misses files it loads: {sorted(files - listed)}"
    )

    # The static closure must hold everything a real import loads.
    runtime = _run_in(installed_layout, [python, "-c", _RUNTIME_CLOSURE, *BROKER_ENTRY_MODULES])
    assert runtime.returncode == 0, runtime.stderr
    loaded = json.loads(runtime.stdout)
    if isinstance(loaded, dict):
        pytest.skip(f"cannot import the broker here to cross-check: {loaded['missing']} missing")
    assert set(loaded) <= closure, f"imported but not seen statically: {set(loaded) - closure}"


def test_every_package_is_installed() -> None:
    """Each package folder (an ``__init__.py``) of the library and the processes is listed
    in pyproject.toml's ``packages``: one left out installs without it, and only the
    package tests would notice."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    roots = {name: REPO / folder for name, folder in config["package-dir"].items()}
    found = set()
    for name, folder in roots.items():
        for init in folder.rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            rel = init.parent.relative_to(folder).parts
            found.add(".".join((name, *rel)))
    assert found == set(config["packages"]), sorted(found ^ set(config["packages"]))
