"""The real agent CLIs the system tier runs as command profiles, at pinned versions.

Each is installed once from its registry into
``${CAIRN_TEST_CACHE:-/var/cache/cairn-tests}/agent-clis/NAME-VERSION/`` (the download is
the only network use, at build time; a run never touches the network) and copied into a
test machine at ``/usr/local/bin/NAME``, where the shipped example profile expects it.

codex, opencode
    ``npm install`` of the CLI's package brings its native binary for this architecture
    (``@openai/codex-linux-x64``: a static musl executable; ``opencode-linux-x64``: one
    file with its runtime); only that binary is kept, so the machine needs no Node.js.
"""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
from pathlib import Path

from machine import Machine, MachineError, _locked, cache_dir

from cairn.proc import run

CODEX_VERSION = "0.171.0"
OPENCODE_VERSION = "1.18.33"
_ARCH = {"x86_64": "x64", "aarch64": "arm64"}
# What npm needs of this host's environment to reach its registry: its config and cache
# (HOME), a proxy and the certificate authorities a proxy may sign with.
NPM_ENV = ("HOME", "NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE", "SSL_CERT_DIR", "HTTPS_PROXY",
           "HTTP_PROXY", "NO_PROXY", "https_proxy", "http_proxy", "no_proxy")
_MUSL = {"x86_64": "x86_64-unknown-linux-musl", "aarch64": "aarch64-unknown-linux-musl"}


def _binary_in(package: str, version: str, inside: str) -> Path:
    """The cached executable ``inside`` the npm install of ``package@version``, its
    ``--version`` checked; installed once, under a lock."""
    home = cache_dir() / "agent-clis" / f"{package.rsplit('/', 1)[-1]}-{version}"
    binary = home / Path(inside).name
    if binary.is_file():
        return binary
    with _locked(home.parent / f".{home.name}.lock"):
        if binary.is_file():
            return binary
        staging = Path(tempfile.mkdtemp(prefix=f".{home.name}.", dir=home.parent))
        try:
            env = {k: v for k, v in os.environ.items()
                   if k in NPM_ENV or k.lower().startswith("npm_config_")}
            run(["npm", "install", "--no-audit", "--no-fund", "--ignore-scripts", "--prefix",
                 staging, f"{package}@{version}"], env=env, timeout=900)
            found = staging / "node_modules" / inside
            said = run([found, "--version"]).stdout.decode().strip()
            if not said.endswith(version):
                raise MachineError(f"npm installed {said!r}, not {package} {version}")
            home.mkdir(parents=True, exist_ok=True)
            shutil.copy2(found, home / f"{binary.name}.partial")
            (home / f"{binary.name}.partial").rename(binary)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return binary


def _arch() -> str:
    if platform.machine() not in _ARCH:
        raise MachineError(f"no agent CLI builds for {platform.machine()} in the npm packages")
    return platform.machine()


def ensure_codex() -> Path:
    """The cached codex binary of :data:`CODEX_VERSION`."""
    arch = _arch()
    return _binary_in("@openai/codex", CODEX_VERSION,
                      f"@openai/codex-linux-{_ARCH[arch]}/vendor/{_MUSL[arch]}/bin/codex")


def ensure_opencode() -> Path:
    """The cached opencode binary of :data:`OPENCODE_VERSION`."""
    return _binary_in("opencode-ai", OPENCODE_VERSION,
                      f"opencode-linux-{_ARCH[_arch()]}/bin/opencode")


def install(machine: Machine, binary: Path) -> str:
    """Copy ``binary`` into the running ``machine`` at /usr/local/bin; its version."""
    target = machine.merged / "usr/local/bin" / binary.name
    shutil.copy2(binary, target)
    return machine.exec([f"/usr/local/bin/{binary.name}", "--version"]).stdout.decode().strip()
