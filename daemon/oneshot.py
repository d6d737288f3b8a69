"""cairnd's one-shot broker intents (``check-applied``, ``verify-storage``,
``start-revert``, ``delete-run``): queued, carried out by the broker at once, their
receipts kept beside the run's.

The broker carries out a run's pending intents of a verb in order and stops at the first
that fails, so a failed one-shot intent left pending would stand in front of every later
call of that verb for the run (a failed doctor check would block ``cairn revert``). Such
an intent is withdrawn when its call fails; asking again queues it anew.
"""

from __future__ import annotations

from cairn.brokerclient import call_broker
from cairn.errors import BrokerRefused, CairnError
from cairn.journal.readwrite import Journal
from cairn.protocol.broker import Intent, Receipt, Verb


def carry_out_one(journal: Journal, intent: Intent, verb: Verb, *, timeout: float) -> Receipt:
    """Queue ``intent``, have the broker carry out ``verb`` for its run and return the
    intent's receipt; on any failure the intent is withdrawn (unless a receipt says it was
    done) and the error raised."""
    run_id = intent.run_id
    journal.add_intents(run_id, [intent], token=None)
    try:
        reply = call_broker(verb, run_id, timeout=timeout)
        journal.record_receipts(run_id, [r.model_dump(mode="json") for r in reply.receipts])
        for receipt in reply.receipts:
            if receipt.intent_id == intent.intent_id:
                return receipt
        raise BrokerRefused(
            f"the broker left {intent.intent_id} of {run_id} pending",
            hint="the broker's log says why: journalctl -u 'cairn-broker@*'",
        )
    except CairnError:
        journal.withdraw_intent(run_id, intent.intent_id)
        raise
