"""The workflows and agent profiles that ship with Cairn (``builtin:NAME``); their names
and sources are read by :mod:`cairn.definitions.builtin`."""
