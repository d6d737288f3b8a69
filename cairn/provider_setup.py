"""Adding and removing a model provider on this host, as ``cairn provider add`` and
``cairn provider rm`` do it for root: a ``[providers.NAME]`` table in
``/etc/cairn/providers.toml`` and the key as the encrypted systemd credential
``cairn-provider-NAME`` in ``/etc/credstore.encrypted/``, which the coordinator's
``ImportCredential=cairn-provider-*`` finds.

The file is edited as text: an administrator's comments and layout stay, a new table goes
at the end, ``default = …`` is the one top-level line changed. Every edit is parsed and
checked as a whole before it replaces the file, so a command never leaves a file a launch
would refuse.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from cairn import fsutil, proc
from cairn.errors import NotFound, UsageError, ValidationFailed
from cairn.hostcheck import credential_stores
from cairn.protocol.launch import ModelApi, ModelRoute
from cairn.providers import (
    KEY_LIMIT,
    ProviderEntry,
    ProvidersFile,
    is_key_text,
    load_providers,
    providers_path,
)
from cairn.terminal import printable

# The probe's unit (`cairn provider test`): the coordinator's user and credentials, a
# sandbox, and network (the coordinator reaches providers through its run's egress unit).
PROBE_PROPERTIES = (
    "User=cairn",
    "Group=cairn",
    "ImportCredential=cairn-provider-*",
    "ProtectSystem=strict",
    "ProtectHome=yes",
    "PrivateTmp=yes",
    "PrivateDevices=yes",
    "NoNewPrivileges=yes",
    "CapabilityBoundingSet=",
    "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
)
# The most root reads of what the probe (user cairn) prints: its answer is one line.
PROBE_OUTPUT_LIMIT = 64 * 1024
# What `provider add` writes for these ProviderEntry fields when they differ from their
# defaults (base_url, model, api and credential are always written).
_OPTIONAL = ("auth_header", "auth_scheme", "max_tokens_per_call", "timeout_sec",
             "input_price_per_million", "output_price_per_million")


def credential_name(provider: str) -> str:
    return f"cairn-provider-{provider}"


@dataclass(frozen=True)
class NewProvider:
    """What ``cairn provider add`` was told."""

    name: str
    base_url: str
    model: str
    api: ModelApi = "openai"
    keyed: bool = True
    auth_header: str = ""  # "": the API's own header
    auth_scheme: str | None = None  # None: the API's own scheme
    max_tokens_per_call: int = 8192
    timeout_sec: float = 300.0
    input_price_per_million: float | None = None
    output_price_per_million: float | None = None

    def entry(self) -> ProviderEntry:
        """The table's values, checked as a launch would freeze them."""
        header = self.auth_header or ("x-api-key" if self.api == "anthropic" else "Authorization")
        scheme = self.auth_scheme
        if scheme is None:
            scheme = "" if self.api == "anthropic" else "Bearer"
        values = {
            "base_url": self.base_url,
            "model": self.model,
            "api": self.api,
            "credential": credential_name(self.name) if self.keyed else "",
            "auth_header": header,
            "auth_scheme": scheme,
            "max_tokens_per_call": self.max_tokens_per_call,
            "timeout_sec": float(self.timeout_sec),
            **{key: float(price) for key, price in (
                ("input_price_per_million", self.input_price_per_million),
                ("output_price_per_million", self.output_price_per_million),
            ) if price is not None},
        }
        try:
            ModelRoute.model_validate({**values, "provider": self.name})
            return ProviderEntry.model_validate(values)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "provider"
            raise UsageError(
                f"{where}: {first['msg']}",
                hint="a name is lower-case letters, digits, - and _; a base URL is "
                "http:// or https:// with a host, e.g. http://127.0.0.1:8080/v1",
            ) from None


