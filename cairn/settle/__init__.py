"""Proposal settlement (ARCHITECTURE §9): the candidate C and the three-way live apply.

The modules, each imported by its own name (this package re-exports nothing):
:mod:`~cairn.settle.changes` reads the change set of Q and P from a ``btrfs send``
stream; :mod:`~cairn.settle.candidate` copies into C (a writable snapshot of Q) only the
changes of P that host policy (:mod:`~cairn.settle.paths`) allows, each whole with what
depends on it (:mod:`~cairn.settle.deps`); :mod:`~cairn.settle.apply` writes F into the
live project over the link-free tree walk of :mod:`~cairn.settle.walk` (live == Q →
write F; live == F → already applied; anything else → conflict, and then nothing is
written at all); :mod:`~cairn.settle.diff` renders what was settled,
:mod:`~cairn.settle.outcome` labels it, and :mod:`~cairn.settle.inventory` confirms an
empty change set.
"""
