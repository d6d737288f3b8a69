"""The packages as files, without booting a machine: lintian on the .deb, the RPM against
the .deb (same programs, units, man pages, completions and examples; scriptlets that
enable the sockets through presets; requirements), and both built from ``git archive``.

Installing the RPM on Fedora is not possible from the development hosts (no Fedora
mirror); docs/packaging.md lists what these checks cannot show.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import sys
from pathlib import Path

import pytest

from cairn.proc import run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from docrefs import DOC_DIR, installed_names  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CAPSULE_DIR = re.compile(r"^/usr/lib/cairn/releases/[0-9a-f]{64}(?=/|$)")
PYTHON_DIR = re.compile(r"^/usr/lib/python3[.0-9]*/(?:dist|site)-packages/")
PACKAGE_METADATA = re.compile(r"\.(?:dist|egg)-info(?:/|$)|/__pycache__(?:/|$)")

# What each package has that the other must not: Debian's changelog, copyright and
# lintian overrides; Fedora's licence
# directory, and the presets an administrator may copy (Fedora's packages enable nothing
# themselves).
DEB_ONLY = {
    "/usr/share/doc/cairn/changelog",
    "/usr/share/doc/cairn/copyright",
    "/usr/share/lintian/overrides/cairn",
    # Debian's zsh reads vendor-completions, Fedora's site-functions.
    "/usr/share/zsh/vendor-completions/_cairn",
}
RPM_ONLY = {
    "/usr/share/licenses/cairn/LICENSE",
    "/usr/share/doc/cairn/presets/80-cairn.preset",
    "/usr/share/doc/cairn/presets/80-cairn-user.preset",
    "/usr/share/zsh/site-functions/_cairn",
}
PRESETS = {
    "/usr/share/doc/cairn/presets/80-cairn.preset": "packaging/presets/80-cairn.preset",
    "/usr/share/doc/cairn/presets/80-cairn-user.preset": "packaging/presets/80-cairn-user.preset",
}


def build_rpm(out: Path, repo: Path = REPO, env: dict[str, str] | None = None) -> str:
    built = run([repo / "packaging" / "build-rpm.sh", "--out", out], env=env, timeout=900)
    rpm = built.stdout.decode().strip().splitlines()[-1]
    assert rpm.endswith(".noarch.rpm"), rpm
    return rpm


def _normal(path: str) -> str | None:
    """A path comparable across the two packages, or None for package metadata."""
    if PACKAGE_METADATA.search(path):
        return None
    path = PYTHON_DIR.sub("PYTHON/", path)
    path = CAPSULE_DIR.sub("/usr/lib/cairn/releases/HASH", path)
    # Debian compresses man pages and larger documents, Fedora's rpm only man pages.
    compressed = path.startswith(("/usr/share/man/", "/usr/share/doc/"))
    return path.removesuffix(".gz") if compressed else path


def deb_files(deb: Path) -> set[str]:
    """Files and symlinks of the .deb (directories left out)."""
    found = set()
    for line in run(["dpkg-deb", "-c", deb]).stdout.decode().splitlines():
        mode, *_, entry = line.split(maxsplit=5)
        if mode.startswith("d"):
            continue
        normal = _normal(entry.split(" -> ")[0].removeprefix("."))
        if normal:
            found.add(normal)
    return found


def rpm_files(rpm: str) -> set[str]:
    query = run(["rpm", "-qp", "--qf", "[%{FILEMODES:perms} %{FILENAMES}\n]", rpm])
    found = set()
    for line in query.stdout.decode().splitlines():
        mode, path = line.split(" ", 1)
        normal = None if mode.startswith("d") else _normal(path)
        if normal:
            found.add(normal)
    return found


def rpm_scriptlets(rpm: str) -> dict[str, str]:
    """``post``, ``preun``, ``postun`` (and any other) scriptlet bodies by name."""
    text = run(["rpm", "-qp", "--scripts", rpm]).stdout.decode()
    parts = re.split(r"^(\w+) scriptlet \(using [^)]*\):\n", text, flags=re.MULTILINE)
    names = {"postinstall": "post", "preuninstall": "preun", "postuninstall": "postun"}
    return {names.get(parts[i], parts[i]): parts[i + 1] for i in range(1, len(parts), 2)}


@pytest.fixture(scope="module")
def rpm(tmp_path_factory: pytest.TempPathFactory) -> str:
    if shutil.which("rpmbuild", path="/usr/bin:/bin") is None:
        pytest.skip("rpmbuild is not installed (apt-get install rpm)")
    return build_rpm(tmp_path_factory.mktemp("rpm"))


def test_deb_is_lintian_clean_with_pedantic_tags(deb: Path) -> None:
    if shutil.which("lintian", path="/usr/bin:/bin") is None:
        pytest.skip("lintian is not installed (apt-get install lintian)")
    proc = run(
        ["lintian", "--no-cfg", "--pedantic", "--display-info", deb], check=False, timeout=300
    )
    report = (proc.stdout + proc.stderr).decode(errors="replace")
    # Every remaining tag is overridden in debian/cairn.lintian-overrides, with its reason.
    findings = [line for line in report.splitlines() if line[:2] in ("E:", "W:", "I:", "P:")]
    assert findings == [], report


def test_every_document_named_and_every_readme_link_is_in_the_deb(deb: Path) -> None:
    """Hints and unit comments name installed documents; the installed README's links and
    the documents' links to each other resolve among the installed files, uncompressed."""
    listed = run(["dpkg-deb", "-c", deb]).stdout.decode().splitlines()
    raw = {line.split(maxsplit=5)[5].split(" -> ")[0].removeprefix(".") for line in listed}
    doc = DOC_DIR
    named = {f"{doc}{name}" for name in installed_names()}
    assert sorted(named - raw - {p.rstrip("/") for p in raw}) == []
    readme = (REPO / "README.md").read_text()
    links = re.findall(r"\]\((docs/[^)#\s]+)", readme)
    assert len(links) > 10
    for link in links:
        target = f"{doc}{link}"
        assert target in raw or any(p.startswith(target) for p in raw), link
    for page in (REPO / "docs").glob("*.md"):
        for link in re.findall(r"\]\(([\w./-]+\.(?:md|svg))\)", page.read_text()):
            if link.startswith("man/"):
                continue  # man page sources: installed rendered, as man pages
            assert f"{doc}docs/{link}" in raw, (page.name, link)


