"""Every configuration file of the host (``/etc/cairn``) checked at once, each by the
loader that reads it for real: ``providers.toml`` (:mod:`cairn.providers`),
``policy.toml`` (:mod:`cairn.policy`), ``schedules.toml`` (:mod:`cairn.schedules`),
``admission.toml`` (:mod:`cairn.admission`) and
every agent profile in ``profiles.d/`` (read here, for launches too). ``cairn config
check`` runs it as the caller; ``cairn doctor`` has cairnd run it as the user ``cairn``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from cairn import paths
from cairn.admission import admission_config
from cairn.config import Problem, Problems
from cairn.policy import load_policy
from cairn.protocol.launch import ProfileSpec
from cairn.protocol.names import profile_file_stem
from cairn.providers import load_providers, unpriced
from cairn.schedules import host_config

PROFILE_FIX = (
    "a profile has kind (command, llm or scripted) and, as its kind needs, argv, provider, "
    "system_prompt, max_steps, max_corrections, bash_timeout_sec, tool_output_limit "
    "(see /usr/share/doc/cairn/docs/agents.md and /usr/share/doc/cairn/examples/profiles.d)"
)
KNOWN_FILES = ("providers.toml", "policy.toml", "schedules.toml", "admission.toml")
UNKNOWN_FIX = (
    f"Cairn reads {', '.join(KNOWN_FILES)} and profiles.d/*.toml here; rename or remove it"
)


def profiles_dir() -> Path:
    return paths.config_dir() / "profiles.d"


def profile_file(name: str) -> Path:
    """Where the host's profile ``name`` lives (``:`` is ``-`` in the file name)."""
    return profiles_dir() / f"{profile_file_stem(name)}.toml"


def check_profile(
    problems: Problems, file: Path, data: Mapping[str, object], name: str
) -> ProfileSpec | None:
    """The table read from ``file`` as profile ``name``, or None with its problems
    recorded; a command profile's files (``NAME.d/``) must be a directory only root can
    write, as the broker requires before it gives them to an agent."""
    profile = problems.model(file, ProfileSpec, {**data, "name": name}, fix=PROFILE_FIX)
    if profile is not None and profile.kind == "command":
        directory = paths.profile_files_dir(name)
        try:
            st = os.lstat(directory)
        except FileNotFoundError:
            return profile
        except OSError as exc:
            problems.add(directory, "", f"cannot be read: {exc.strerror}")
            return None
        if not stat.S_ISDIR(st.st_mode) or not paths.only_root_writes(st):
            problems.add(directory, "", "not a directory that only root can write",
                         fix="make it a directory owned by root with mode 0755, or remove it")
            return None
    return profile


def check_host_config() -> list[Problem]:
    """Every problem of every configuration file in ``/etc/cairn``, in file order; an
    empty list when all of them (or their absence: the defaults) are fine."""
    found = Problems()
    providers = load_providers(problems=found)
    load_policy(problems=found)
    host_config(problems=found)
    daily = admission_config(problems=found).max_daily_cost_cents_per_user
    missing = unpriced({name: providers.route(name) for name in providers.providers})
    if daily is not None and missing:
        found.add(
            paths.config_dir() / "admission.toml", "max_daily_cost_cents_per_user",
            f"a daily money budget cannot be kept for provider {', '.join(missing)}: it has "
            "no prices, so every launch that uses it is refused",
            f"set input_price_per_million and output_price_per_million in "
            f"{paths.config_dir() / 'providers.toml'}",
        )
    for file in sorted(profiles_dir().glob("*.toml")):
        data = found.toml(file)
        if data is not None:
            check_profile(found, file, data, file.stem)
    for file in sorted(paths.config_dir().glob("*.toml")):
        if file.name not in KNOWN_FILES:
            found.add(file, "", "not a file Cairn reads", UNKNOWN_FIX)
    return found.items
