"""The one exception root. Every error a person may see carries a one-line message and,
where there is one, a hint saying what to do next.

Here are the root and the errors of more than one concern; an error of one concern lives
with it (the journal's ``LeaseLost`` in :mod:`cairn.journal.writes`, ``Busy`` and
``RunEnded`` in :mod:`cairn.journal.runs`, ``AlreadyAnswered`` and ``StaleRequest`` in
:mod:`cairn.journal.people`, the coordinator's ``OperationError`` in
``coordinator/base.py``), so the root broker, which raises none of those, does not load
them."""

from __future__ import annotations


class CairnError(Exception):
    """Base of every error Cairn raises on purpose.

    ``message`` is one line a person can act on; ``hint`` says what to do next.
    ``code`` is a stable machine-readable name used on sockets and in ``--json`` output.
    """

    code = "error"

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class UsageError(CairnError):
    """The caller asked for something malformed or impossible."""

    code = "usage"


class NotFound(CairnError):
    """A run, definition, project or pool does not exist (or is not visible to the caller)."""

    code = "not-found"


class PermissionDenied(CairnError):
    """The caller may not see or act on this object."""

    code = "permission-denied"


class ValidationFailed(CairnError):
    """Data failed a schema (arguments, agent output, a socket message)."""

    code = "invalid"


class StorageError(CairnError):
    """A Btrfs or pool operation failed or was refused."""

    code = "storage"


class SystemdError(CairnError):
    """A systemd/D-Bus call failed."""

    code = "systemd"


class JournalError(CairnError):
    """The journal is missing, corrupt, or refused a write."""

    code = "journal"


class BrokerRefused(CairnError):
    """The broker refused a request or an intent."""

    code = "broker-refused"


class Unavailable(CairnError):
    """A service could not be reached; the same request may succeed later."""

    code = "unavailable"


class ProcessFailed(CairnError):
    """A subprocess exited non-zero."""

    code = "process-failed"

    def __init__(
        self, message: str, *, returncode: int, stderr: str = "", hint: str | None = None
    ) -> None:
        super().__init__(message, hint=hint)
        self.returncode = returncode
        self.stderr = stderr
