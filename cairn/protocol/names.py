"""The identifiers the protocols check: run, scope, operation, lane, intent, verifier,
evaluator, agent profile, hash and run key. Each has a pattern (``*_PATTERN``), which the protocol
models type their fields with (:mod:`cairn.protocol.base`). Those that code checks outside
a model also have a check of the whole string (``is_*``) that needs no regular expression:
``cairn launch`` imports this module, and ``re`` would cost each launch 6 ms of CPU. A
check accepts exactly what its pattern does (a test holds the two to each other); unlike
``re.match`` on a ``$`` pattern, it refuses a trailing newline."""

from __future__ import annotations

TYPE_CHECKING = False  # typing is for type checkers only: `cairn launch` imports this
if TYPE_CHECKING:
    from typing import TypeGuard

RUN_ID_PATTERN = r"^flow_[0-9a-f]{32}$"
# Lane scopes are named after their fork and key ("root-2-a"), so nesting lengthens them.
SCOPE_PATTERN = r"^[a-z0-9][a-z0-9-]{0,119}$"
OP_ID_PATTERN = r"^[a-z0-9][a-z0-9-]{0,127}$"
LANE_KEY_PATTERN = r"^[a-z0-9][a-z0-9-]{0,30}$"
INTENT_ID_PATTERN = r"^[a-z0-9][a-z0-9.-]{0,80}$"
VERIFIER_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
# An agent profile: ``builtin:NAME`` or the stem of /etc/cairn/profiles.d/NAME.toml (where
# ``:`` is written ``-``); never a path.
PROFILE_NAME_PATTERN = r"^[a-z0-9][a-z0-9:_-]{0,79}$"
# A model provider's name: a [providers.NAME] table of /etc/cairn/providers.toml.
PROVIDER_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,40}$"
# A launch, review or definition hash: the hex SHA-256 of canonical JSON, named.
HASH_PATTERN = r"^sha256:[0-9a-f]{64}$"
# A caller's name for a run (``cairn launch --run-key``): a date, a ticket, a commit.
RUN_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$"
# The longest path of an artifact below /outputs/artifacts that is collected (characters).
ARTIFACT_PATH_MAX = 1024

_HEX = frozenset("0123456789abcdef")
_FIRST = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")


def _name(text: object, rest: frozenset[str], longest: int) -> TypeGuard[str]:
    """``text`` is a str of 1 to ``longest`` characters: a lowercase letter or digit, then
    characters of ``rest``."""
    return (
        isinstance(text, str)
        and 0 < len(text) <= longest
        and text[0] in _FIRST
        and rest.issuperset(text)
    )


_DASHED = _FIRST | {"-"}
_UNDERSCORED = _DASHED | {"_"}
_PROFILE = _UNDERSCORED | {":"}


def is_run_id(text: object) -> TypeGuard[str]:
    """A run ID: ``flow_`` and 32 lowercase hex digits (:data:`RUN_ID_PATTERN`)."""
    return (
        isinstance(text, str)
        and len(text) == 37
        and text.startswith("flow_")
        and _HEX.issuperset(text[5:])
    )


def is_hash(text: object) -> TypeGuard[str]:
    """A hash as Cairn names one: ``sha256:`` and 64 lowercase hex digits
    (:data:`HASH_PATTERN`)."""
    return (
        isinstance(text, str)
        and len(text) == 71
        and text.startswith("sha256:")
        and _HEX.issuperset(text[7:])
    )


def is_op_id(text: object) -> TypeGuard[str]:
    """An operation ID: :data:`OP_ID_PATTERN`."""
    return _name(text, _DASHED, 128)


def is_lane_key(text: object) -> TypeGuard[str]:
    """A lane's key: :data:`LANE_KEY_PATTERN`."""
    return _name(text, _DASHED, 31)


def is_verifier_name(text: object) -> TypeGuard[str]:
    """A verifier's or evaluator's name: :data:`VERIFIER_NAME_PATTERN`."""
    return _name(text, _UNDERSCORED, 64)


def is_profile_name(text: object) -> TypeGuard[str]:
    """An agent profile's name: :data:`PROFILE_NAME_PATTERN`."""
    return _name(text, _PROFILE, 80)


def is_provider_name(text: object) -> TypeGuard[str]:
    """A model provider's name: :data:`PROVIDER_NAME_PATTERN`."""
    return _name(text, _UNDERSCORED, 41)


def profile_file_stem(name: str) -> str:
    """The stem of a profile's files in /etc/cairn/profiles.d (``NAME.toml``,
    ``NAME.d/``): ``:`` is written ``-``."""
    return name.replace(":", "-")
