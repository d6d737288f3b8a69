"""The sealed release: a real capsule built from this tree by ``sealed-release/build.py``,
verified by the broker's checks, and refused after every kind of tampering."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from pydantic import ValidationError

from cairn import capsule, capsule_build
from cairn.broker import capsule as broker_capsule
from cairn.errors import BrokerRefused
from cairn.proc import run

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "sealed-release" / "build.py"


def build(out: Path) -> Path:
    proc = run([sys.executable, BUILD, "--out", out], timeout=120)
    name = proc.stdout.decode().strip()
    return out / "releases" / name


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("capsule"))


@pytest.fixture
def release(built: Path, tmp_path: Path) -> Path:
    """A private copy of the built capsule (with its key), free to tamper with."""
    shutil.copytree(built.parents[1], tmp_path / "out", symlinks=True)
    return tmp_path / "out" / "releases" / built.name


def key_of(release: Path) -> Path:
    return release.parents[1] / "release-key.pub"


def verify(release: Path) -> broker_capsule.VerifiedCapsule:
    return broker_capsule.verify_release(release, key_of(release))


def test_built_capsule_holds_the_worker_closure_and_verifies(release: Path) -> None:
    manifest = capsule.Manifest.model_validate_json((release / capsule.MANIFEST).read_bytes())
    paths = {f.path for f in manifest.files}
    for expected in (
        "cairn-worker",
        "lib/cairn/__init__.py",
        "lib/cairn/worker/__main__.py",
        "lib/cairn/worker/channel.py",
        "lib/cairn/worker/profiles.py",
        # imported by the profile that uses them, when it runs
        "lib/cairn/worker/llm.py",
        "lib/cairn/worker/retry.py",
        "lib/cairn/worker/tools.py",
        "lib/cairn/worker/shim.py",
        "lib/cairn/forwarding.py",
        "lib/cairn/protocol/agent.py",
        "lib/cairn/protocol/base.py",
        "lib/cairn/errors.py",
        "lib/cairn/journald.py",
        *(f"lib/cairn/builtin/workflows/{name}.py" for name in (
            "implement", "execute_plan", "research", "review", "optimize", "goal")),
        *(f"lib/cairn/builtin/profiles/{name}.md" for name in (
            "implementer", "planner", "researcher", "reviewer")),
    ):
        assert expected in paths
    # Nothing the worker does not import: no daemon, broker or coordinator code.
    assert not any(
        p.startswith(("lib/cairn/broker", "lib/cairn/daemon", "lib/cairn/coord")) for p in paths
    )
    assert os.readlink(release.parent / "current") == release.name
    verified = verify(release)
    assert (
        verified.hash
        == release.name
        == capsule.release_hash((release / capsule.MANIFEST).read_bytes())
    )
    assert verified.entry == "cairn-worker"


def test_rebuild_of_same_tree_gives_the_same_hash(built: Path, tmp_path: Path) -> None:
    assert build(tmp_path).name == built.name


def test_one_changed_byte_is_refused(release: Path) -> None:
    target = release / "lib" / "cairn" / "worker" / "profiles.py"
    data = bytearray(target.read_bytes())
    data[100] ^= 0x01
    target.write_bytes(bytes(data))
    with pytest.raises(
        capsule.CapsuleInvalid, match="worker/profiles.py does not match its SHA-256"
    ):
        verify(release)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("extra-module", "lib/cairn/worker/extra.py is not in the manifest"),
        ("bytecode", "__pycache__ is not in the manifest|__pycache__/.*not in the manifest"),
        ("missing", "lib/cairn/protocol/base.py is missing"),
        ("symlink", "lib/cairn/evil.py is not a regular file"),
        ("group-writable", "lib/cairn/protocol/agent.py is writable by group or others"),
        ("manifest", "manifest.json does not match the capsule's hash"),
        ("other-key", "signature is not valid under the release key"),
    ],
)
def test_tampering_is_refused(release: Path, change: str, message: str) -> None:
    lib = release / "lib" / "cairn"
    if change == "extra-module":
        (lib / "worker" / "extra.py").write_text("print('not reviewed')\n")
    elif change == "bytecode":
        (lib / "__pycache__").mkdir()
        (lib / "__pycache__" / "paths.cpython-313.pyc").write_bytes(b"\0" * 16)
    elif change == "missing":
        (lib / "protocol" / "base.py").unlink()
    elif change == "symlink":
        (lib / "evil.py").symlink_to("/etc/passwd")
    elif change == "group-writable":
        (lib / "protocol" / "agent.py").chmod(0o664)
    elif change == "manifest":
        manifest = release / capsule.MANIFEST
        manifest.write_bytes(
            manifest.read_bytes().replace(b'"cairn_version":"', b'"cairn_version":"9')
        )
    elif change == "other-key":
        other = Ed25519PrivateKey.generate().public_key()
        key_of(release).write_bytes(
            other.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
        )
    with pytest.raises(capsule.CapsuleInvalid, match=message):
        verify(release)


def test_broker_refuses_a_tampered_installed_capsule(
    release: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "host"
    lib = root / "usr" / "lib" / "cairn"
    lib.mkdir(parents=True)
    shutil.copytree(release.parent, lib / "releases", symlinks=True)
    shutil.copyfile(key_of(release), lib / "release-key.pub")
    monkeypatch.setenv("CAIRN_ROOT", str(root))

    assert broker_capsule.verified_capsule(None).hash == release.name
    # The launch's recorded capsule is used while installed; an unknown one falls back to
    # the current (signed) release.
    assert broker_capsule.verified_capsule(release.name).path == str(
        lib / "releases" / release.name
    )
    assert broker_capsule.verified_capsule("f" * 64).hash == release.name

    installed = lib / "releases" / release.name / "lib" / "cairn" / "protocol" / "agent.py"
    installed.write_bytes(installed.read_bytes() + b"#")
    with pytest.raises(
        BrokerRefused, match="sealed release refused: .*protocol/agent.py does not match"
    ):
        broker_capsule.verified_capsule(release.name)

    (lib / "releases" / "current").unlink()
    shutil.rmtree(lib / "releases" / release.name)
    with pytest.raises(BrokerRefused, match="no sealed release is installed"):
        broker_capsule.verified_capsule(None)


def test_launcher_imports_cairn_only_from_the_capsule(release: Path) -> None:
    main = release / "lib" / "cairn" / "worker" / "__main__.py"
    main.write_text(
        "import cairn, cairn.protocol.agent, cairn.worker.channel\n"
        "print(cairn.__file__)\nprint(cairn.protocol.agent.__file__)\n"
        "print(cairn.worker.channel.__file__)\n"
    )
    # The agent unit runs /usr/bin/python3 -I -B; the interpreter of this test session
    # is the one that has the distro's pydantic here.
    proc = run([sys.executable, "-I", "-B", release / "cairn-worker"], timeout=60)
    lines = proc.stdout.decode().splitlines()
    assert len(lines) == 3
    for line in lines:
        assert line.startswith(str(release / "lib" / "cairn") + "/"), line


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 128 * 4096, 128 * 4096 + 1, 300_000])
def test_fsverity_digest_matches_fsverity_utils(tmp_path: Path, size: int) -> None:
    tool = shutil.which("fsverity", path="/usr/bin:/bin")
    if tool is None:
        pytest.skip("fsverity-utils is not installed (apt-get install fsverity)")
    data = bytes((i * 7 + i // 4096) % 251 for i in range(size))
    path = tmp_path / "f"
    path.write_bytes(data)
    out = run([tool, "digest", "--hash-alg=sha256", "--block-size=4096", path]).stdout.decode()
    assert out.split()[0] == "sha256:" + capsule_build.fsverity_digest(data)


def test_manifest_rejects_paths_outside_the_capsule() -> None:
    entry = {"size": 0, "mode": 0o644, "sha256": "0" * 64, "fsverity": "0" * 64}
    for bad in ("../etc/passwd", "/abs", "a/../b", "manifest.json", "a//b"):
        with pytest.raises(ValidationError):
            capsule.CapsuleFile.model_validate({"path": bad, **entry})


def test_a_release_key_that_is_not_an_ed25519_pem_is_refused() -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    with pytest.raises(capsule.CapsuleInvalid, match="the release public key is not PEM"):
        capsule.load_public_key(b"not a key")
    other = ec.generate_private_key(ec.SECP256R1()).public_key()
    pem = other.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    with pytest.raises(capsule.CapsuleInvalid, match="is not an Ed25519 key"):
        capsule.load_public_key(pem)


def test_a_capsule_not_named_by_its_hash_or_without_its_signature_is_refused(
    release: Path, tmp_path: Path
) -> None:
    key = capsule.load_public_key(key_of(release).read_bytes())
    renamed = release.with_name("latest")
    release.rename(renamed)
    with pytest.raises(capsule.CapsuleInvalid, match="latest is not named by a SHA-256"):
        capsule.verify(renamed, key)
    renamed.rename(release)
    (release / capsule.SIGNATURE).chmod(0o644)
    (release / capsule.SIGNATURE).unlink()
    with pytest.raises(capsule.CapsuleInvalid, match="cannot read .*: No such file"):
        capsule.verify(release, key)


def test_a_current_link_that_is_not_a_link_to_a_capsule_is_refused(tmp_path: Path) -> None:
    assert capsule.current_release(tmp_path) is None
    (tmp_path / "current").write_text("x")
    with pytest.raises(capsule.CapsuleInvalid, match="current: Invalid argument"):
        capsule.current_release(tmp_path)
    (tmp_path / "current").unlink()
    (tmp_path / "current").symlink_to("../../etc")
    with pytest.raises(capsule.CapsuleInvalid, match="current points at '../../etc', not a"):
        capsule.current_release(tmp_path)


def test_a_release_key_that_cannot_be_read_refuses_every_capsule(tmp_path: Path) -> None:
    release = tmp_path / ("sha256-" + "0" * 64)
    release.mkdir()
    missing = tmp_path / "release-key.pub"
    with pytest.raises(capsule.CapsuleInvalid,
                       match=f"cannot read the release key {missing}: No such file"):
        broker_capsule.verify_release(release, missing)
