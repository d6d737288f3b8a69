"""The host checks of ``cairn doctor``: one line each, ``ok``, ``warn`` or ``fail`` with
the fix. Which side runs which is a matter of who can see the fact: cairnd (user
``cairn``) asks systemd about the sockets, looks at the pool, verifies the sealed release
and reads ``/etc/cairn``; the CLI (the caller) checks the caller's linger and, as root,
the credential stores that only root can look into. Nothing here contacts a provider.
"""

from __future__ import annotations

import fnmatch
import os
import pwd
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from cairn import paths
from cairn.config import Problems
from cairn.errors import CairnError
from cairn.hostconfig import check_host_config
from cairn.providers import load_providers

Status = Literal["ok", "warn", "fail"]

SOCKETS = ("cairn.socket", "cairn-broker.socket")
# Free space below this refuses nothing yet; doctor fails under it and warns under twice it.
DEFAULT_RESERVE_BYTES = 1 << 30
# What cairn-coordinator@.service imports (ImportCredential=); no other name reaches it.
IMPORTED_CREDENTIALS = "cairn-provider-*"
REINSTALL = "reinstall the cairn package (apt reinstall cairn, or dnf reinstall cairn)"


def _host_root() -> Path:
    """``/`` (a temporary root in tests): the parent of ``/etc`` as :mod:`cairn.paths`
    places it. (Not in :mod:`cairn.paths`, which the root broker imports.)"""
    return paths.config_dir().parents[1]


def release_key() -> Path:
    """The key the broker verifies capsules with (``release_key_path`` of the broker)."""
    return paths.release_dir().parent / "release-key.pub"


def credential_stores() -> list[Path]:
    """Where ``ImportCredential=`` looks for a credential, plain and encrypted."""
    return [
        _host_root() / (base + suffix)
        for base in ("etc/credstore", "run/credstore", "usr/local/lib/credstore",
                     "usr/lib/credstore")
        for suffix in ("", ".encrypted")
    ]


def linger_file(user: str) -> Path:
    """Present while ``user``'s systemd manager runs without a session (linger)."""
    return _host_root() / "var/lib/systemd/linger" / user


