"""What ``./dev test`` measures the branch coverage of is what root runs: ``broker/`` and
the library files docs/architecture.md says it loads (which test_import_rules.py keeps
equal to its import closure), and the gate holds."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from test_import_rules import _documented_closure

REPO = Path(__file__).resolve().parents[2]
COVERAGE = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["coverage"]


def test_the_measured_files_are_the_broker_and_its_documented_closure() -> None:
    include = set(COVERAGE["run"]["include"])
    assert "broker/*.py" in include
    assert include - {"broker/*.py"} == _documented_closure()


def test_branches_are_measured_and_gated() -> None:
    assert COVERAGE["run"]["branch"] is True
    assert COVERAGE["report"]["fail_under"] > 0


def test_the_installed_broker_maps_back_to_the_tree() -> None:
    """Data from a test machine names /usr/lib/python3/dist-packages/cairn/...; broker/
    is cairn/broker/ there, so its alias comes first."""
    aliases = list(COVERAGE["paths"].values())
    assert aliases[0] == ["broker/", "/usr/lib/python3/dist-packages/cairn/broker/"]
    assert aliases[1] == ["cairn/", "/usr/lib/python3/dist-packages/cairn/"]


def test_dev_test_runs_every_tier_under_coverage_and_reports_it() -> None:
    dev = (REPO / "dev").read_text()
    assert re.search(r"\ntier\(\) \{\n(\s+#.*\n)*\s+\.venv/bin/python -m coverage run -m pytest "
                     r"(-\S+ )*\"\$@\"\n\}", dev)
    test = dev[dev.index("\n    test)\n"):dev.index("\n        ;;\n", dev.index("\n    test)\n"))]
    assert 'export CAIRN_BROKER_COVERAGE="$PWD/.coverage-broker"' in test
    tiers = re.findall(r"^\s+tier ((?:tests/\w+ ?)+)", test, re.MULTILINE)
    assert sorted(set(" ".join(tiers).split())) == [
        "tests/btrfs", "tests/system", "tests/unit", "tests/vm"]
    # the system tier in two halves that together are all of it: the clock-bound tests
    # beside the rest
    assert "tier tests/system -m clock " in test and 'tier tests/system -m "not clock" ' in test
    assert ".venv/bin/python -m coverage combine" in dev
    assert ".venv/bin/python -m coverage report" in dev
