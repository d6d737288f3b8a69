"""Where the calling user's own files live: the ``cairn`` command's side, as that user. No
system process (cairnd, the broker) reads them; host paths are :mod:`cairn.paths`."""

from __future__ import annotations

import os
import pwd
from pathlib import Path


def config_home() -> Path:
    """The user's configuration directory: ``$XDG_CONFIG_HOME`` when it is an absolute
    path, otherwise ``~/.config`` of the account (not of ``$HOME``)."""
    config = os.environ.get("XDG_CONFIG_HOME", "")
    if os.path.isabs(config):
        return Path(config)
    return Path(pwd.getpwuid(os.getuid()).pw_dir) / ".config"


def cairn_dir() -> Path:
    """The user's own Cairn files: drafts, ``user:`` definitions, trusted projects and
    the model registry (:mod:`cairn.definitions`)."""
    return config_home() / "cairn"