class HostCheck(BaseModel):
    """One fact about the host: ``check`` names it, ``detail`` says what was found."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid")

    check: str
    status: Status
    detail: str
    fix: str = ""

    def line(self) -> str:
        return f"{self.status:<5} {self.check}: {self.detail}" + (
            f"; fix: {self.fix}" if self.fix else ""
        )


def _size(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


# --- cairnd's side ---------------------------------------------------------------------


def socket_checks(active_state: Callable[[str], str | None]) -> list[HostCheck]:
    """Each socket unit active; ``active_state`` asks systemd (None: no such unit)."""
    checks = []
    for unit in SOCKETS:
        state = active_state(unit)
        if state == "active":
            checks.append(HostCheck(check=unit, status="ok", detail="active"))
        else:
            checks.append(HostCheck(check=unit, status="fail", detail=state or "not loaded",
                                    fix=f"sudo systemctl enable --now {unit}"))
    return checks


def pool_checks(root: Path, reserve: int = DEFAULT_RESERVE_BYTES) -> list[HostCheck]:
    """The pool exists on Btrfs, with room above the reserve."""
    from cairn.storage import Pool  # needs btrfsutil: only cairnd's doctor loads it

    try:
        pool = Pool.open(root)
    except CairnError as exc:
        return [HostCheck(check="pool", status="fail", detail=exc.message,
                          fix=exc.hint or "run 'sudo cairn storage init --loop 8G'")]
    free = pool.free_bytes()
    status: Status = "fail" if free < reserve else "warn" if free < 2 * reserve else "ok"
    return [
        HostCheck(check="pool", status="ok", detail=f"{root} on Btrfs"),
        HostCheck(check="free space", status=status,
                  detail=f"{_size(free)} free, reserve {_size(reserve)}",
                  fix="" if status == "ok" else "delete finished runs or grow the pool"),
        file_times_check(root),
    ]


def file_times_check(root: Path) -> HostCheck:
    """The pool mounted ``noatime``: otherwise every file an agent reads gets a new
    access time, which each boundary's and each settlement's ``btrfs send`` must walk."""
    if os.statvfs(root).f_flag & os.ST_NOATIME:
        return HostCheck(check="file times", status="ok", detail="the pool is mounted noatime")
    return HostCheck(
        check="file times", status="warn",
        detail="reading a file in the pool updates its access time: each agent boundary "
        "compares every file the agent read",
        fix="mount the pool with noatime (Options=loop,noatime in var-lib-cairn-pool.mount, "
        "or in its fstab line)",
    )


def release_check(releases: Path, key: Path) -> HostCheck:
    """The installed sealed release verified as the broker verifies it before every agent
    (signature and every file's SHA-256)."""
    from cairn import capsule  # cryptography: loaded only when checking

    try:
        current = capsule.current_release(releases)
        if current is None:
            return HostCheck(check="release", status="fail",
                             detail=f"no sealed release installed ({releases}/current)",
                             fix=REINSTALL)
        manifest = capsule.verify(releases / current, capsule.load_public_key(key.read_bytes()))
    except OSError as exc:
        return HostCheck(check="release", status="fail",
                         detail=f"cannot read {exc.filename}: {exc.strerror}", fix=REINSTALL)
    except CairnError as exc:
        return HostCheck(check="release", status="fail", detail=exc.message, fix=REINSTALL)
    return HostCheck(check="release", status="ok",
                     detail=f"{current[:12]} verified ({len(manifest.files)} files signed)")


def config_check() -> HostCheck:
    """Every file of ``/etc/cairn`` as this process reads it."""
    problems = check_host_config()
    if not problems:
        return HostCheck(check="config", status="ok",
                         detail=f"every file of {paths.config_dir()} is valid")
    return HostCheck(check="config", status="fail",
                     detail=f"{len(problems)} problem(s), the first: {problems[0]}",
                     fix="run 'cairn config check' for all of them")


def provider_checks() -> tuple[list[HostCheck], dict[str, str]]:
    """The providers configured, by name only (never contacted), and the credential each
    needs (``{provider: credential}``); a credential the coordinator does not import is a
    failure. A ``providers.toml`` with problems is the config check's to report."""
    providers = load_providers(problems=Problems())
    if not providers.providers:
        return [HostCheck(check="providers", status="ok",
                          detail="none configured (llm agents need one: "
                          "/usr/share/doc/cairn/docs/agents.md)")], {}
    names = [f"{n} (default)" if n == providers.default else n for n in sorted(providers.providers)]
    checks = [HostCheck(check="providers", status="ok",
                        detail=f"{', '.join(names)}; not contacted "
                        "('sudo cairn doctor --providers' asks each)")]
    needed = {}
    for name, entry in sorted(providers.providers.items()):
        if not entry.credential:
            continue
        if not fnmatch.fnmatchcase(entry.credential, IMPORTED_CREDENTIALS):
            checks.append(HostCheck(
                check=f"credential of {name}", status="fail",
                detail=f"{entry.credential} never reaches the coordinator, which imports "
                f"only {IMPORTED_CREDENTIALS}",
                fix=f'set credential = "cairn-provider-{name}" in providers.toml'))
            continue
        needed[name] = entry.credential
    return checks, needed


# --- the CLI's side --------------------------------------------------------------------


def credential_checks(needed: dict[str, str], stores: Sequence[Path]) -> list[HostCheck]:
    """Each needed credential present in a credential store (looked up by name; the key is
    never read). Only root can look into the stores."""
    checks = []
    for provider, credential in sorted(needed.items()):
        check = f"credential of {provider}"
        try:
            found = _stored(stores, credential)
        except PermissionError:
            checks.append(HostCheck(
                check=check, status="warn",
                detail=f"{credential}: only root can look into the credential stores",
                fix="run 'sudo cairn doctor'"))
            continue
        if found is None:
            checks.append(HostCheck(
                check=check, status="fail",
                detail=f"{credential} is in no credential store ({', '.join(map(str, stores))})",
                fix=f"systemd-creds encrypt --name={credential} KEYFILE "
                f"/etc/credstore.encrypted/{credential} (/usr/share/doc/cairn/docs/agents.md)"))
        else:
            checks.append(HostCheck(check=check, status="ok", detail=str(found)))
    return checks


def _stored(stores: Sequence[Path], name: str) -> Path | None:
    """The first store holding a file ``name``; PermissionError when a store that exists
    cannot be looked into."""
    for store in stores:
        try:
            if stat.S_ISREG(os.stat(store / name).st_mode):
                return store / name
        except (FileNotFoundError, NotADirectoryError):
            continue
    return None


def linger_check(schedules: int, uid: int | None = None) -> HostCheck:
    """A user with schedules needs linger, or their timers stop when they log out."""
    user = pwd.getpwuid(os.getuid() if uid is None else uid).pw_name
    if not schedules:
        return HostCheck(check="linger", status="ok", detail=f"{user} has no schedules")
    if linger_file(user).exists():
        return HostCheck(check="linger", status="ok",
                         detail=f"enabled for {user} ({schedules} schedule(s))")
    return HostCheck(check="linger", status="fail",
                     detail=f"{user} has {schedules} schedule(s), whose timers fire only while "
                     f"{user} is logged in",
                     fix=f"sudo loginctl enable-linger {user}")
