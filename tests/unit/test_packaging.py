"""The packages require what the code needs, the same way in all three places:
``pyproject.toml``, ``packaging/debian/control`` and ``packaging/rpm/cairn.spec``.

Python requirements are compared bound by bound (``>=`` and ``<`` in pyproject and the
spec, ``>=`` and ``<<`` in Debian); the distribution-only ones (the system bus, Btrfs,
systemd) through the table of Fedora names below, which docs/packaging.md explains.
Every module the project imports is the standard library, Cairn itself or a declared
requirement, and the tested versions (the development venv's) satisfy the bounds.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
CONTROL = REPO / "packaging" / "debian" / "control"
SPEC = REPO / "packaging" / "rpm" / "cairn.spec"

# Requirements of the distribution, not of PyPI: Debian's name -> Fedora 42's name.
# python3-btrfsutil is built from btrfs-progs' source in both distributions (PyPI's sdist
# does not build against every libbtrfsutil, see pyproject.toml).
DISTRIBUTION_ONLY = {
    "python3-btrfsutil": "python3-btrfsutil",
    "btrfs-progs": "btrfs-progs",
    "systemd": "systemd",
    "default-dbus-system-bus | dbus-system-bus": "dbus",
}
# Modules imported under another name than the requirement that brings them
# (typing_extensions: pydantic requires it, and reads a TypedDict field only from it on
# Python 3.11).
IMPORT_NAMES = {"btrfsutil": "python3-btrfsutil", "pydantic_core": "python3-pydantic",
                "typing_extensions": "python3-pydantic"}
FIRST_PARTY = {"cairn"}
SOURCES = ["cairn", "broker", "coordinator", "daemon", "worker", "packaging", "sealed-release"]

Bounds = set[tuple[str, str]]


def pyproject_requirements() -> dict[str, Bounds]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    found: dict[str, Bounds] = {}
    for line in project["dependencies"]:
        requirement = Requirement(line)
        found[f"python3-{requirement.name.lower()}"] = {
            (spec.operator, spec.version) for spec in requirement.specifier
        }
    return found


def control_depends() -> dict[str, Bounds]:
    """The binary package's Depends, substitution variables left out; ``<<`` read as ``<``."""
    text = CONTROL.read_text()
    field = re.search(r"^Depends:\n((?: .+\n)+)", text, re.MULTILINE)
    assert field is not None, "debian/control has no Depends of the binary package"
    found: dict[str, Bounds] = {}
    for clause in (c.strip() for c in field.group(1).split(",")):
        if not clause or clause.startswith("${"):
            continue
        match = re.fullmatch(r"([^\s(]+) \((>=|<<) ([^)]+)\)", clause)
        name = match.group(1) if match else clause
        bounds = found.setdefault(name, set())
        if match:
            bounds.add((match.group(2).replace("<<", "<"), match.group(3)))
    return found


def spec_requires() -> dict[str, Bounds]:
    """The main package's Requires (the subpackages' follow ``%package``)."""
    found: dict[str, Bounds] = {}
    for line in SPEC.read_text().split("\n%package ", 1)[0].splitlines():
        match = re.fullmatch(r"Requires:\s+(\S+)(?:\s+(>=|<)\s+(\S+))?", line.strip())
        if match is None:
            continue
        bounds = found.setdefault(match.group(1), set())
        if match.group(2):
            bounds.add((match.group(2), match.group(3)))
    return found


def test_python_requirements_are_the_same_in_all_three_files() -> None:
    wanted = pyproject_requirements()
    control = {k: v for k, v in control_depends().items() if k not in DISTRIBUTION_ONLY}
    spec = {k: v for k, v in spec_requires().items() if k not in DISTRIBUTION_ONLY.values()}
    assert control == wanted
    assert spec == wanted


def test_distribution_requirements_match_by_the_fedora_table() -> None:
    control = set(control_depends()) - set(pyproject_requirements())
    spec = set(spec_requires()) - set(pyproject_requirements())
    assert control == set(DISTRIBUTION_ONLY)
    assert spec == set(DISTRIBUTION_ONLY.values())


def test_requirements_are_bounded_as_the_code_needs() -> None:
    wanted = pyproject_requirements()
    # The oldest pydantic and click the tests run (the development venv; Debian 13 has
    # pydantic 2.10.6 and click 8.1.8) are the lower bounds.
    assert ("<", "3") in wanted["python3-pydantic"] and (">=", "2.10") in wanted["python3-pydantic"]
    # The CLI is click's alone; a lower bound only (the tests run the newest click too).
    assert wanted["python3-click"] == {(">=", "8.1")}
    assert "python3-typer" not in wanted and "python3-rich" not in wanted


