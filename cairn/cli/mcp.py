"""``cairn mcp``: the Model Context Protocol server on stdio (:mod:`cairn.mcp`), talking
to cairnd through this CLI's own client, as the user who started it."""


import logging
import sys
import time
from pathlib import Path

import click

from cairn.cli.client import request
from cairn.cli.options import add_commands


def register(app: click.Group) -> None:
    """Add ``cairn mcp`` to ``app`` (the main ``cairn`` app)."""
    add_commands(app, mcp)


def mcp() -> None:
    """Serve the Model Context Protocol on stdin/stdout for an agent harness: your exposed
    workflows as tools, and your runs, inbox and answers
    (/usr/share/doc/cairn/docs/mcp.md). Nothing it offers approves or applies.

    Example: cairn mcp
    """
    # here, not at the top: every cairn command would pay for these imports
    from importlib import metadata

    from cairn.mcp.server import Server
    from cairn.mcp.tools import Session
    from cairn.protocol.daemon import build_models

    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="cairn mcp: %(message)s")
    try:
        version = metadata.version("cairn")
    except metadata.PackageNotFoundError:
        version = "unknown"
    build_models()  # before the calls' threads use one
    session = Session(request=request, cwd=Path.cwd(), clock=time.monotonic, pause=time.sleep)
    Server(sys.stdout.buffer, session, version).serve(sys.stdin.buffer)
