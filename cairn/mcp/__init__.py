"""``cairn mcp``: a Model Context Protocol server on stdio for agent harnesses.

:mod:`~cairn.mcp.server` reads and answers the JSON-RPC messages
(:mod:`cairn.protocol.mcp`); :mod:`~cairn.mcp.tools` is what each tool does, always as a
request to cairnd as the user who started the server."""
