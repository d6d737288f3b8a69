"""Cairn: reviewed, durable AI-agent workflows on systemd and Btrfs."""

__version__ = "0.1.0"
