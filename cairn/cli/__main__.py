"""``python -m cairn.cli``: the ``cairn`` command."""

from cairn.cli import main

main()
