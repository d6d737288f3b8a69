"""What waits for a person, and the command to run next: the one source of ``cairn
inbox`` and of the notification hooks' ``waiting`` items (``/usr/share/doc/cairn/docs/people.md``).

A run waits for someone when it has an open question, an open approval request (an
agent that policy holds, a ``flow.approve``, a proposal held for ``cairn apply``), or
when it is ``blocked`` (an operation that may have reached outside and has no result,
or storage that does not match its receipts). A schedule waits for someone when
repeated launch failures blocked it.
"""

from __future__ import annotations

from cairn.journal.people import ApprovalRow, QuestionRow
from cairn.journal.readwrite import Journal
from cairn.journal.rows import RunRow
from cairn.protocol.jsonvalue import JSONObject, json_str_or_none
from cairn.protocol.notify import WaitingItem
from cairn.settle.outcome import APPLY_REQUEST_ID


def question_item(run_id: str, question: QuestionRow) -> WaitingItem:
    command = f"cairn answer {run_id} --challenge {question.challenge} VALUE"
    return WaitingItem(
        kind="question", op_id=question.op_id, question=question.question,
        command=command, commands=[command],
    )


def approval_item(run_id: str, approval: ApprovalRow) -> WaitingItem:
    reject = f"cairn reject {run_id} {approval.request_id} --reason …"
    if approval.request_id == APPLY_REQUEST_ID:
        commands = [f"cairn apply {run_id}", f"cairn diff {run_id}", reject]
    else:
        commands = [
            f"cairn approve {run_id} {approval.request_id} --fingerprint {approval.fingerprint}",
            reject,
        ]
    asked = approval.prepared.get("kind") == "approve"  # a flow.approve, not an agent's
    subject = json_str_or_none(approval.prepared.get("subject")) if asked else None
    return WaitingItem(
        kind="approval", op_id=approval.op_id, request_id=approval.request_id,
        question=subject, deadline=approval.deadline, command=commands[0], commands=commands,
    )


def blocked_items(journal: Journal, run: RunRow) -> list[WaitingItem]:
    """What a blocked run needs: a decision on each uncertain operation, else (storage
    that does not match, a runtime it was not launched for) a look with doctor."""
    run_id = run.run_id
    items = [
        WaitingItem(
            kind="blocked",
            op_id=op.op_id,
            reason=op.error or run.error,
            command=f"cairn reconcile {run_id} {op.op_id} --no-effect",
            commands=[
                f"cairn reconcile {run_id} {op.op_id} --no-effect",
                f"cairn reconcile {run_id} {op.op_id} --result FILE",
                f"cairn retry {run_id} {op.op_id}",
            ],
        )
        for op in journal.list_ops(run_id)
        if op.state == "uncertain"
    ]
    if items:
        return items
    commands = [f"cairn doctor {run_id}", f"cairn cancel {run_id}"]
    return [WaitingItem(kind="blocked", reason=run.error, command=commands[0], commands=commands)]


def items_of_run(journal: Journal, run: RunRow) -> list[WaitingItem]:
    """Everything ``run`` waits for now, each with its commands."""
    if run.state == "blocked":
        return blocked_items(journal, run)
    return [
        question_item(run.run_id, q) for q in journal.questions(run.run_id) if q.state == "waiting"
    ] + [
        approval_item(run.run_id, a) for a in journal.approvals(run.run_id) if a.state == "waiting"
    ]


def inbox(journal: Journal, owner: int | None) -> list[JSONObject]:
    """What waits for ``owner`` (everyone when None), oldest first: open questions and
    approval requests of any run (scheduled or not), and blocked runs. Each item carries
    what the journal knows of it and ``commands``, the commands to run next."""
    items: list[JSONObject] = []
    for row in journal.waiting_for_people(owner):
        if row["kind"] == "question":
            item = question_item(row["run_id"], QuestionRow.model_validate(
                {**row, "json_schema": row["json_schema"]}))
        else:
            item = approval_item(row["run_id"], ApprovalRow.model_validate(row))
        items.append({**row, "commands": list(item.commands)})
    for run in journal.blocked_runs(owner):
        for blocked in blocked_items(journal, run):
            items.append({
                "kind": "blocked", "run_id": run.run_id, "run_state": run.state,
                "definition": run.definition, "op_id": blocked.op_id,
                "reason": blocked.reason, "created_at": run.updated_at,
                "commands": list(blocked.commands),
            })
    return items
