"""The real agent CLIs the system tier runs as command profiles, at pinned versions.

Each is installed once from its registry into
``${CAIRN_TEST_CACHE:-/var/cache/cairn-tests}/agent-clis/NAME-VERSION/`` (the download is
the only network use, at build time; a run never touches the network) and copied into a
test machine at ``/usr/local/bin/NAME``, where the shipped example profile expects it.

codex
    ``npm install @openai/codex@VERSION`` brings the native binary for this architecture
    (``@openai/codex-linux-x64``: a static musl executable); only that binary is kept, so
    the machine needs no Node.js.
"""

from __future__ import annotations

import platform
import shutil
import tempfile
from pathlib import Path

from machine import Machine, MachineError, _locked, cache_dir

from cairn.proc import run

CODEX_VERSION = "0.171.0"
_MUSL_TARGETS = {"x86_64": "x86_64-unknown-linux-musl", "aarch64": "aarch64-unknown-linux-musl"}


def ensure_codex() -> Path:
    """The cached codex binary of :data:`CODEX_VERSION`, installed from npm once."""
    home = cache_dir() / "agent-clis" / f"codex-{CODEX_VERSION}"
    binary = home / "codex"
    if binary.is_file():
        return binary
    target = _MUSL_TARGETS.get(platform.machine())
    if target is None:
        raise MachineError(f"no codex build for {platform.machine()} in the npm package")
    with _locked(home.parent / f".codex-{CODEX_VERSION}.lock"):
        if binary.is_file():
            return binary
        staging = Path(tempfile.mkdtemp(prefix=".codex.", dir=home.parent))
        try:
            run(["npm", "install", "--no-audit", "--no-fund", "--prefix", staging,
                 f"@openai/codex@{CODEX_VERSION}"], timeout=900)
            vendor = staging / "node_modules/@openai/codex-linux-x64/vendor" / target / "bin"
            if platform.machine() == "aarch64":
                vendor = staging / "node_modules/@openai/codex-linux-arm64/vendor" / target / "bin"
            version = run([vendor / "codex", "--version"]).stdout.decode().strip()
            if not version.endswith(CODEX_VERSION):
                raise MachineError(f"npm installed {version}, not codex {CODEX_VERSION}")
            home.mkdir(parents=True, exist_ok=True)
            shutil.copy2(vendor / "codex", home / "codex.partial")
            (home / "codex.partial").rename(binary)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return binary


def install_codex(machine: Machine) -> str:
    """Copy codex into the running ``machine`` at /usr/local/bin/codex; its version."""
    binary = ensure_codex()
    target = machine.merged / "usr/local/bin/codex"
    shutil.copy2(binary, target)
    return machine.exec(["/usr/local/bin/codex", "--version"]).stdout.decode().strip()