def test_rpm_ships_what_the_deb_ships(deb: Path, rpm: str) -> None:
    in_deb, in_rpm = deb_files(deb), rpm_files(rpm)
    assert in_deb - in_rpm == DEB_ONLY
    assert in_rpm - in_deb == RPM_ONLY
    for expected in (
        "/usr/bin/cairn",
        "/usr/libexec/cairn/cairnd",
        "/usr/libexec/cairn/cairn-broker",
        "/usr/lib/systemd/user/cairn-schedule@.service",
        "/usr/lib/systemd/user/cairn-schedule-reconcile.service",
        "/usr/share/man/man1/cairn.1",
        "/usr/share/doc/cairn/examples/changelog-agent.json",
        "/usr/share/doc/cairn/examples/providers.toml",
        "PYTHON/cairn/broker/capsule.py",
        "/usr/lib/cairn/releases/HASH/manifest.sig",
    ):
        assert expected in in_rpm, expected
    # Nothing internal on PATH, in either package.
    assert {p for p in in_deb | in_rpm if p.startswith(("/usr/bin/", "/usr/sbin/"))} == {
        "/usr/bin/cairn"
    }
    assert not any("release-key.pem" in p or "__pycache__" in p for p in in_rpm)


def test_the_console_packages_ship_the_page_and_nothing_else(deb: Path, rpm: str) -> None:
    """cairn-cockpit, built beside cairn in both formats: the page's files, the same in
    both, and Debian's changelog and copyright."""
    page = {f"/usr/share/cockpit/cairn/{p.name}" for p in (REPO / "cockpit").iterdir()}
    version = deb.name.removeprefix("cairn_").removesuffix("_all.deb")
    (console_rpm,) = Path(rpm).parent.glob(f"cairn-cockpit-{version}-*.noarch.rpm")
    assert rpm_files(str(console_rpm)) == page
    assert deb_files(deb.with_name(f"cairn-cockpit_{version}_all.deb")) == page | {
        "/usr/share/doc/cairn-cockpit/changelog", "/usr/share/doc/cairn-cockpit/copyright"}


