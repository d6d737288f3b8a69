"""Naming a run the short way: a unique prefix of its ID, or ``@last``.

cairnd resolves the run a request names (:data:`cairn.protocol.daemon.RunRef`) once, in
:func:`cairn.daemon.server.dispatch`, before any handler sees the request: handlers only
ever get a full run ID. A reference is resolved among the runs the caller may see (their
own; every run for a member of ``cairn-admin``, as :func:`~cairn.daemon.views.visible_run`
allows), so a prefix never resolves to, nor lists, another user's run.
"""

from __future__ import annotations

from cairn.daemon.views import is_admin
from cairn.errors import NotFound, UsageError
from cairn.journal.readwrite import Journal
from cairn.journal.runs import RunMatch
from cairn.protocol.names import is_run_id
from cairn.protocol.requestchecks import LAST_RUN, run_ref_problem

# How many runs an ambiguous prefix lists.
CANDIDATES = 5


def resolve_run(journal: Journal, uid: int, ref: str) -> str:
    """The full ID of the run ``ref`` names for ``uid``.

    A full ID is returned as it is: whether the caller may see that run is the handler's
    check, as it always was. ``@last`` is the caller's own newest run. A prefix (at least
    four hex digits, ``flow_`` optional) must match exactly one run the caller may see;
    none is :class:`NotFound`, several a :class:`UsageError` listing them.
    """
    if is_run_id(ref):
        return ref
    problem = run_ref_problem(ref)
    if problem is not None:
        raise UsageError(problem, hint="list your runs with 'cairn ps'")
    if ref == LAST_RUN:
        latest = journal.latest_run_id(uid)
        if latest is None:
            raise NotFound("you have no runs yet", hint="start one with 'cairn launch'")
        return latest
    prefix = "flow_" + ref.removeprefix("flow_")
    owner = None if is_admin(uid) else uid
    matches = journal.runs_with_prefix(prefix, owner_uid=owner, limit=CANDIDATES + 1)
    if not matches:
        raise NotFound(f"no run {ref}", hint="list your runs with 'cairn ps'")
    if len(matches) > 1:
        raise UsageError(
            f"run prefix {ref} is ambiguous: {candidates(matches)}",
            hint="give more digits of the run ID; 'cairn ps' lists your runs",
        )
    return matches[0].run_id


def candidates(matches: list[RunMatch]) -> str:
    """The first :data:`CANDIDATES` matches on one line: ID, definition and state."""
    listed = ", ".join(f"{m.run_id} ({m.definition}, {m.state})" for m in matches[:CANDIDATES])
    return listed + (", and more" if len(matches) > CANDIDATES else "")
