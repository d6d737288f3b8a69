"""The coordinator is explicit collaborators composed in one place, not a lattice of mixins
(docs/architecture.md, "Coordinator collaborators")."""

from __future__ import annotations

import ast
from pathlib import Path

COORDINATOR = Path(__file__).resolve().parents[2] / "coordinator"
# Base classes from outside the coordinator that a class of it may have: errors, wire and
# record models, and the standard library's servers.
OUTSIDE_BASES = {
    "CairnError", "Exception", "BaseModel", "TypedDict", "Protocol",
    "socketserver.ThreadingMixIn", "socketserver.UnixStreamServer",
    "BaseHTTPRequestHandler", "http.client.HTTPConnection",
}
# The one variant of a collaborator: the upgrade check is a replay that carries nothing out.
VARIANTS = {("UpgradeCheck", "Replay")}


def classes() -> dict[str, tuple[str, list[str]]]:
    """Every class of coordinator/: its module and its bases as written."""
    found: dict[str, tuple[str, list[str]]] = {}
    for path in sorted(COORDINATOR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                found[node.name] = (path.name, [ast.unparse(b) for b in node.bases])
    return found


def errors(found: dict[str, tuple[str, list[str]]]) -> set[str]:
    """The coordinator's exception classes (a base chain that ends in an exception)."""
    known = {"CairnError", "Exception"}
    grew = True
    while grew:
        grew = False
        for name, (_module, bases) in found.items():
            if name not in known and any(b in known for b in bases):
                known.add(name)
                grew = True
    return known


def test_no_class_of_the_coordinator_mixes_another_in() -> None:
    found = classes()
    assert {"Coordinator", "Replay", "AgentOperations", "Lanes", "RunContext"} <= set(found)
    exceptions = errors(found)
    wrong = []
    for name, (module, bases) in found.items():
        if name in exceptions:
            continue
        if len(bases) > 1 and module != "relay.py":
            wrong.append(f"{module}: {name}{tuple(bases)} has {len(bases)} bases")
        for base in bases:
            if base in found and (name, base) not in VARIANTS:
                wrong.append(f"{module}: {name} inherits the coordinator's {base}")
            elif base not in found and base not in OUTSIDE_BASES:
                wrong.append(f"{module}: {name} has an unexpected base {base}")
    assert wrong == []


def test_the_coordinator_is_composed_in_one_place() -> None:
    """Each collaborator is built in ``Coordinator.__init__`` only (the upgrade check builds
    its own replay, and the context its broker client)."""
    collaborators = {"Lease", "WGenerations", "Lanes", "Recovery", "AgentOperations",
                     "Experiments", "Restores", "Settlement", "Handlers", "Replay"}
    built: dict[str, set[str]] = {}
    for path in sorted(COORDINATOR.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in collaborators:
                built.setdefault(node.func.id, set()).add(path.name)
    assert built.pop("Lanes") == {"core.py", "upgradecheck.py"}
    assert built.pop("WGenerations") == {"core.py", "upgradecheck.py"}
    assert built == {name: {"core.py"} for name in collaborators - {"Lanes", "WGenerations"}}
