"""A person's own workflow definitions, as the ``cairn`` command keeps them (runs as that
person; cairnd never reads these files).

- ``builtin:NAME`` ships with Cairn (:mod:`cairn.definitions.builtin`);
- ``user:NAME`` is installed into ``$XDG_CONFIG_HOME/cairn/workflows/`` only with the review
  hash a person confirmed (:mod:`cairn.definitions.user`), drafts beside it are inert;
- ``project:NAME`` is ``PROJECT/.cairn/workflows/NAME.py``, usable only while its review hash
  is the one recorded when the person trusted that project (:mod:`cairn.definitions.trust`);
- the registry says which of them models may start (:mod:`cairn.definitions.registry`).

:mod:`cairn.definitions.resolve` turns a name into the source and hash ``cairn launch``
sends; cairnd reviews that source again and refuses it unless the hashes agree.
"""
