"""The wire protocols, one module per boundary: ``launch`` (the launch description),
``broker``, ``daemon``, ``control`` (the control worker's pipe) and ``agent``, over
``base``. They import only the standard library, pydantic, cairn.errors and cairn.canonical
(.importlinter), so a process loads just the protocols it speaks."""
