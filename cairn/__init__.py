"""Cairn: reviewed, durable AI-agent workflows on systemd and Btrfs."""

import os

__version__ = "0.1.0"

# pydantic 2.10 (Debian 13's) checks each schema it generates for a model against its own
# schema of schemas, which it builds at the first model: 15-20 ms of every Cairn process's
# start, for a check of pydantic's own work (not of any data) that pydantic 2.11 dropped.
# Here, because every Cairn process imports this package before it builds a model.
SKIP_SCHEMA_SELF_CHECK = "PYDANTIC_SKIP_VALIDATING_CORE_SCHEMAS"
os.environ.setdefault(SKIP_SCHEMA_SELF_CHECK, "1")
