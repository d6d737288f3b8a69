"""The launch description: everything a run is recovered from, frozen when it is launched
(written by the daemon into the journal, read by the coordinator and the root broker).
Its :meth:`LaunchDescription.launch_hash` is over its canonical JSON, so field names,
order and defaults are part of the format."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, JsonValue, field_validator, model_validator

from cairn.canonical import canonical_json, sha256_hex
from cairn.pathrules import is_plain_relative
from cairn.protocol.attestation import launch_hash_of
from cairn.protocol.base import Frozen, OpId, RunId
from cairn.protocol.names import PROVIDER_NAME_PATTERN, VERIFIER_NAME_PATTERN

# When the verified proposal F reaches the live project: at once (``auto``), after the
# owner's ``cairn apply RUN`` (``ask``), or never (``never``: F stays for ``cairn diff``).
ApplyMode = Literal["auto", "ask", "never"]
# The API a provider speaks: OpenAI's (chat completions, completions, responses) or
# Anthropic's (messages). The relay serves only that family's paths.
ModelApi = Literal["openai", "anthropic"]


class ScriptStep(Frozen):
    """One deterministic step of a ``scripted`` agent, executed inside /workspace."""

    action: Literal["write", "append", "delete", "mkdir", "symlink", "chmod", "sleep", "run"]
    path: str = ""
    content: str = ""
    target: str = ""
    mode: int | None = None
    seconds: float = 0.0
    argv: list[str] = []

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        if value and not is_plain_relative(value):
            raise ValueError(f"script path {value!r} is not a plain path below /workspace "
                             "(relative; no '..', '.' or empty component)")
        return value

    @field_validator("target")
    @classmethod
    def _target_inside(cls, value: str) -> str:
        if value.startswith("/") or ".." in value.split("/"):
            raise ValueError("symlink targets are relative to /workspace and may not contain "
                             "'..'")
        return value


class ModelRoute(Frozen):
    """Where the model relay sends an agent's requests, frozen at launch. ``credential``
    names a systemd credential of the coordinator (never the key); empty: no key."""

    provider: str = Field(pattern=PROVIDER_NAME_PATTERN)
    base_url: str = Field(pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$")
    model: str = Field(min_length=1, max_length=200)
    api: ModelApi = "openai"
    credential: str = Field(default="", pattern=r"^([A-Za-z0-9_.-]{1,100})?$")
    auth_header: str = Field(default="Authorization", pattern=r"^[A-Za-z0-9-]{1,64}$")
    auth_scheme: str = Field(default="Bearer", pattern=r"^[A-Za-z]{0,32}$")
    max_tokens_per_call: int = Field(default=8192, ge=1)
    timeout_sec: float = Field(default=300.0, gt=0)
    # What a million input and output tokens cost, in the one currency the host's prices
    # are in (None: not priced; the run's money budgets then cannot be kept).
    input_price_per_million: float | None = Field(default=None, ge=0, le=1_000_000)
    output_price_per_million: float | None = Field(default=None, ge=0, le=1_000_000)

    @property
    def priced(self) -> bool:
        return self.input_price_per_million is not None and \
            self.output_price_per_million is not None


# What a command profile's argv and env values may hold, filled in by the worker as it
# starts the CLI: the prompt, the model relay's OpenAI-style base URL (ending in /v1) and
# the route's model (both need the profile to name a provider), a file holding the JSON
# schema the answer must fit, and the agent's home (its writable state directory).
PROMPT = "{prompt}"
MODEL_URL = "{model_url}"
MODEL = "{model}"
OUTPUT_SCHEMA_FILE = "{output_schema_file}"
HOME = "{home}"
PLACEHOLDERS = (PROMPT, MODEL_URL, MODEL, OUTPUT_SCHEMA_FILE, HOME)
# What a profile's env may not set: the unit's own (the home, the sockets, root's hash of
# the profile and every other CAIRN_ name).
RESERVED_ENV = ("HOME", "TMPDIR")
RESERVED_ENV_PREFIX = "CAIRN_"
_ENV_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_ENV_REST = _ENV_FIRST | frozenset("0123456789")


class ProfileSpec(Frozen):
    """How an agent profile runs, resolved and frozen at launch.

    ``llm`` profiles carry their system prompt and name a route of the launch
    description (``provider``); ``command`` profiles may name one to reach the relay.
    ``model_attempts`` and ``model_retry_cap_sec``: :mod:`cairn.worker.retry`.
    ``settle_ignore``: globs of what the profile's tool leaves in the workspace (its
    history, caches); the run's settlement leaves those paths out and reports them.
    """

    name: str
    kind: Literal["scripted", "command", "llm"]
    steps: list[ScriptStep] = []
    # not JSON only: a profile file's TOML may hold a date, which the launch description
    # then carries as its JSON string
    output: dict[str, Any] = {}
    handoff: str = ""
    argv: list[str] = []
    env: dict[str, str] = {}
    settle_ignore: list[str] = []
    provider: str = ""
    system_prompt: str = ""
    max_steps: int = Field(default=60, ge=1, le=1000)
    max_corrections: int = Field(default=3, ge=0, le=20)
    bash_timeout_sec: float = Field(default=120.0, gt=0, le=3600)
    tool_output_limit: int = Field(default=16_384, ge=256, le=1 << 20)
    # attempts of one agent operation that ends without a result (a clean retry each)
    agent_attempts: int = Field(default=3, ge=1, le=10)
    model_attempts: int = Field(default=5, ge=1, le=20)
    model_retry_cap_sec: float = Field(default=60.0, gt=0, le=600)
    # "sha256:<hex>" of the host's profiles.d file this profile was read from (none for a
    # scripted profile the caller sent): root re-reads a command profile's argv from it.
    config_sha256: str = Field(default="", pattern=r"^(sha256:[0-9a-f]{64})?$")

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not (0 < len(name) <= 128 and name[0] in _ENV_FIRST
                    and _ENV_REST.issuperset(name)):
                raise ValueError(f"env: {name!r} is not a variable name (letters, digits, _)")
            if name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIX):
                raise ValueError(f"env: {name} is set by Cairn for every agent; choose "
                                 "another name")
            if "\0" in value:
                raise ValueError(f"env: {name} holds a NUL character")
        return env

    @field_validator("settle_ignore")
    @classmethod
    def _project_globs(cls, globs: list[str]) -> list[str]:
        for glob in globs:
            parts = glob.split("/")
            if not glob or glob.startswith("/") or "\0" in glob or ".." in parts:
                raise ValueError(f"settle_ignore: {glob!r} is not a glob of paths inside the "
                                 "project (relative, no '..')")
        return globs

    @model_validator(mode="after")
    def _relay_placeholders_need_a_provider(self) -> ProfileSpec:
        for placeholder, what in ((MODEL_URL, "the relay's URL"), (MODEL, "the model")):
            if not self.provider and any(
                placeholder in text for text in (*self.argv, *self.env.values())
            ):
                raise ValueError(f"{placeholder} ({what}) is used but no provider is named")
        return self

    def sha256(self) -> str:
        """What root puts in the agent unit's environment (:data:`PROFILE_SHA256_ENV`): the
        worker runs only a profile its coordinator sends that hashes to it."""
        return sha256_hex(canonical_json(self.model_dump(mode="json")))


PROFILE_SHA256_ENV = "CAIRN_PROFILE_SHA256"
# The model of the route a command profile's provider names, as root read it from the
# pinned description: what the worker fills {model} with.
MODEL_ENV = "CAIRN_MODEL"
# ... and the API it speaks (:data:`ModelApi`): the worker points only that family's
# client variables at the relay.
MODEL_API_ENV = "CAIRN_MODEL_API"
# Where a command profile's files (/etc/cairn/profiles.d/NAME.d/) are bound read-only in
# its agent's unit; the worker copies them into the agent's home before the CLI starts.
PROFILE_FILES_DIR = "/run/cairn/profile"


class Limits(Frozen):
    """Per-agent unit limits and per-run budgets, frozen at launch."""

    memory_max: int = Field(default=2 << 30, ge=16 << 20)
    tasks_max: int = Field(default=512, ge=8)
    cpu_quota_percent: int = Field(default=100, ge=1)
    runtime_max_sec: int = Field(default=3600, ge=1)
    io_weight: int = Field(default=100, ge=1, le=10_000)
    model_tokens: int = Field(default=2_000_000, ge=0)
    # Money for model calls, in hundredths of the currency of the providers' prices: the
    # run's (None: no money budget) and, set by the host (admission.toml), what its owner
    # may spend per day over all runs.
    model_cost_cents: int | None = Field(default=None, ge=0)
    daily_cost_cents: int | None = Field(default=None, ge=0)
    max_agent_ops: int = Field(default=200, ge=1)
    max_concurrent_agents: int = Field(default=8, ge=1)
    max_agent_seconds: int = Field(default=24 * 3600, ge=1)


class ProjectSpec(Frozen):
    """The live project and how Q is made from it."""

    root: str
    owner_uid: int
    on_pool_fs: bool
    subvolume: str | None = None
    subpath: str = ""


class SettlementPolicySpec(Frozen):
    write_paths: list[str] = ["**"]
    allow_git_internals: bool = False
    max_file_bytes: int = 64 << 20
    max_total_bytes: int = 1 << 30
    # the settle_ignore globs of the run's profiles (:attr:`ProfileSpec.settle_ignore`)
    ignore: list[str] = []


class VerifierSpec(Frozen):
    """A host-configured check of the proposal (``/etc/cairn/verifiers.d/NAME.toml``),
    frozen at launch with the sha256 of the file's bytes; see :mod:`cairn.verifiers`."""

    name: str = Field(pattern=VERIFIER_NAME_PATTERN)
    argv: list[str] = Field(min_length=1)
    timeout_sec: int = Field(ge=1, le=86_400)
    environment: dict[str, str] = {}
    config_sha256: str


