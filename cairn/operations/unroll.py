"""``flow.unroll(items, fn, title=)`` and ``flow.item(key, fn)``: a durable worklist.

Both are markers (no effect): ``unroll`` declares the worklist (its title and item
labels), then one ``item`` per item marks it active and a last ``item`` marks the list
done; ``flow.item`` on its own marks one active key. The per-item markers are made at
the ``flow.unroll`` call site, so they belong to its reviewed site. Views rebuild each
worklist from these markers alone (:func:`worklists`, shown by ``cairn show``) and
report markers that contradict it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

from cairn.operations.spec import Contradiction, OperationRecord, OperationSpec
from cairn.protocol.jsonvalue import JSONObject

LABEL_LIMIT = 120


def label(item: object) -> str:
    """How an item appears in the journal and in ``cairn show``."""
    text = (
        item
        if isinstance(item, str)
        else json.dumps(
            item.model_dump(mode="json") if isinstance(item, BaseModel) else item, default=str
        )
    )
    return text[:LABEL_LIMIT]


def request(title: str, labels: list[str]) -> JSONObject:
    """What ``flow.unroll`` sends and the journal stores."""
    return {"title": title, "items": list(labels)}


def item_request(worklist: str, index: int, item_label: str) -> JSONObject:
    """The marker of item ``index`` of ``worklist`` (``flow.item``: no worklist, -1)."""
    return {"worklist": worklist, "index": index, "label": item_label}


def done_request(worklist: str, count: int) -> JSONObject:
    """The marker after the last of ``count`` items: the worklist is complete."""
    return {"worklist": worklist, "index": count, "label": "", "done": True}


def worklists(
    ops: Iterable[OperationRecord],
) -> tuple[list[JSONObject], list[Contradiction]]:
    """Worklists of ``flow.unroll``, rebuilt from the journal's markers alone (each item
    done, active or still to come), and the markers that contradict them: an item of a
    worklist no ``unroll`` declared before it in its scope, or one out of its order (the
    runtime marks items 0, 1, … then done, once each). A contradicted worklist is left
    out rather than guessed at."""
    lists: list[dict[str, Any]] = []
    problems: list[Contradiction] = []
    revisions: dict[tuple[str, str], int] = {}
    for op in sorted(ops, key=lambda o: (o.scope, o.seq)):
        if op.kind == "unroll":
            key = (op.scope, op.request["title"])
            revisions[key] = revisions.get(key, 0) + 1
            lists.append(
                {
                    "scope": op.scope,
                    "title": op.request["title"],
                    "revision": revisions[key],
                    "items": list(op.request["items"]),
                    "done": 0,
                    "active": None,
                    "complete": False,
                    "contradicted": False,
                }
            )
        elif op.kind == "item" and op.request.get("worklist"):
            title, index = op.request["worklist"], op.request.get("index")
            owners = [w for w in lists if w["scope"] == op.scope and w["title"] == title]
            if not owners:
                problems.append(
                    Contradiction(
                        "item-without-unroll",
                        op.op_id,
                        f"{op.op_id} marks item {index} of worklist {title!r}, which no "
                        f"flow.unroll of scope {op.scope} declared before it",
                    )
                )
                continue
            current = owners[-1]
            expected = 0 if current["active"] is None else current["active"] + 1
            if current["complete"] or index != expected:
                problems.append(
                    Contradiction(
                        "item-out-of-order",
                        op.op_id,
                        f"{op.op_id} marks item {index} of worklist {title!r} "
                        f"r{current['revision']}, where the journal's markers lead to "
                        + ("no further item (it is done)" if current["complete"]
                           else f"item {expected}"),
                    )
                )
                current["contradicted"] = True
            elif op.request.get("done") and index == len(current["items"]):
                current.update(done=len(current["items"]), active=None, complete=True)
            elif index < len(current["items"]):
                current.update(done=index, active=index)
            else:
                problems.append(
                    Contradiction(
                        "item-outside-worklist",
                        op.op_id,
                        f"{op.op_id} marks item {index} of worklist {title!r} "
                        f"r{current['revision']}, which has {len(current['items'])} items",
                    )
                )
                current["contradicted"] = True
    shown = [w for w in lists if not w.pop("contradicted")]
    for w in shown:
        w["states"] = [
            "done" if i < w["done"] else "active" if i == w["active"] else "waiting"
            for i in range(len(w["items"]))
        ]
    return shown, problems


SPECS = (
    OperationSpec(
        kind="unroll",
        summary="declares an ordered worklist; a marker",
        is_marker=True,
    ),
    OperationSpec(
        kind="item",
        summary="marks the active item of a worklist; a marker",
        site_kinds=("item", "unroll"),
        is_marker=True,
    ),
)
