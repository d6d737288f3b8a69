"""The real agent CLIs the system tier runs as command profiles, at pinned versions.

Each is installed once from its registry into
``${CAIRN_TEST_CACHE:-/var/cache/cairn-tests}/agent-clis/NAME-VERSION/`` (the download is
the only network use, at build time; a run never touches the network) and copied into a
test machine at ``/usr/local/bin/NAME``, where the shipped example profile expects it.

codex, opencode, claude
    ``npm install`` of the CLI's package brings its native binary for this architecture
    (``@openai/codex-linux-x64``: a static musl executable; ``opencode-linux-x64`` and
    ``@anthropic-ai/claude-code-linux-x64``: one file with its runtime, linked only
    against glibc); only that binary is kept, so the machine needs no Node.js.

aider
    aider-chat declares Python < 3.13 and Debian 13 ships 3.13, which runs it once its
    pins allow a 3.13 build (``data/aider-requirements.txt`` says which and why). pip
    installs those wheels for CPython 3.13 into ``lib/`` (``--target``, no build, no
    dependency resolution: the pins are the whole set); the machine gets that directory
    at ``/opt/aider/lib`` and a launcher at ``/usr/local/bin/aider`` run by its own
    ``/usr/bin/python3``.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from machine import Machine, MachineError, _locked, cache_dir

from cairn.proc import run

CODEX_VERSION = "0.171.0"
OPENCODE_VERSION = "1.18.33"
CLAUDE_VERSION = "2.1.328"
AIDER_VERSION = "0.86.2"
AIDER_REQUIREMENTS = Path(__file__).parent / "data" / "aider-requirements.txt"
AIDER_LAUNCHER = """#!/usr/bin/python3 -I
import sys
sys.path.insert(0, "/opt/aider/lib")
from aider.main import main
sys.exit(main())
"""
_ARCH = {"x86_64": "x64", "aarch64": "arm64"}
# What npm and pip need of this host's environment to reach their registries: their
# config and cache (HOME), a proxy and the certificate authorities a proxy may sign with.
REGISTRY_ENV = ("HOME", "NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE", "SSL_CERT_DIR",
                "REQUESTS_CA_BUNDLE", "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "https_proxy",
                "http_proxy", "no_proxy")
_MUSL = {"x86_64": "x86_64-unknown-linux-musl", "aarch64": "aarch64-unknown-linux-musl"}


def _cached(home: Path, name: str, build: Callable[[Path], Path]) -> Path:
    """``home/name`` in the cache, made once under a lock: ``build(staging)`` makes it in
    a fresh staging directory and returns it, and it is renamed into place whole."""
    target = home / name
    if target.exists():
        return target
    with _locked(home.parent / f".{home.name}.lock"):
        if target.exists():
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{home.name}.", dir=home.parent))
        try:
            made = build(staging)
            home.mkdir(parents=True, exist_ok=True)
            made.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _binary_in(package: str, version: str, inside: str) -> Path:
    """The cached executable ``inside`` the npm install of ``package@version``, its
    ``--version`` checked; installed once, under a lock."""

    def build(staging: Path) -> Path:
        run(["npm", "install", "--no-audit", "--no-fund", "--ignore-scripts", "--prefix",
             staging, f"{package}@{version}"], env=_registry_env("npm_config_"), timeout=900)
        found = staging / "node_modules" / inside
        said = run([found, "--version"]).stdout.decode().strip()
        if version not in said.split():  # "codex-cli 0.171.0", "2.1.328 (Claude Code)"
            raise MachineError(f"npm installed {said!r}, not {package} {version}")
        return found

    home = cache_dir() / "agent-clis" / f"{package.rsplit('/', 1)[-1]}-{version}"
    return _cached(home, Path(inside).name, build)


def _registry_env(prefix: str) -> dict[str, str]:
    """This host's variables a registry client needs, and its own (``npm_config_*``,
    ``PIP_*``)."""
    return {k: v for k, v in os.environ.items()
            if k in REGISTRY_ENV or k.lower().startswith(prefix.lower())}


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


def ensure_claude() -> Path:
    """The cached Claude Code binary of :data:`CLAUDE_VERSION`."""
    return _binary_in("@anthropic-ai/claude-code", CLAUDE_VERSION,
                      f"@anthropic-ai/claude-code-linux-{_ARCH[_arch()]}/claude")


def ensure_aider() -> Path:
    """The cached ``lib/`` of :data:`AIDER_VERSION` for CPython 3.13 on this
    architecture, installed once from PyPI under a lock."""

    def build(staging: Path) -> Path:
        platforms = [f"--platform={tag}_{_arch()}" for tag in (
            "manylinux_2_28", "manylinux_2_17", "manylinux2014", "manylinux_2_5", "manylinux1")]
        run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
             "--only-binary=:all:", "--ignore-requires-python", "--python-version=3.13",
             "--implementation=cp", "--abi=cp313", "--abi=abi3", "--abi=none",
             *platforms, "--target", staging / "lib", "-r", AIDER_REQUIREMENTS],
            env=_registry_env("PIP_"), timeout=900)
        return staging / "lib"

    return _cached(cache_dir() / "agent-clis" / f"aider-{AIDER_VERSION}", "lib", build)


def install_aider(machine: Machine) -> str:
    """aider's cached ``lib/`` at /opt/aider/lib in ``machine`` and its launcher at
    /usr/local/bin/aider; its version."""
    lib = ensure_aider()
    shutil.copytree(lib, machine.merged / "opt/aider/lib", symlinks=True)
    launcher = machine.merged / "usr/local/bin/aider"
    launcher.write_text(AIDER_LAUNCHER)
    launcher.chmod(0o755)
    return machine.exec(["/usr/local/bin/aider", "--version"], timeout=120
                        ).stdout.decode().strip()


def install(machine: Machine, binary: Path) -> str:
    """Copy ``binary`` into the running ``machine`` at /usr/local/bin; its version."""
    target = machine.merged / "usr/local/bin" / binary.name
    shutil.copy2(binary, target)
    return machine.exec([f"/usr/local/bin/{binary.name}", "--version"]).stdout.decode().strip()