MAX_EVALUATOR_ALLOWLIST = 64


class EvaluatorSpec(Frozen):
    """A host-configured measurement command (``/etc/cairn/evaluators.d/NAME.toml``) a
    reviewed workflow names, frozen at launch; see :mod:`cairn.evaluators`."""

    name: str = Field(pattern=VERIFIER_NAME_PATTERN)
    argv: list[str] = Field(min_length=1)
    timeout_sec: int = Field(ge=1, le=86_400)
    environment: dict[str, str] = {}
    warmups: int = Field(ge=0, le=100)
    samples: int = Field(ge=1, le=1000)
    config_sha256: str
    # network = "allowlist" in its file: its runs reach these domains through the run's
    # proxy (None: no network, as every evaluator launched before had)
    allowlist: list[str] | None = Field(default=None, min_length=1,
                                        max_length=MAX_EVALUATOR_ALLOWLIST)


class ReplayOrigin(Frozen):
    """Where a replayed run comes from (``cairn replay SOURCE --through OP``): the source
    run, the root boundary it was replayed through and every operation imported from it
    (each keeps its ID, so the source's operation of the same ID is its provenance)."""

    source_run: RunId
    through_op: OpId
    ops: list[OpId] = Field(min_length=1)


class LaunchDescription(Frozen):
    """Everything a run is recovered from. Never re-read from live configuration."""

    run_id: RunId
    owner_uid: int
    owner_gid: int
    owner_name: str
    definition: str
    source: str
    source_filename: str
    review_hash: str
    review: dict[str, Any]
    args: dict[str, JsonValue]
    project: ProjectSpec
    profiles: dict[str, ProfileSpec]
    routes: dict[str, ModelRoute] = {}
    # The schedule revision that admitted this run ({id, name, revision, occurrence}); None
    # for a run a person launched directly.
    schedule: dict[str, JsonValue] | None = None
    limits: Limits = Limits()
    policy: SettlementPolicySpec = SettlementPolicySpec()
    cairn_version: str
    created_at: float
    capsule_hash: str | None = None  # the sealed release installed at launch
    apply_mode: ApplyMode = "auto"
    verifiers: list[VerifierSpec] = []
    evaluators: list[EvaluatorSpec] = []
    replay: ReplayOrigin | None = None

    def launch_hash(self) -> str:
        return launch_hash_of(self.model_dump(mode="json"))
