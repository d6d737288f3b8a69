"""``project:NAME`` definitions: ``PROJECT/.cairn/workflows/NAME.py``, usable only after the
person trusted that project, and only while each definition still has the review hash it
had then. An agent's changes can land in a project; they cannot land in ``trust.json``, so a
definition changed by anyone after the trust decision is refused until confirmed again."""

from __future__ import annotations

import os
import pwd
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from cairn import untrusted
from cairn.definitions.files import check_name, read_record, read_source, trust_path, write_record
from cairn.definitions.user import check_confirm
from cairn.errors import CairnError, NotFound, PermissionDenied, UsageError
from cairn.protocol.definitions import NAME_RE, TrustedProject, TrustFile, trust_hash
from cairn.workflow.review import Review, review_source

WORKFLOWS = ".cairn/workflows"
TRUST_FIX = "fix or remove it; 'cairn project trust PATH --confirm sha256:…' writes it anew"

_DIR_NOFOLLOW = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

Status = Literal["trusted", "changed", "missing", "untrusted"]


def project_root(path: Path | str) -> str:
    """A project's root as launch and trust name it: absolute and normalised."""
    return os.path.normpath(str(Path(path).expanduser().absolute()))


@contextmanager
def open_project(root: str) -> Iterator[int]:
    """An open directory fd of the project ``root``."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise NotFound(f"project {root}: {exc.strerror}") from None
    try:
        yield fd
    finally:
        os.close(fd)


def definition_names(project_fd: int, root: str, *, strict: bool = True) -> list[str]:
    """The names of the ``*.py`` files in ``.cairn/workflows/`` (no link followed on the
    way); a file whose stem cannot name a definition is refused (left out unless
    ``strict``)."""
    try:
        cairn_fd = os.open(".cairn", _DIR_NOFOLLOW, dir_fd=project_fd)
        try:
            folder = os.open("workflows", _DIR_NOFOLLOW, dir_fd=cairn_fd)
        finally:
            os.close(cairn_fd)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise UsageError(f"{root}/{WORKFLOWS}: cannot open: {exc.strerror}") from None
    try:
        files = sorted(n for n in os.listdir(folder) if n.endswith(".py"))
    finally:
        os.close(folder)
    if strict:
        return [check_name(n[:-3], "project") for n in files]
    return [n[:-3] for n in files if NAME_RE.match(n[:-3])]


def read_definition(project_fd: int, root: str, name: str) -> str:
    """The source of ``project:NAME`` (the user's own file, no link followed)."""
    rel = f"{WORKFLOWS}/{check_name(name, 'project')}.py"
    try:
        return read_source(project_fd, rel, f"{root}/{rel}")
    except untrusted.UntrustedFileMissing:
        raise NotFound(
            f"project:{name} not found: there is no {root}/{rel}",
            hint=f"see 'cairn workflow list'; the definitions of {root} are in {WORKFLOWS}/",
        ) from None


def review_project(project_fd: int, root: str) -> dict[str, Review]:
    """Every definition of the project, reviewed (a rejected one refuses the whole)."""
    reviews = {}
    for name in definition_names(project_fd, root):
        source = read_definition(project_fd, root, name)
        reviews[name] = review_source(source, filename=f"{name}.py")
    if not reviews:
        raise NotFound(
            f"{root} has no definitions in {WORKFLOWS}/",
            hint=f"a project definition is a reviewed workflow file {WORKFLOWS}/NAME.py",
        )
    return reviews


def load_trust() -> TrustFile:
    return read_record(trust_path(), TrustFile, "trust file", TRUST_FIX) or TrustFile()


def trusted_project(root: str) -> TrustedProject | None:
    return load_trust().projects.get(root)


def trust(root: str, confirm: str) -> TrustedProject:
    """Trust the project's definitions as they are now, if ``confirm`` is their trust hash."""
    check_confirm(confirm, f"'cairn project trust {root}'")
    with open_project(root) as fd:
        reviews = review_project(fd, root)
    hashes = {name: review.review_hash for name, review in reviews.items()}
    expected = trust_hash(root, hashes)
    if confirm != expected:
        raise PermissionDenied(
            f"the definitions of {root} do not match the confirmed hash: "
            f"their trust hash is {expected}",
            hint=f"read 'cairn project trust {root}' again (they may have changed), "
            f"then confirm {expected}",
        )
    record = TrustedProject(
        root=root,
        definitions=hashes,
        trust_hash=expected,
        trusted_at=time.time(),
        trusted_by=pwd.getpwuid(os.getuid()).pw_name,
    )
    current = load_trust()
    write_record(
        trust_path(), TrustFile(projects={**current.projects, root: record})
    )
    return record


def untrust(root: str) -> TrustedProject:
    """Forget the trust decision for ``root``; the record it had."""
    current = load_trust()
    record = current.projects.get(root)
    if record is None:
        raise NotFound(f"{root} is not trusted", hint="see 'cairn workflow list'")
    rest = {k: v for k, v in current.projects.items() if k != root}
    write_record(trust_path(), TrustFile(projects=rest))
    return record


def untrusted_refusal(name: str, root: str) -> PermissionDenied:
    return PermissionDenied(
        f"project:{name} is not trusted: {root} has no trust decision",
        hint=f"read 'cairn project trust {root}', then trust it with --confirm sha256:…",
    )


def trusted_definition(project_fd: int, root: str, name: str) -> tuple[str, str]:
    """(source, review hash) of ``project:NAME`` in ``root`` if the person trusted it at
    exactly this content; refused otherwise, saying how to trust it."""
    source = read_definition(project_fd, root, name)
    record = trusted_project(root)
    if record is None:
        raise untrusted_refusal(name, root)
    review = review_source(source, filename=f"{name}.py")
    expected = record.definitions.get(name)
    if expected is None:
        raise PermissionDenied(
            f"project:{name} was added to {root} after it was trusted",
            hint=f"read 'cairn project trust {root}' again, then confirm its new hash",
        )
    if review.review_hash != expected:
        raise PermissionDenied(
            f"project:{name} changed since {root} was trusted "
            f"(review hash now {review.review_hash})",
            hint=f"read 'cairn project trust {root}' again, then confirm its new hash",
        )
    return source, review.review_hash


def project_status(record: TrustedProject) -> dict[str, tuple[Status, str]]:
    """Each definition of a trusted project now: its status and current review hash
    (the trusted one when it is missing)."""
    found: dict[str, tuple[Status, str]] = {}
    try:
        with open_project(record.root) as fd:
            names = set(definition_names(fd, record.root, strict=False))
            for name in sorted(names | set(record.definitions)):
                if name not in names:
                    found[name] = ("missing", record.definitions[name])
                    continue
                try:
                    source = read_definition(fd, record.root, name)
                    now = review_source(source, filename=f"{name}.py").review_hash
                except CairnError:  # unreadable or rejected now: not what was trusted
                    now = ""
                trusted = record.definitions.get(name)
                status: Status = (
                    "untrusted" if trusted is None else "trusted" if trusted == now else "changed"
                )
                found[name] = (status, now)
    except CairnError:  # the project is gone or its definitions folder unreadable
        return {name: ("missing", h) for name, h in record.definitions.items()}
    return found