def toml_string(value: str) -> str:
    """``value`` as a TOML basic string."""
    out = ['"']
    for char in value:
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def table_text(name: str, entry: ProviderEntry) -> str:
    """The ``[providers.NAME]`` table for ``entry``: the four keys every provider has,
    then those that differ from their defaults."""
    lines = [
        f"[providers.{name}]",
        f"api = {toml_string(entry.api)}",
        f"base_url = {toml_string(entry.base_url)}",
        f"model = {toml_string(entry.model)}",
        f"credential = {toml_string(entry.credential)}",
    ]
    defaults = ProviderEntry(base_url="-", model="-")
    for key in _OPTIONAL:
        value = getattr(entry, key)
        if value != getattr(defaults, key):
            lines.append(f"{key} = {toml_string(value) if isinstance(value, str) else value}")
    return "\n".join(lines) + "\n"


def parsed(text: str, file: Path) -> ProvidersFile:
    """``text`` as the whole providers file ``file``, checked as a launch reads it; a
    :class:`cairn.config.ConfigError` naming every problem otherwise."""
    return load_providers(file, text=text)


def _first_table(lines: list[str]) -> int:
    """The index of the first table header (the end of the top-level keys)."""
    for index, line in enumerate(lines):
        if line.lstrip().startswith("["):
            return index
    return len(lines)


def with_default(text: str, name: str) -> str:
    """``text`` with ``default = "NAME"``: the top-level ``default`` line replaced, or one
    added before the first table."""
    lines = text.splitlines(keepends=True)
    top = _first_table(lines)
    line = f"default = {toml_string(name)}\n"
    for index in range(top):
        key = lines[index].split("=", 1)[0].strip()
        if "=" in lines[index] and key == "default":
            lines[index] = line
            return "".join(lines)
    lines.insert(top, line + ("\n" if top < len(lines) else ""))
    return "".join(lines)


def with_provider(text: str, new: NewProvider, *, make_default: bool, file: Path) -> str:
    """``text`` with the table of ``new`` added at the end, and the default set to it when
    asked or when the file names no default yet."""
    current = parsed(text, file)
    if new.name in current.providers:
        raise UsageError(
            f"provider {new.name!r} is already in {file}",
            hint=f"'cairn provider rm {new.name}' removes it and its key first",
        )
    body = text if not text or text.endswith("\n") else text + "\n"
    result = body + ("\n" if body.strip() else "") + table_text(new.name, new.entry())
    if make_default or not current.default:
        result = with_default(result, new.name)
    parsed(result, file)
    return result


def without_provider(text: str, name: str, *, file: Path) -> str:
    """``text`` without the ``[providers.NAME]`` table (from its header to the next table),
    and without ``default`` when it named that provider."""
    current = parsed(text, file)
    if name not in current.providers:
        raise NotFound(
            f"provider {name!r} is not in {file}",
            hint="'cairn provider list' shows the providers of this host",
        )
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if _is_header_of(line, name)), None)
    if start is None:
        raise UsageError(
            f"provider {name!r} is not written as a [providers.{name}] table in {file}",
            hint="edit the file by hand",
        )
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")),
        len(lines),
    )
    # the comments right above the next table are that table's
    while end < len(lines) and end > start + 1 and lines[end - 1].lstrip()[:1] in ("#", ""):
        end -= 1
    kept = lines[:start] + lines[end:]
    if current.default == name:
        top = _first_table(kept)
        kept = [
            line for index, line in enumerate(kept)
            if index >= top or "=" not in line or line.split("=", 1)[0].strip() != "default"
        ]
    result = "".join(kept).rstrip("\n") + "\n" if "".join(kept).strip() else ""
    if name in parsed(result, file).providers:
        raise UsageError(
            f"provider {name!r} is also defined outside its table in {file}",
            hint="edit the file by hand",
        )
    return result


def _is_header_of(line: str, name: str) -> bool:
    code = line.split("#", 1)[0].strip()
    if not (code.startswith("[") and code.endswith("]")) or code.startswith("[["):
        return False
    parts = [part.strip().strip('"') for part in code[1:-1].split(".")]
    return parts == ["providers", name]


def read_text(file: Path) -> str:
    """The providers file's text ('' when there is none)."""
    try:
        return file.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""
    except UnicodeDecodeError:
        raise ValidationFailed(f"{file} is not UTF-8 text", hint="fix it or move it away") from None


