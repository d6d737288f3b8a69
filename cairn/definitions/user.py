"""``user:NAME`` definitions and drafts in the user's config.

A draft (``drafts/NAME.py``) is inert: nothing lists, launches or exposes it. Installing
reviews the exact text of a file, refuses it unless the person confirmed that review hash,
and writes ``workflows/NAME.json`` (source, hash, who, when) as one atomic replacement."""

from __future__ import annotations

import difflib
import os
import pwd
import time
from pathlib import Path

from cairn.definitions.builtin import builtin_source
from cairn.definitions.files import (
    check_name,
    drafts_dir,
    read_named_file,
    read_record,
    workflows_dir,
    write_record,
)
from cairn.errors import NotFound, PermissionDenied, UsageError
from cairn.protocol.definitions import HASH_RE, NAME_RE, InstalledDefinition
from cairn.workflow.review import Review, render_review, review_source


def draft_source(name: str) -> str:
    """A new draft's text: ``builtin:implement`` with the draft's own docstring and
    description, so a draft starts as a workflow that passes review and runs."""
    source, _file = builtin_source("implement")
    docstring, rest = source.split("\n", 1)
    description = 'description="Implement one reviewed objective."'
    if not docstring.startswith('"""') or description not in rest:
        raise AssertionError("builtin:implement no longer has the shape a draft is made from")
    return (
        f'"""{name}: a draft. Say here what this workflow is for."""\n'
        + rest.replace(description, f'description="{name}: describe what a run does."')
    )


RECORD_FIX = "reinstall it with 'cairn workflow install FILE --replace --confirm sha256:…'"


def draft_path(name: str) -> Path:
    return drafts_dir() / f"{check_name(name)}.py"


def create_draft(name: str) -> Path:
    """``drafts/NAME.py``, from a template unless it exists (an existing draft is kept)."""
    path = draft_path(name)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return path
    with open(fd, "w") as fh:
        fh.write(draft_source(name))
    return path


def is_draft(file: Path) -> bool:
    """Whether ``file`` is in the drafts directory (links resolved)."""
    return file.resolve().parent == drafts_dir().resolve()


def draft_refusal(name: str, what: str) -> UsageError:
    """The error for launching or exposing ``user:NAME`` while only its draft exists."""
    path = draft_path(name)
    return UsageError(
        f"user:{name} is a draft; drafts cannot be {what}",
        hint=f"review it with 'cairn workflow review {path}', then install it with "
        f"'cairn workflow install {path} --confirm sha256:…'",
    )


def record_path(name: str) -> Path:
    return workflows_dir() / f"{check_name(name)}.json"


def find_installed(name: str) -> InstalledDefinition | None:
    """The install record of ``user:NAME``, or None."""
    record = read_record(record_path(name), InstalledDefinition, "installed definition", RECORD_FIX)
    if record is not None and record.name != name:
        raise UsageError(
            f"{record_path(name)} holds user:{record.name}, not user:{name}", hint=RECORD_FIX
        )
    return record


def installed(name: str, *, purpose: str = "launched") -> InstalledDefinition:
    """The install record of ``user:NAME``; a draft or an absent name is refused."""
    record = find_installed(name)
    if record is not None:
        return record
    if draft_path(name).exists():
        raise draft_refusal(name, purpose)
    raise NotFound(
        f"user:{name} is not installed",
        hint="see 'cairn workflow list'; install one with "
        "'cairn workflow install FILE --confirm sha256:…'",
    )


def checked_review(record: InstalledDefinition) -> Review:
    """The review of an installed source, refused unless it still has its recorded hash
    (the record was edited, or this Cairn reviews differently)."""
    review = review_source(record.source, filename=f"{record.name}.py")
    if review.review_hash != record.review_hash:
        raise PermissionDenied(
            f"user:{record.name} does not match its install record "
            f"(review hash now {review.review_hash})",
            hint=f"review it again and {RECORD_FIX}",
        )
    return review


def all_installed() -> list[InstalledDefinition]:
    """Every installed ``user:`` definition, by name."""
    folder = workflows_dir()
    if not folder.is_dir():
        return []
    names = sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))
    found = [find_installed(name) for name in names if NAME_RE.match(name)]
    return [record for record in found if record is not None]


def check_confirm(confirm: str, what: str) -> str:
    """``confirm`` if it has the shape of a review hash; otherwise say where one comes from."""
    if not HASH_RE.match(confirm):
        raise UsageError(
            f"--confirm {confirm!r} is not a review hash (sha256: and 64 hex digits)",
            hint=f"read {what} and pass the hash it prints",
        )
    return confirm


def default_name(file: Path) -> str:
    """The name a file installs under: its stem (``fix-flaky.py`` → ``fix-flaky``)."""
    return file.name[:-3] if file.name.endswith(".py") else file.name


def install(
    file: Path, confirm: str, *, name: str | None = None, replace: bool = False
) -> InstalledDefinition:
    """Install ``file`` as ``user:NAME`` if its review hash is ``confirm``. An installed
    name is replaced only with ``replace``; nothing is written unless every check passes."""
    name = check_name(name or default_name(file))
    check_confirm(confirm, f"'cairn workflow review {file}'")
    source = read_named_file(file)
    review = review_source(source, filename=f"{name}.py")
    if review.review_hash != confirm:
        raise PermissionDenied(
            f"{file} does not match the confirmed hash: its review hash is {review.review_hash}",
            hint=f"read 'cairn workflow review {file}' (it may have changed since), "
            f"then install with --confirm {review.review_hash}",
        )
    current = find_installed(name)
    if current is not None and not replace:
        raise UsageError(
            f"user:{name} is already installed (review hash {current.review_hash})",
            hint=f"read 'cairn workflow diff user:{name} {file}', then install with "
            f"--replace --confirm {review.review_hash}",
        )
    record = InstalledDefinition(
        name=name,
        source=source,
        review_hash=review.review_hash,
        installed_at=time.time(),
        installed_by=pwd.getpwuid(os.getuid()).pw_name,
        installed_from=str(file.absolute()),
    )
    write_record(record_path(name), record)
    return record


def remove(name: str) -> InstalledDefinition:
    """Remove ``user:NAME``; the record it had."""
    record = installed(name, purpose="removed")
    record_path(name).unlink()
    return record


def manifest_diff(record: InstalledDefinition, file: Path) -> tuple[str, list[str]]:
    """What installing ``file`` over ``user:NAME`` would change: the new review hash and
    a unified diff of the rendered manifests (empty when only the source differs)."""
    old = checked_review(record)
    new = review_source(read_named_file(file), filename=f"{record.name}.py")
    lines = difflib.unified_diff(
        _manifest_lines(old),
        _manifest_lines(new),
        fromfile=f"user:{record.name}",
        tofile=str(file),
        lineterm="",
    )
    return new.review_hash, list(lines)


def _manifest_lines(review: Review) -> list[str]:
    lines = render_review(review).splitlines()
    return [line for line in lines if not line.startswith("review_hash:")]
