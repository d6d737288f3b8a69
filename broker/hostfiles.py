"""What root executes comes from ``/etc/cairn``, by name (ARCHITECTURE §7).

A command profile, verifier or evaluator is frozen in the launch description with its name
and the sha256 of its file's bytes. Before root runs one (or starts an agent that runs
one), it reads that file itself — root-owned, writable by no one else, a regular file
reached without a link — requires the same hash, and requires the frozen argv,
environment and limits to be what the file says. A command profile's files
(``profiles.d/NAME.d/``, configuration its CLI reads) are given to its agent read-only only
from a directory that only root can write. A description cannot make root run a
command the administrator did not write.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tomllib
from collections.abc import Mapping
from pathlib import Path

from cairn import paths
from cairn.errors import BrokerRefused
from cairn.protocol.launch import EvaluatorSpec, ProfileSpec, VerifierSpec
from cairn.protocol.names import is_profile_name, profile_file_stem

CONFIG_LIMIT = 64 << 10
# The defaults of an evaluator file's counts (cairn/evaluators.py EvaluatorConfig; a unit
# test keeps them equal: the broker does not load the host-config models).
EVALUATOR_DEFAULTS = {"warmups": 0, "samples": 1}


def read_table(directory: str, name: str, frozen_sha256: str) -> dict[str, object]:
    """The TOML table of ``/etc/cairn/<directory>/<name>.toml`` if its bytes still hash to
    ``frozen_sha256``."""
    file = paths.config_dir() / directory / f"{profile_file_stem(name)}.toml"
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise BrokerRefused(f"{file} cannot be read: {exc.strerror}",
                            hint="it was frozen at launch; launch the run again") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not paths.only_root_writes(st):
            raise BrokerRefused(f"{file} is not a regular file that only root can write")
        raw = os.read(fd, CONFIG_LIMIT + 1)
    finally:
        os.close(fd)
    if len(raw) > CONFIG_LIMIT:
        raise BrokerRefused(f"{file} is larger than {CONFIG_LIMIT} bytes")
    if "sha256:" + hashlib.sha256(raw).hexdigest() != frozen_sha256:
        raise BrokerRefused(
            f"{file} changed since the run was launched; root runs only what it froze",
            hint="launch the run again to use the new configuration",
        )
    try:
        return tomllib.loads(raw.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise BrokerRefused(f"{file} is not a valid TOML file: {exc}") from exc


def _require_same(
    what: str, frozen: Mapping[str, object], configured: Mapping[str, object]
) -> None:
    differ = sorted(k for k in frozen if frozen[k] != configured.get(k))
    if differ:
        raise BrokerRefused(
            f"{what} in the run's description is not what /etc/cairn says: "
            f"{', '.join(differ)} differ"
        )


def check_verifier(spec: VerifierSpec) -> None:
    data = read_table("verifiers.d", spec.name, spec.config_sha256)
    _require_same(
        f"verifier {spec.name}",
        {"argv": spec.argv, "timeout_sec": spec.timeout_sec, "environment": spec.environment},
        {**data, "environment": data.get("environment", {})},
    )


def check_evaluator(spec: EvaluatorSpec) -> None:
    data = read_table("evaluators.d", spec.name, spec.config_sha256)
    allowlist = data.get("allowlist") if data.get("network") == "allowlist" else None
    _require_same(
        f"evaluator {spec.name}",
        {"argv": spec.argv, "timeout_sec": spec.timeout_sec, "environment": spec.environment,
         "warmups": spec.warmups, "samples": spec.samples, "allowlist": spec.allowlist},
        {**EVALUATOR_DEFAULTS, **data, "environment": data.get("environment", {}),
         "allowlist": [e.lower() for e in allowlist if isinstance(e, str)]
         if isinstance(allowlist, list) else None},
    )


def check_profile(profile: ProfileSpec) -> Path | None:
    """A command profile's argv and env are its /etc file's; other kinds run no host
    command. Returns the profile's files to give its agent (:func:`profile_files`)."""
    if profile.kind != "command":
        return None
    if not profile.config_sha256:
        raise BrokerRefused(f"command profile {profile.name} was frozen without its file")
    if not is_profile_name(profile.name):
        raise BrokerRefused(f"{profile.name!r} is not a profile name")
    data = read_table("profiles.d", profile.name, profile.config_sha256)
    _require_same(f"command profile {profile.name}",
                  {"kind": profile.kind, "argv": profile.argv, "env": profile.env},
                  {**data, "env": data.get("env", {})})
    return profile_files(profile.name)


def profile_files(name: str) -> Path | None:
    """``/etc/cairn/profiles.d/NAME.d`` if the administrator made it: a directory (not a
    link) that only root can write, whose files the agent's worker copies into the
    agent's home. None if there is none."""
    directory = paths.profile_files_dir(name)
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BrokerRefused(f"{directory} cannot be read: {exc.strerror}") from exc
    if not stat.S_ISDIR(st.st_mode) or not paths.only_root_writes(st):
        raise BrokerRefused(
            f"{directory} is not a directory that only root can write",
            hint="make it a directory owned by root with mode 0755, or remove it",
        )
    return directory
