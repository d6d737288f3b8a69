"""Bounds both sides of the settlement protocol share, as plain constants: the owner's
candidate unit uses them without loading pydantic (see ``settlement``)."""

MAX_PATHS = 1_000_000
DIFF_LIMIT = 256 << 10
TEXT_LIMIT = 4096  # a path, a reason, a message or a hint
TRIAL_REFUSED_SHOWN = 20  # the refused changes a trial's check names (all are counted)
