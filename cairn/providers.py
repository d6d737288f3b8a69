"""Model providers: ``/etc/cairn/providers.toml`` and the credentials the relay adds.

The file names providers and where their keys come from; it never holds a key::

    default = "openai"                       # the route of builtin llm profiles

    [providers.openai]
    base_url = "https://api.openai.com/v1"
    model = "gpt-4.1-mini"
    credential = "cairn-provider-openai"     # a systemd credential of the coordinator
    max_tokens_per_call = 8192
    input_price_per_million = 0.40           # what a million tokens cost, for money budgets
    output_price_per_million = 1.60

    [providers.anthropic]
    api = "anthropic"                        # the API it speaks; "openai" when not said
    base_url = "https://api.anthropic.com/v1"
    model = "claude-sonnet-4-5"
    credential = "cairn-provider-anthropic"
    auth_header = "x-api-key"
    auth_scheme = ""

A key is read only by the coordinator, from ``$CREDENTIALS_DIRECTORY/<credential>``
(``LoadCredential=``/``ImportCredential=`` of ``cairn-coordinator@.service``), so it is
never in the agent's mount namespace, environment or launch description.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cairn import paths
from cairn.config import ConfigError, Problems
from cairn.errors import NotFound, PermissionDenied, ValidationFailed
from cairn.protocol.launch import ModelApi, ModelRoute

KEY_LIMIT = 16 << 10
MICROS_PER_CENT = 10_000  # money is counted in millionths of the prices' currency


PROVIDERS_FIX = (
    "a [providers.NAME] table has base_url, model and optionally api (\"openai\" or "
    "\"anthropic\"), credential, auth_header, auth_scheme, max_tokens_per_call, timeout_sec, "
    "input_price_per_million, output_price_per_million "
    "(see /usr/share/doc/cairn/docs/agents.md)"
)


class ProviderEntry(BaseModel):
    """One ``[providers.NAME]`` table."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True, strict=True)

    base_url: str
    model: str
    api: ModelApi = "openai"
    credential: str = ""
    auth_header: str = "Authorization"
    auth_scheme: str = "Bearer"
    max_tokens_per_call: int = Field(default=8192, ge=1)
    timeout_sec: float = Field(default=300.0, gt=0)
    input_price_per_million: float | None = Field(default=None, ge=0)
    output_price_per_million: float | None = Field(default=None, ge=0)


class ProvidersFile(BaseModel):
    """The whole of ``providers.toml``."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True, strict=True)

    default: str = ""
    providers: dict[str, ProviderEntry] = {}

    def route(self, name: str = "") -> ModelRoute:
        """The frozen route of provider ``name`` (the default when empty)."""
        chosen = name or self.default
        if not chosen:
            raise NotFound(
                "no model provider is configured on this host",
                hint=f'set default = "NAME" and a [providers.NAME] table in {providers_path()}',
            )
        entry = self.providers.get(chosen)
        if entry is None:
            raise NotFound(
                f"model provider {chosen!r} is not configured",
                hint=f"providers in {providers_path()}: {', '.join(sorted(self.providers))}",
            )
        try:
            return ModelRoute(provider=chosen, **entry.model_dump())
        except ValidationError as exc:  # checked when loaded; this is for one built in code
            problems = Problems()
            problems.invalid(providers_path(), exc, fix=PROVIDERS_FIX, at=("providers", chosen))
            raise ConfigError(problems.items) from exc


def providers_path() -> Path:
    return paths.config_dir() / "providers.toml"


def load_providers(
    path: Path | None = None, *, problems: Problems | None = None, text: str | None = None
) -> ProvidersFile:
    """Parse ``providers.toml``; a missing file means no providers. Every problem of the
    file is raised together as a :class:`cairn.config.ConfigError`, or, given
    ``problems``, recorded there (and no providers returned) for the caller to raise with
    the problems of the files it loads with this one. With ``text``, that is checked as
    the file's content instead of what the file holds."""
    found = Problems() if problems is None else problems
    file = path or providers_path()
    before = len(found)
    data = found.toml(file) if text is None else found.toml_text(file, text)
    loaded = None if data is None else found.model(file, ProvidersFile, data, fix=PROVIDERS_FIX)
    if loaded is not None and loaded.default and loaded.default not in loaded.providers:
        found.add(file, "default", f"default provider {loaded.default!r} has no "
                  f"[providers.{loaded.default}] table", PROVIDERS_FIX)
    tables = (data or {}).get("providers")
    for name, table in tables.items() if isinstance(tables, dict) else ():
        # what a route must be, for every table, found now rather than at its first use
        try:
            entry = ProviderEntry.model_validate(table)
        except ValidationError:
            continue  # recorded above, as part of the file
        found.model(file, ModelRoute, {**entry.model_dump(), "provider": name},
                    fix=PROVIDERS_FIX, at=("providers", name))
    if problems is None:
        found.check()
    return loaded if loaded is not None and len(found) == before else ProvidersFile()


def load_credential(route: ModelRoute, directory: str | None = None) -> str:
    """The provider key of ``route`` from the systemd credentials directory ('' if none)."""
    if not route.credential:
        return ""
    base = directory if directory is not None else os.environ.get("CREDENTIALS_DIRECTORY")
    if not base:
        raise PermissionDenied(
            f"provider {route.provider} needs credential {route.credential}, but this "
            "process has no credentials",
            hint="add LoadCredential= or ImportCredential= for it to "
            "cairn-coordinator@.service (see /usr/share/doc/cairn/docs/agents.md)",
        )
    file = Path(base) / route.credential
    try:
        raw = file.read_bytes()[: KEY_LIMIT + 1]
    except FileNotFoundError as exc:
        raise NotFound(
            f"credential {route.credential} of provider {route.provider} is missing",
            hint="see /usr/share/doc/cairn/docs/agents.md: provider keys",
        ) from exc
    if len(raw) > KEY_LIMIT:
        raise ValidationFailed(f"credential {route.credential} is larger than {KEY_LIMIT} bytes")
    key = raw.decode("utf-8", errors="replace").strip()
    if not is_key_text(key):
        raise ValidationFailed(
            f"credential {route.credential} must be one line of printable characters"
        )
    return key


def is_key_text(key: str) -> bool:
    """A provider key as the relay sends it: printable, no space, no line break."""
    return bool(key) and "\ufffd" not in key and all(0x21 <= ord(c) != 0x7F for c in key)


def unpriced(routes: Mapping[str, ModelRoute]) -> list[str]:
    """The providers among ``routes`` without both prices: no money budget can be kept
    for a run that reaches one."""
    return sorted(name for name, route in routes.items() if not route.priced)


def cost_micros(route: ModelRoute, usage: dict[str, int]) -> int:
    """What a call's ``usage`` (input, output and estimated tokens) cost at ``route``'s
    prices, rounded up; an estimate is priced as output, the dearer kind. 0 unpriced."""
    if not route.priced:
        return 0
    assert route.input_price_per_million is not None
    assert route.output_price_per_million is not None
    # A price per million tokens is the price of one token in micro-units.
    return math.ceil(
        usage.get("input", 0) * route.input_price_per_million
        + (usage.get("output", 0) + usage.get("estimated", 0)) * route.output_price_per_million
    )


def money(micros: int) -> str:
    """Micro-units as the currency's units with two decimals, rounded up (``0.01``)."""
    cents = -(-micros // MICROS_PER_CENT)
    return f"{cents // 100}.{cents % 100:02d}"


def today() -> str:
    """The local day a model call's cost counts to (YYYY-MM-DD)."""
    return time.strftime("%Y-%m-%d")
