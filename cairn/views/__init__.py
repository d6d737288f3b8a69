"""What people see of a run, rebuilt from one read snapshot of the journal.

- :mod:`~cairn.views.run`: the ``cairn show`` view and its facets (worklists, the open
  question), bounded events, the latest event and replay divergence;
- :mod:`~cairn.views.integrity`: contradictions among the records, reported instead of
  papered over.

cairnd (``daemon/views.py``) decides who may see a run and opens the snapshot.
"""
