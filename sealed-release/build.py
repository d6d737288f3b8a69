#!/usr/bin/env python3
"""Build and sign the sealed release capsule (ARCHITECTURE §14).

    python3 sealed-release/build.py --out DIR [--key KEY.pem] [--source REPO]

Writes ``DIR/releases/<hash>/`` (the capsule), ``DIR/releases/current`` (a link to it)
and ``DIR/release-key.pub``, and prints ``<hash>``. The capsule holds:

``cairn-worker``      the entry point: ``python3 -I -B cairn-worker`` imports cairn only
                      from the capsule's ``lib/`` and runs ``cairn.worker``
``lib/cairn/...``     the ``cairn.worker`` package and every ``cairn`` module it imports
                      (found statically, transitively), with their parent packages
``lib/cairn/builtin`` the built-in workflows and profiles, as data

Without ``--key`` a new Ed25519 key is generated into ``DIR/release-key.pem`` (mode 0600):
a development build's key lives only in its build directory. A release build passes the
project's key.
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: E402
    Ed25519PrivateKey,
)
from cryptography.hazmat.primitives.serialization import (  # noqa: E402
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
)

from cairn import capsule, capsule_build  # noqa: E402

ROOT_MODULE = "cairn.worker"
DATA_PACKAGES = ("cairn.builtin",)

LAUNCHER = '''\
"""Start the agent worker from this capsule; cairn is imported from nowhere else."""
import os
import runpy
import sys

LIB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib")
sys.path.insert(0, LIB)
import cairn  # noqa: E402

if os.path.dirname(os.path.abspath(cairn.__file__)) != os.path.join(LIB, "cairn"):
    sys.exit("cairn-worker: cairn was not imported from the capsule")
runpy.run_module("cairn.worker", run_name="__main__", alter_sys=True)
'''


class SourceTree:
    """Maps module names to source files through pyproject's ``package-dir``."""

    def __init__(self, source: Path) -> None:
        with open(source / "pyproject.toml", "rb") as fh:
            pyproject = tomllib.load(fh)
        self.source = source
        self.package_dir: dict[str, str] = pyproject["tool"]["setuptools"]["package-dir"]
        self.version: str = pyproject["project"]["version"]

    def locate(self, module: str) -> tuple[Path, str] | None:
        """(source file, path inside ``lib/``) of a first-party module, or None."""
        prefixes = [p for p in self.package_dir if module == p or module.startswith(p + ".")]
        if not prefixes:
            return None
        prefix = max(prefixes, key=len)
        rest = module[len(prefix) + 1 :].replace(".", "/") if module != prefix else ""
        base = self.source / self.package_dir[prefix] / rest
        dest = module.replace(".", "/")
        if base.with_suffix(".py").is_file() and rest:
            return base.with_suffix(".py"), dest + ".py"
        if (base / "__init__.py").is_file():
            return base / "__init__.py", dest + "/__init__.py"
        return None

    def package_modules(self, package: str) -> list[str]:
        located = self.locate(package)
        if located is None or not located[1].endswith("/__init__.py"):
            raise SystemExit(f"build: {package} is not a package in {self.source}")
        folder = located[0].parent
        return [package] + [
            f"{package}.{p.stem}" for p in sorted(folder.glob("*.py")) if p.name != "__init__.py"
        ]


def imported_modules(tree: ast.Module, module: str, is_package: bool) -> set[str]:
    """Every module name an import statement in ``tree`` may load (first-party or not)."""
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def closure(tree: SourceTree, roots: list[str]) -> dict[str, Path]:
    """``lib/`` path -> source file of every first-party module reachable from ``roots``,
    including each module's parent packages."""
    files: dict[str, Path] = {}
    pending = list(roots)
    seen: set[str] = set()
    while pending:
        module = pending.pop()
        if module in seen:
            continue
        seen.add(module)
        located = tree.locate(module)
        if located is None:
            continue
        source, dest = located
        files[dest] = source
        parent = module.rpartition(".")[0]
        if parent:
            pending.append(parent)
        parsed = ast.parse(source.read_text(), filename=str(source))
        pending.extend(imported_modules(parsed, module, dest.endswith("/__init__.py")))
    return files


def data_files(tree: SourceTree, package: str) -> dict[str, Path]:
    """Every file under a data package (sources and data, no caches)."""
    located = tree.locate(package)
    if located is None:
        raise SystemExit(f"build: no package {package} in {tree.source}")
    folder = located[0].parent
    files: dict[str, Path] = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            rel = path.relative_to(folder).as_posix()
            files[f"{package.replace('.', '/')}/{rel}"] = path
    return files


def load_or_make_key(key_file: Path | None, out: Path) -> Ed25519PrivateKey:
    if key_file is not None:
        key = load_pem_private_key(key_file.read_bytes(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise SystemExit(f"build: {key_file} is not an Ed25519 private key")
        return key
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    fd = os.open(out / "release-key.pem", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    return key


def build(source: Path, out: Path, key_file: Path | None) -> str:
    """Build, sign and install the capsule under ``out``; return its hash."""
    tree = SourceTree(source)
    roots = tree.package_modules(ROOT_MODULE)
    files = {f"{capsule.LIB}/{dest}": src for dest, src in closure(tree, roots).items()}
    for package in DATA_PACKAGES:
        files.update({f"{capsule.LIB}/{d}": s for d, s in data_files(tree, package).items()})
        files.update({f"{capsule.LIB}/{d}": s for d, s in closure(tree, [package]).items()})
    out.mkdir(parents=True, exist_ok=True)
    releases = out / "releases"
    staging = releases / ".staging"
    if staging.exists():
        shutil.rmtree(staging)  # left by an interrupted build
    staging.mkdir(parents=True)
    os.umask(0o022)
    for dest, src in sorted(files.items()):
        target = staging / dest
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(src.read_bytes())
        target.chmod(0o644)
    launcher = staging / capsule.WORKER_ENTRY
    launcher.write_text(LAUNCHER)
    launcher.chmod(0o644)  # run as `python3 -I -B cairn-worker`, never executed directly
    listed = sorted([*files, capsule.WORKER_ENTRY])
    manifest = capsule.Manifest(
        cairn_version=tree.version,
        files=[capsule_build.describe_file(staging, rel) for rel in listed],
    )
    manifest_bytes = manifest.canonical_bytes()
    key = load_or_make_key(key_file, out)
    (staging / capsule.MANIFEST).write_bytes(manifest_bytes)
    (staging / capsule.SIGNATURE).write_bytes(capsule_build.sign(manifest_bytes, key))
    name = capsule.release_hash(manifest_bytes)
    final = releases / name
    if final.exists():
        shutil.rmtree(final)
    staging.rename(final)
    current = releases / "current"
    current.unlink(missing_ok=True)
    current.symlink_to(name)
    public = key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    (out / "release-key.pub").write_bytes(public)
    capsule.verify(final, capsule.load_public_key(public))
    return name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="build directory")
    parser.add_argument("--key", type=Path, help="Ed25519 private key (PEM); default: new")
    parser.add_argument("--source", type=Path, default=REPO, help="source tree")
    args = parser.parse_args()
    print(build(args.source.resolve(), args.out.resolve(), args.key))


if __name__ == "__main__":
    main()
