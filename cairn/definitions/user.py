"""``user:NAME`` definitions and drafts in the user's config.

A draft (``drafts/NAME.py``) is inert: nothing lists, launches or exposes it. Installing
reviews the exact text of a file, refuses it unless the person confirmed that review hash,
and writes ``workflows/NAME.json`` (source, hash, who, when) as one atomic replacement."""

from __future__ import annotations

import difflib
import hashlib
import os
import pwd
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from cairn import untrusted
from cairn.definitions.builtin import builtin_source
from cairn.definitions.files import (
    SOURCE_LIMIT,
    check_name,
    drafts_dir,
    read_named_file,
    read_record,
    workflows_dir,
    write_record,
)
from cairn.errors import CairnError, NotFound, PermissionDenied, UsageError
from cairn.fsutil import fsync_dir, write_atomic
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


class DraftChanged(CairnError):
    """A draft is not the one the writer last saw: a person (or another session) wrote
    it since, and replacing it would lose that unseen."""

    code = "draft-changed"


@dataclass(frozen=True)
class Draft:
    """``drafts/NAME.py`` as read: its text and that text's hash (``sha256:`` of its
    UTF-8 bytes; not the review hash, which also covers the manifest)."""

    name: str
    path: Path
    source: str

    @property
    def draft_hash(self) -> str:
        return "sha256:" + hashlib.sha256(self.source.encode()).hexdigest()


def read_draft(name: str) -> Draft | None:
    """The draft ``user:NAME`` (None when there is none): the user's own regular file, no
    link followed, at most :data:`SOURCE_LIMIT` bytes."""
    path = draft_path(name)
    try:
        source = untrusted.read_text(path.parent, path.name, owner=os.getuid(),
                                     limit=SOURCE_LIMIT)
    except untrusted.UntrustedFileMissing:
        return None
    return Draft(name, path, source)


def write_draft(name: str, source: str, *, replaces: str | None = None) -> Draft:
    """Write ``source`` as the draft ``user:NAME``, never installing it. Where no draft
    exists one is created (and ``replaces`` must be None); an existing draft is replaced
    only when ``replaces`` is its current :attr:`Draft.draft_hash`, checked right before
    the replacement, so an edit the writer has not seen is never overwritten
    (:class:`DraftChanged`). Either way the file appears whole or not at all."""
    check_name(name)
    size = len(source.encode())
    if size > SOURCE_LIMIT:
        raise UsageError(f"the draft's source is {size} bytes; at most {SOURCE_LIMIT} are kept",
                         hint="a workflow is a short program: move the prompts' bulk out")
    current = read_draft(name)
    if current is None:
        if replaces is not None:
            raise DraftChanged(f"user:{name} has no draft to replace (it was removed)",
                               hint="write it again without 'replaces' to start a new one")
        _create_draft(draft_path(name), source)
        return Draft(name, draft_path(name), source)
    if replaces != current.draft_hash:
        raise DraftChanged(
            f"user:{name} already has a draft ({current.draft_hash}) that this call does "
            "not replace" if replaces is None else
            f"user:{name}'s draft changed since {replaces}: it is {current.draft_hash} now",
            hint="read the current draft first (nothing was written), keep what a person "
            "changed, then give its hash as 'replaces'",
        )
    if current.source != source:
        write_atomic(current.path, source, mode=0o600)
    return Draft(name, current.path, source)


def _create_draft(path: Path, source: str) -> None:
    """``path`` holding ``source``, only if nothing is there: a whole temporary linked to
    the name (``link(2)`` never replaces an entry, and never follows a link at it)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with open(os.open(tmp, flags, 0o600), "wb") as fh:
        fh.write(source.encode())
        fh.flush()
        os.fsync(fh.fileno())
    try:
        os.link(tmp, path, follow_symlinks=False)
    except FileExistsError:
        raise DraftChanged(f"user:{path.stem} got a draft while this one was written",
                           hint="read the current draft first, then give its hash as "
                           "'replaces'") from None
    finally:
        tmp.unlink()
    fsync_dir(path.parent)


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