def write_text(file: Path, text: str) -> None:
    """Replace the providers file (0644: it names no key)."""
    file.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    fsutil.write_atomic(file, text, mode=0o644)


def checked_key(key: str, credential: str) -> str:
    """``key`` as the coordinator will accept it (:func:`cairn.providers.load_credential`)."""
    key = key.strip()
    if not key:
        raise UsageError(
            "the key is empty",
            hint="pass the provider's key on standard input, or --no-key for a provider "
            "that takes none",
        )
    if len(key.encode()) > KEY_LIMIT or not is_key_text(key):
        raise UsageError(
            f"the key for {credential} must be one line of printable characters, at most "
            f"{KEY_LIMIT} bytes",
            hint="pass only the key on standard input",
        )
    return key


def etc_stores() -> tuple[Path, Path]:
    """/etc's encrypted and plain credential stores: where ``provider add`` puts a key,
    and what ``provider rm`` cleans."""
    etc = providers_path().parents[1]
    return etc / "credstore.encrypted", etc / "credstore"


def key_state(credential: str) -> str:
    """Where the key named ``credential`` is: ``encrypted`` or ``stored`` (plain) in a
    credential store ImportCredential= searches, ``missing``, ``none`` for a provider
    without a key, or ``unknown`` when the caller may not look (not root)."""
    if not credential:
        return "none"
    unknown = False
    for store in credential_stores():
        try:
            if (store / credential).exists():
                return "encrypted" if store.name.endswith(".encrypted") else "stored"
        except PermissionError:
            unknown = True
    return "unknown" if unknown else "missing"


def existing_keys(credential: str) -> list[Path]:
    """The files in /etc's credential stores named ``credential``."""
    return [store / credential for store in etc_stores() if (store / credential).exists()]


def store_key(credential: str, key: str) -> Path:
    """Encrypt ``key`` with the host's credential key (and the TPM where there is one) as
    ``/etc/credstore.encrypted/CREDENTIAL``, mode 0600; return its path."""
    encrypted = etc_stores()[0]
    encrypted.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = encrypted / credential
    staged = encrypted / f".{credential}.new"
    staged.unlink(missing_ok=True)
    try:
        proc.run(
            ["systemd-creds", "encrypt", f"--name={credential}", "-", staged],
            input=key.encode(),
        )
        os.chmod(staged, 0o600)
        os.replace(staged, target)
    finally:
        staged.unlink(missing_ok=True)
    fsutil.fsync_dir(encrypted)
    return target


def remove_keys(credential: str) -> list[Path]:
    """Delete ``credential`` from /etc's credential stores; return what went."""
    gone = existing_keys(credential)
    for path in gone:
        path.unlink()
    return gone


def probe_provider(name: str) -> tuple[bool, str]:
    """Run :mod:`cairn.coordinator.probe` for provider ``name`` in a transient unit (root):
    whether the provider answered, and the probe's one line (escaped: the unit runs as
    ``cairn`` and quotes the provider), or why the probe did not run."""
    import sys

    argv = ["systemd-run", "--quiet", "--wait", "--pipe", "--collect",
            "--service-type=exec", f"--unit=cairn-provider-test-{name}"]
    argv += [f"--property={prop}" for prop in PROBE_PROPERTIES]
    argv += [sys.executable, "-I", "-m", "cairn.coordinator.probe", name]
    try:
        result = proc.run_bounded(argv, limit=PROBE_OUTPUT_LIMIT, timeout=600)
    except proc.OutputTooLarge:
        return False, printable(
            f"provider {name}: the test printed more than {PROBE_OUTPUT_LIMIT} bytes, not "
            f"one line; journalctl -u cairn-provider-test-{name} shows what ran"
        )
    lines = result.stdout.decode("utf-8", "replace").strip().splitlines()
    if lines:
        return result.returncode == 0, printable(lines[-1])
    error = result.stderr.decode("utf-8", "replace").strip().splitlines()
    why = error[-1] if error else f"exit status {result.returncode}"
    return False, printable(
        f"provider {name}: the test did not run ({why}); "
        f"journalctl -u cairn-provider-test-{name} shows why"
    )


def default_file() -> Path:
    return providers_path()
