"""How the definitions' files are read and written: the user's own files without following
a link, owned by the user and bounded in size (:mod:`cairn.untrusted`), parsed strictly
into their model; every write a whole-file replacement (:func:`cairn.fsutil.write_atomic`)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from cairn import untrusted, userpaths
from cairn.errors import UsageError, ValidationFailed
from cairn.fsutil import write_atomic
from cairn.protocol.definitions import NAME_RE
from cairn.validation import first_error

SOURCE_LIMIT = 1 << 20
"""The largest definition source read (bytes)."""
RECORD_LIMIT = 4 << 20
"""The largest record file read: an installed definition with its source, the registry."""

M = TypeVar("M", bound=BaseModel)


def drafts_dir() -> Path:
    return userpaths.cairn_dir() / "drafts"


def workflows_dir() -> Path:
    return userpaths.cairn_dir() / "workflows"


def trust_path() -> Path:
    return userpaths.cairn_dir() / "trust.json"


def registry_path() -> Path:
    return userpaths.cairn_dir() / "registry.json"


def check_name(name: str, namespace: str = "user") -> str:
    """``name`` if it can name a definition; a usage error saying what a name is otherwise."""
    if not NAME_RE.match(name):
        raise UsageError(
            f"{namespace}:{name} is not a definition name",
            hint="a name is a lowercase letter, then up to 40 of a-z 0-9 _ -",
        )
    return name


def read_record(path: Path, model: type[M], what: str, fix: str) -> M | None:
    """The model in ``path`` (None when there is no such file), read as the user's own
    file; a file that is not that model exactly is one :class:`ValidationFailed`."""
    try:
        data = untrusted.read_bytes(path.parent, path.name, owner=os.getuid(), limit=RECORD_LIMIT)
    except untrusted.UntrustedFileMissing:
        return None
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        where, message = first_error(exc, top="file")
        raise ValidationFailed(f"{path}: not a valid {what}: {where}: {message}", hint=fix) from exc


def write_record(path: Path, record: BaseModel) -> None:
    """Replace ``path`` with ``record`` as JSON, whole (a crash leaves the old or the new)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_atomic(path, record.model_dump_json(indent=2) + "\n", mode=0o600)


def read_source(base: Path | int, rel: str, where: str) -> str:
    """A definition source beneath ``base`` (a directory path or an open directory fd):
    the user's own regular file, no link followed, at most :data:`SOURCE_LIMIT` bytes."""
    try:
        return untrusted.read_text(base, rel, owner=os.getuid(), limit=SOURCE_LIMIT)
    except untrusted.UntrustedFileError as exc:
        raise type(exc)(where, exc.reason) from None


def read_named_file(file: Path) -> str:
    """The text of a workflow file a person named, read once; refused if it changes while
    it is read (its size, times or identity differ before and after), so what is reviewed
    is the exact text that is kept."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"cannot read {file}: {exc.strerror}") from None
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            raise UsageError(f"{file} is not a regular file")
        if before.st_size > SOURCE_LIMIT:
            raise UsageError(f"{file} is larger than {SOURCE_LIMIT} bytes")
        data = _read_all(fd)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    try:
        now = os.stat(file)
    except OSError:
        now = None
    if _identity(before) != _identity(after) or now is None or _identity(now) != _identity(after):
        raise UsageError(
            f"{file} changed while it was being read",
            hint="nothing was changed; run the command again once nothing is writing to it",
        )
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise UsageError(f"{file} is not UTF-8 text") from None


def _read_all(fd: int) -> bytes:
    with open(fd, "rb", closefd=False) as fh:
        return fh.read(SOURCE_LIMIT + 1)


def _identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