def test_the_tested_versions_are_inside_the_bounds() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for line in project["dependencies"]:
        requirement = Requirement(line)
        installed = metadata.version(requirement.name)
        assert requirement.specifier.contains(installed, prereleases=True), (
            f"{requirement.name} {installed} is outside {requirement.specifier}"
        )


def _imported_top_levels(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_every_import_is_stdlib_first_party_or_declared() -> None:
    required = set(pyproject_requirements()) | set(DISTRIBUTION_ONLY)
    declared = {name.removeprefix("python3-") for name in required}
    declared |= {module for module, package in IMPORT_NAMES.items() if package in required}
    # the tests' interpreter may be older than the package's (Debian 13's): its newer
    # standard modules, each imported with a fallback
    newer_stdlib = {"_sha2"}
    allowed = set(sys.stdlib_module_names) | newer_stdlib | FIRST_PARTY | declared
    undeclared = {}
    for folder in SOURCES:
        for path in sorted((REPO / folder).rglob("*.py")):
            extra = _imported_top_levels(path) - allowed
            if extra:
                undeclared[str(path.relative_to(REPO))] = sorted(extra)
    assert undeclared == {}, f"imports of undeclared packages: {undeclared}"


def _preset_enables(name: str) -> set[str]:
    lines = (REPO / "packaging" / "presets" / name).read_text().splitlines()
    words = [line.split() for line in lines if line.strip() and not line.startswith("#")]
    assert all(w[0] == "enable" and len(w) == 2 for w in words), words
    return {w[1] for w in words}


def _debian_enabled_units() -> set[str]:
    """Units the .deb's dh_installsystemd calls enable (those without --no-enable)."""
    rules = (REPO / "packaging" / "debian" / "rules").read_text()
    enabled = set()
    for line in rules.splitlines():
        words = line.split()
        if words[:1] == ["dh_installsystemd"] and "--no-enable" not in words:
            enabled |= {w for w in words[1:] if not w.startswith("-")}
    return enabled


def _post_order(unit: str) -> int:
    order = ["cairn.socket", "cairn-broker.socket", "cairn.service", "cairn-broker.service",
             "cairn-retention.timer"]
    return order.index(unit)


def test_the_presets_to_copy_and_the_admins_commands_enable_what_the_deb_enables() -> None:
    system = _preset_enables("80-cairn.preset")
    assert {"cairn.socket", "cairn-broker.socket"} <= system
    assert system == _debian_enabled_units()
    for unit in system:
        assert "\n[Install]\n" in (REPO / "units" / unit).read_text(), unit
    user = _preset_enables("80-cairn-user.preset")
    # The .deb's postinst enables the same user units (dh_installsystemduser), and no
    # link the package ships would keep them on after a `systemctl --global disable`.
    rules = (REPO / "packaging" / "debian" / "rules").read_text()
    enabled = re.search(r"^\tdh_installsystemduser -pcairn (.+)$", rules, re.M)
    assert enabled is not None
    assert user == set(enabled.group(1).split()) == {
        "cairn-schedule-reconcile.service", "cairn-notify.path"}
    assert "default.target.wants" not in rules
    for unit in user:
        assert "WantedBy=default.target" in (REPO / "units" / "user" / unit).read_text(), unit
    spec = SPEC.read_text()
    assert f"%systemd_post {' '.join(sorted(system, key=_post_order))}" in spec
    assert "%systemd_user_post cairn-schedule-reconcile.service cairn-notify.path" in spec
    assert "_presetdir" not in spec and "_userpresetdir" not in spec
    # what docs/packaging.md tells the administrator of an RPM host to enable
    doc = (REPO / "docs" / "packaging.md").read_text()
    enable = re.search(r"^sudo systemctl enable --now (.+)$", doc, re.M)
    global_enable = re.search(r"^sudo systemctl --global enable (.+)$", doc, re.M)
    assert enable is not None and global_enable is not None
    assert set(enable.group(1).split()) == system
    assert set(global_enable.group(1).split()) == user


def test_the_licence_is_the_one_debian_copyright_states() -> None:
    copyright_file = (REPO / "packaging" / "debian" / "copyright").read_text()
    assert "\nLicense: MIT\n" in copyright_file
    stated = copyright_file.split("\nLicense: MIT\n", 1)[1]
    paragraph = [line[1:] for line in stated.splitlines() if line.startswith(" ")]
    text = (REPO / "LICENSE").read_text()
    assert text.startswith("MIT License\n\nCopyright (c) 2025 Cairn Developers\n\n")
    assert text.split("\n\n", 2)[2] == "\n".join(
        "" if line == "." else line for line in paragraph) + "\n"
    assert 'license = { text = "MIT" }' in (REPO / "pyproject.toml").read_text()
    assert "%license LICENSE" in SPEC.read_text()


def test_spec_installs_every_unit_and_libexec_program() -> None:
    spec = SPEC.read_text()
    files = spec.split("%files", 1)[1]
    for unit in sorted((REPO / "units").glob("*.s*")):
        assert f"%{{_unitdir}}/{unit.name}" in files, unit.name
    for unit in sorted((REPO / "units" / "user").glob("*.service")):
        assert f"%{{_userunitdir}}/{unit.name}" in files, unit.name
    for program in sorted((REPO / "packaging" / "libexec").iterdir()):
        assert f"%{{_libexecdir}}/cairn/{program.name}" in files, program.name
        assert program.stat().st_mode & 0o111, f"{program.name} is not executable"
        text = program.read_text()
        assert text.startswith("#!/usr/bin/python3 -I\n"), program.name
        module = re.search(r"^from (\S+) import main$", text, re.MULTILINE)
        assert module is not None, program.name
        assert callable(importlib.import_module(module.group(1)).main), program.name


def test_units_start_the_installed_programs() -> None:
    programs = {f"/usr/libexec/cairn/{p.name}" for p in (REPO / "packaging" / "libexec").iterdir()}
    for unit in sorted((REPO / "units").rglob("*.service")):
        starts = re.findall(r"^ExecStart=(\S+)", unit.read_text(), re.MULTILINE)
        assert starts, unit.name
        for program in starts:
            assert program in programs | {"/usr/bin/cairn"}, f"{unit.name}: {program}"


def test_the_package_tree_copy_leaves_out_everything_git_ignores() -> None:
    """copy-tree.sh makes the tree both packages (and the source packages) are built from:
    a development venv or a build's leftovers must never reach them."""
    script = (REPO / "packaging" / "copy-tree.sh").read_text()
    excluded = {e.strip("'").removeprefix("./") for e in re.findall(r"--exclude=(\S+)", script)}
    for line in (REPO / ".gitignore").read_text().splitlines():
        name = line.strip().strip("/")
        if name and not name.startswith("#"):
            assert name in excluded, f"{name} (in .gitignore) is copied into the package tree"


def _binary_stanza(name: str) -> str:
    stanzas = CONTROL.read_text().split("\n\n")
    found = [s for s in stanzas if re.search(rf"^Package: {re.escape(name)}$", s, re.M)]
    assert len(found) == 1, name
    return found[0]


def test_the_console_package_ships_every_file_of_the_page_in_both_formats() -> None:
    """cairn-cockpit (issue 34) installs exactly the files of cockpit/ under
    /usr/share/cockpit/cairn, from the .deb and the .rpm, and needs the same Cockpit."""
    page = sorted(p.name for p in (REPO / "cockpit").iterdir())
    install = (REPO / "packaging" / "debian" / "cairn-cockpit.install").read_text()
    assert sorted(re.findall(r"^cockpit/(\S+) usr/share/cockpit/cairn/$", install, re.M)) == page
    assert len(install.splitlines()) == len(page)
    spec = SPEC.read_text()
    files = spec.split("%files cockpit\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert sorted(f.removeprefix("%{_datadir}/cockpit/cairn/") for f in files
                  if not f.startswith("%dir")) == page
    installed = re.search(r"cockpit/cairn (cockpit/[^\n]+)\n", spec.replace("\\\n", ""))
    assert installed is not None
    assert sorted(w.removeprefix("cockpit/") for w in installed.group(1).split()) == page
    deb = re.findall(r"^ (\S+) \(>= (\S+)\),$", _binary_stanza("cairn-cockpit"), re.M)
    rpm = re.findall(r"^Requires: +(cockpit-\S+) >= (\S+)$", spec, re.M)
    assert sorted(deb) == sorted(rpm) and {n for n, _ in deb} == {
        "cockpit-ws", "cockpit-bridge", "cockpit-system"}
    manifest = json.loads((REPO / "cockpit" / "manifest.json").read_text())
    assert {v for _, v in deb} == {manifest["requires"]["cockpit"]}