def test_rpm_enables_nothing_itself_and_ships_the_presets_to_copy(rpm: str) -> None:
    query = run(["rpm", "-qp", "--qf", "[%{FILEDIGESTS} %{FILENAMES}\n]", rpm])
    lines = query.stdout.decode().splitlines()
    digests = {name: digest for digest, name in (line.split(" ", 1) for line in lines)}
    for installed, source in PRESETS.items():
        assert digests[installed] == hashlib.sha256((REPO / source).read_bytes()).hexdigest()
    assert not [p for p in digests if "-preset/" in p]  # no preset systemd would read
    licence = hashlib.sha256((REPO / "LICENSE").read_bytes()).hexdigest()
    assert digests["/usr/share/licenses/cairn/LICENSE"] == licence

    scripts = rpm_scriptlets(rpm)
    assert "preset cairn.socket cairn-broker.socket cairn.service" in scripts["post"]
    assert "preset --global cairn-schedule-reconcile.service" in scripts["post"]
    assert "cairn.broker.capsule enable-verity" in scripts["post"]
    assert "if [ $1 -eq 0 ]" in scripts["preun"]
    assert "cairn-coordinator@*.service" in scripts["preun"]
    assert "try-restart cairn.service cairn-broker.service" in scripts["postun"]
    for body in scripts.values():
        for word in ("sqlite", "journal.db", "user_version"):
            assert word not in body


def test_rpm_requirements(rpm: str) -> None:
    requires = run(["rpm", "-qRp", rpm]).stdout.decode().splitlines()
    for name in (
        "python3-pydantic >= 2.10",
        "python3-pydantic < 3",
        "python3-click >= 8.1",
        "python3-btrfsutil",
        "python3-cryptography >= 38",
        "python3-jeepney >= 0.8",
        "btrfs-progs",
        "systemd",
        "dbus",
    ):
        assert name in requires, name


def test_both_packages_build_from_git_archive(tmp_path: Path) -> None:
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: there is no HEAD to archive")
    source = tmp_path / "src"
    source.mkdir()
    archive = run(["git", "-C", REPO, "archive", "--format=tar", "HEAD"], timeout=120).stdout
    run(["tar", "-x", "-C", source], input=archive)
    assert not (source / ".git").exists()
    # No development venv in a tarball: the build's Python is named.
    env = {"CAIRN_BUILD_PYTHON": sys.executable}
    built = run(
        [source / "packaging" / "build-deb.sh", "--out", tmp_path / "out"], env=env, timeout=900
    )
    deb = Path(built.stdout.decode().strip().splitlines()[-1])
    assert "/usr/libexec/cairn/cairnd" in deb_files(deb)
    if shutil.which("rpmbuild", path="/usr/bin:/bin") is not None:
        rpm = build_rpm(tmp_path / "out", source, env)
        assert rpm_files(rpm) - RPM_ONLY == deb_files(deb) - DEB_ONLY


def test_source_packages_carry_the_tree_and_rebuild_the_same_deb(
    deb: Path, tmp_path: Path
) -> None:
    """The .dsc (and the SRPM) a maintainer would upload: the tree with prebuilt/ (the
    signed capsule, the man page sources) and never the signing key; the .dsc unpacked
    with dpkg-source builds a .deb with exactly the files of the one built directly."""
    built = run([REPO / "packaging" / "build-deb.sh", "--source", "--out", tmp_path / "src"],
                timeout=900)
    dsc = Path(built.stdout.decode().strip().splitlines()[-1])
    assert dsc.name == deb.name.replace("_all.deb", ".dsc")
    tree = tmp_path / "x" / "cairn"
    tree.parent.mkdir()
    run(["dpkg-source", "-x", dsc, tree], cwd=tmp_path, timeout=300)
    assert (tree / "prebuilt/sealed-release/release-key.pub").is_file()
    assert not list(tree.rglob("release-key.pem"))
    assert (tree / "debian/rules").is_file() and (tree / "LICENSE").is_file()
    if shutil.which("lintian", path="/usr/bin:/bin") is not None:
        # clean with pedantic tags, as the .deb: what is left is overridden, with its reason,
        # in debian/source/lintian-overrides
        lint = run(["lintian", "--no-cfg", "--pedantic", "--display-info", dsc], check=False,
                   timeout=600)
        report = (lint.stdout + lint.stderr).decode(errors="replace")
        findings = [line for line in report.splitlines() if line[:2] in ("E:", "W:", "I:", "P:")]
        assert findings == [], report
    # Debian's own toolchain, as build-deb.sh runs it (no pyenv or venv interpreter).
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(tmp_path)}
    run(["dpkg-buildpackage", "-us", "-uc", "-b"], cwd=tree, env=env, timeout=900)
    rebuilt = tmp_path / "x" / deb.name
    assert deb_files(rebuilt) == deb_files(deb)
    if shutil.which("rpmbuild", path="/usr/bin:/bin") is not None:
        srpm = build_rpm_source(tmp_path / "srpm")
        listed = run(["rpm", "-qlp", srpm]).stdout.decode().split()
        assert sorted(listed) == ["cairn-0.1.0.tar.gz", "cairn.spec"]


