"""Where things live on a host. Every process derives its paths from here.

``CAIRN_ROOT`` (tests only) prefixes every absolute path, so a test can lay a whole host
layout under a temporary directory; production never sets it.
"""

from __future__ import annotations

import os

from cairn.protocol.names import profile_file_stem

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

RUNTIME_DIR = "run/cairn"


def _root() -> str:
    return os.environ.get("CAIRN_ROOT", "/")


def _p(rel: str) -> Path:
    # pathlib when first asked for a path: a `cairn launch` needs only daemon_address()
    from pathlib import Path

    return Path(_root()) / rel


def state_dir() -> Path:
    """/var/lib/cairn: journal, broker receipts, pool, per-run coordinator state."""
    return _p("var/lib/cairn")


def journal_path() -> Path:
    """The SQLite journal (owned by the ``cairn`` user; the broker reads it as root)."""
    return state_dir() / "journal" / "journal.db"


def broker_db_path() -> Path:
    """The broker's own receipts (root-owned, readable by group ``cairn``)."""
    return state_dir() / "broker" / "receipts.db"


def pool_dir() -> Path:
    """The default storage pool (a Btrfs filesystem or a directory on one)."""
    return state_dir() / "pool"


def run_state_dir(run_id: str) -> Path:
    """Coordinator-owned per-run files: boundaries, agent results, settlement outputs."""
    return state_dir() / "runs" / run_id


def runtime_dir() -> Path:
    """/run/cairn: sockets and runtime flags."""
    return _p(RUNTIME_DIR)


def egress_socket(run_id: str) -> Path:
    """The run's way out to its model providers (``cairn-egress@<run>.service``)."""
    return runtime_dir() / "egress" / run_id / "egress.sock"


def egress_skipped_dir() -> Path:
    """Root's flags, one per run without model providers: its ``cairn-egress@`` skips."""
    return runtime_dir() / "egress-skipped"


def daemon_socket() -> Path:
    """cairnd's socket, where :func:`daemon_address` says."""
    from pathlib import Path

    return Path(daemon_address())


def daemon_address() -> str:
    """cairnd's socket as the string a client connects to, made without pathlib (which
    costs a ``cairn`` start 3-8 ms of CPU to import)."""
    return os.path.join(_root(), RUNTIME_DIR, "cairnd.sock")


def broker_socket() -> Path:
    return runtime_dir() / "broker.sock"


def agent_socket_dir(run_id: str) -> Path:
    """Host side of agent sockets for one run; each is bound to /run/cairn/agent.sock."""
    return runtime_dir() / "agents" / run_id


def agent_channel_dir(run_id: str, op_id: str) -> Path:
    """Host directory of one agent operation's sockets, bound at /run/cairn/agent."""
    return agent_socket_dir(run_id) / op_id


def agent_socket_path(run_id: str, op_id: str) -> Path:
    return agent_channel_dir(run_id, op_id) / "agent.sock"


def model_socket_path(run_id: str, op_id: str) -> Path:
    """Host path of one agent operation's model relay socket (beside its agent socket)."""
    return agent_channel_dir(run_id, op_id) / "model.sock"


def config_dir() -> Path:
    """/etc/cairn: policy, providers, profiles, schedule limits (read by cairn.config)."""
    return _p("etc/cairn")


def profile_files_dir(name: str) -> Path:
    """/etc/cairn/profiles.d/NAME.d: a command profile's files, which its agents get as
    their home's starting content (``:`` of the name is ``-``)."""
    return config_dir() / "profiles.d" / f"{profile_file_stem(name)}.d"


def only_root_writes(st: os.stat_result) -> bool:
    """Whether a file in /etc/cairn, as ``lstat``/``fstat`` saw it, is one that root alone
    can change: owned by root, writable by neither group nor others."""
    return st.st_uid == 0 and not st.st_mode & 0o022


def release_dir() -> Path:
    """Installed sealed releases (read-only capsules)."""
    return _p("usr/lib/cairn/releases")
