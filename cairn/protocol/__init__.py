"""The wire protocols of cairn, one module per boundary.

- :mod:`.launch`: the launch description a run is recovered from (daemon → journal →
  coordinator, broker).
- :mod:`.broker`: intents, receipts and the broker's reply (daemon/coordinator ⇄ root broker).
- :mod:`.daemon`: requests and replies on cairnd's socket (CLI ⇄ daemon).
- :mod:`.control`: the control worker's pipe (control worker ⇄ coordinator or upgrade).
- :mod:`.agent`: the agent socket and ``boundary.json`` (agent worker ⇄ coordinator).
- :mod:`.base`: the frozen base model and the identifier patterns they share.

These modules import only the standard library, pydantic, :mod:`cairn.errors` and
:mod:`cairn.canonical` (checked by ``.importlinter``), so any process may load the one it
speaks without pulling in the rest of cairn. This package's ``__init__`` imports nothing.
"""
