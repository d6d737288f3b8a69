"""cairnd's replies of ``ping``, ``launch``, ``upgrade`` and ``watch``, typed (the
:class:`~cairn.protocol.replies.Reply` models of the other ops are in
:mod:`cairn.protocol.replies` and :mod:`cairn.protocol.view_replies`), each built by its
handler in ``daemon/``. A key whose value is its model's default is left out on the wire
where cairnd always left it out (``launch``'s ``position`` and ``launched_before``,
``upgrade``'s ``upgraded``): its handler dumps with ``exclude_unset``.

``cairn launch`` reads its reply without a model (it loads no pydantic,
:mod:`cairn.cli.launching`); a unit test holds what it reads to :class:`LaunchReply`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Discriminator, JsonValue, Tag

from cairn.protocol.replies import Reply, kind_tag


class PingReply(Reply):
    """``ping``: who cairnd sees asking, and whether it counts them as an admin."""

    uid: int
    admin: bool


class LaunchReply(Reply):
    """``launch``: the run, its review and launch hashes, and the state it was admitted in
    (``queued``: waiting for a machine-wide slot, at ``position``, 1 = next, None when it
    left the queue meanwhile). ``launched_before``: the launch's run key already named
    this run, which was not launched again."""

    run_id: str
    review_hash: str
    launch_hash: str
    state: str
    position: int | None = None
    launched_before: bool = False


class UpgradeDivergence(Reply):
    """Where the new source's calls first differ from the journal's: the operation, what
    differs (``field``), what the journal holds and what the new source asked for."""

    op_id: str
    field: str
    expected: JsonValue
    actual: JsonValue


class UpgradeReply(Reply):
    """``upgrade``: the dry run's report (how many committed operations the new source
    reproduced, ``checked`` of ``committed``, its first ``divergence``, None: none, and the
    call site of each operation it checked), the review hashes from and to, and whether
    the run moved (``upgraded``; never on a dry run)."""

    run_id: str
    from_hash: str
    to_hash: str
    checked: int
    committed: int
    divergence: UpgradeDivergence | None
    locations: dict[str, str]
    upgraded: bool = False


class WaitingFor(Reply):
    """What a watched run waits for; an item of a kind this reader does not know is read
    as only this."""

    kind: str
    op_id: str


class WaitingQuestion(WaitingFor):
    """An open question, answered with its ``challenge``."""

    kind: Literal["question"]
    question: str
    challenge: str


class WaitingApproval(WaitingFor):
    """An open approval request, approved with its ``fingerprint``."""

    kind: Literal["approval"]
    request_id: str
    fingerprint: str


_waiting_kind = kind_tag(("question", "approval"), "other")


class WatchReply(Reply):
    """``watch``: the run's state (``finished``: it ended, with its ``error`` or
    ``output``), its events after the cursor asked for, each as the journal holds it, the
    ``cursor`` of the last one, whether there are ``more`` after it, and what it waits
    for."""

    run_id: str
    state: str
    finished: bool
    error: str | None
    output: dict[str, JsonValue] | None
    events: list[dict[str, JsonValue]]
    cursor: int
    more: bool
    waiting: list[
        Annotated[
            Annotated[WaitingQuestion, Tag("question")]
            | Annotated[WaitingApproval, Tag("approval")]
            | Annotated[WaitingFor, Tag("other")],
            Discriminator(_waiting_kind),
        ]
    ]