def build_rpm_source(out: Path) -> str:
    built = run([REPO / "packaging" / "build-rpm.sh", "--source", "--out", out], timeout=900)
    srpm = built.stdout.decode().strip().splitlines()[-1]
    assert srpm.endswith(".src.rpm"), srpm
    return srpm


RPMLINTRC = REPO / "packaging" / "rpm" / "cairn.rpmlintrc"


def test_rpm_and_srpm_are_rpmlint_clean(rpm: str, tmp_path: Path) -> None:
    """Every finding left is filtered in packaging/rpm/cairn.rpmlintrc, with its reason; a
    filter that no longer matches anything is reported too, so the file cannot rot."""
    if shutil.which("rpmlint", path="/usr/bin:/bin") is None:
        pytest.skip("rpmlint is not installed (apt-get install rpmlint)")
    srpm = build_rpm_source(tmp_path / "srpm")
    proc = run(["rpmlint", "-r", RPMLINTRC, rpm, srpm], check=False, timeout=300)
    report = (proc.stdout + proc.stderr).decode(errors="replace")
    assert proc.returncode == 0, report
    assert " 0 errors, 0 warnings, 0 badness" in report, report


# Rows of the install table that name each file of their directory in their text.
ENUMERATED = (
    "/usr/libexec/cairn/", "/usr/lib/systemd/system/", "/usr/lib/systemd/user/",
    "/usr/share/man/", "/usr/share/doc/cairn/examples/",
)
# The .deb's own metadata, which the table leaves to Debian.
DEBIAN_ONLY = {"/usr/share/doc/cairn/changelog", "/usr/share/doc/cairn/copyright",
               "/usr/share/lintian/overrides/cairn"}


def install_table() -> dict[str, str]:
    """docs/packaging.md's "What both packages install": each path of the first column,
    with the text of its row's second column."""
    text = (REPO / "docs" / "packaging.md").read_text()
    section = text.split("## What both packages install", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = line.split(" | ")
        if not line.startswith("| `") or len(cells) < 2:
            continue
        for path in re.findall(r"`([^`]+)`", cells[0]):
            rows[path] = cells[1]
    return rows


def _named_in(text: str, relative: str) -> bool:
    """Whether the row's ``text`` names the file ``relative`` (to the row's directory)."""
    import fnmatch

    names = re.findall(r"`([^`]+)`", text)
    man = re.fullmatch(r"man(\d)/(.+)\.\1", relative)
    if man:
        return f"{man.group(2)}({man.group(1)})" in names
    return any(fnmatch.fnmatchcase(relative, name) for name in names)


def test_the_install_table_of_packaging_md_is_the_package_file_list(deb: Path) -> None:
    rows = install_table()
    files = deb_files(deb) - DEBIAN_ONLY
    files = {re.sub("^PYTHON/", "/usr/lib/python3/dist-packages/", f) for f in files}

    def row_of(path: str) -> str | None:
        owners = [p for p in rows if path == p or (p.endswith("/") and path.startswith(p))]
        return max(owners, key=len) if owners else None

    assert sorted(f for f in files if row_of(f) is None) == []
    assert sorted(p for p in rows if not any(f == p or f.startswith(p) for f in files)) == []
    for directory in ENUMERATED:
        inside = sorted(f.removeprefix(directory) for f in files if row_of(f) == directory)
        assert inside, directory
        unnamed = [f for f in inside if not _named_in(rows[directory], f)]
        assert unnamed == [], f"{directory} row does not name {unnamed}"
        for name in re.findall(r"`([^`]+)`", rows[directory]):
            if " " in name or name.startswith("/") or name.endswith("/"):  # not a file here
                continue
            assert any(_named_in(f"`{name}`", f) for f in inside), f"{directory}: {name}"
