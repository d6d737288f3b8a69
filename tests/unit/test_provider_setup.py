"""`cairn provider add` and `rm` edit providers.toml as text: the file a launch then reads,
an administrator's comments kept; and `cairn provider test`'s probe, against a real
chat-completions server through a real model relay."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

from cairn import provider_setup as setup
from cairn.config import ConfigError
from cairn.coordinator import probe
from cairn.errors import NotFound, UsageError
from cairn.providers import load_providers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from fake_provider import FakeProvider, Turn  # noqa: E402

FILE = Path("/etc/cairn/providers.toml")
KEY = "sk-test-provider-setup"
ADMIN_FILE = """\
# Providers of this host (kept by hand)
default = "local"

[providers.local]   # the llama.cpp server
base_url = "http://127.0.0.1:8080/v1"
model = "qwen"
credential = ""

# hosted, for the big jobs
[providers.hosted]
base_url = "https://api.example.com/v1"
model = "big-1"
credential = "cairn-provider-hosted"
"""


def add(text: str, name: str, *, default: bool = False, **values: object) -> str:
    new = setup.NewProvider(name=name, base_url=str(values.pop("base_url", "http://h/v1")),
                            model=str(values.pop("model", "m")), **values)  # type: ignore[arg-type]
    return setup.with_provider(text, new, make_default=default, file=FILE)


def test_the_first_provider_added_is_the_default_and_a_launch_can_route_to_it(
    tmp_path: Path,
) -> None:
    text = add("", "openai", base_url="https://api.openai.com/v1", model="gpt-4.1-mini")
    file = tmp_path / "providers.toml"
    file.write_text(text)
    loaded = load_providers(file)
    route = loaded.route("")
    assert (route.provider, route.base_url, route.model) == (
        "openai", "https://api.openai.com/v1", "gpt-4.1-mini")
    assert (route.credential, route.auth_header, route.auth_scheme) == (
        "cairn-provider-openai", "Authorization", "Bearer")


def test_adding_keeps_the_administrators_comments_and_default_unless_asked() -> None:
    text = add(ADMIN_FILE, "anthropic", api="anthropic", base_url="https://api.anthropic.com/v1")
    assert text.startswith(ADMIN_FILE)
    data = tomllib.loads(text)
    assert data["default"] == "local"
    assert data["providers"]["anthropic"] == {
        "api": "anthropic", "base_url": "https://api.anthropic.com/v1", "model": "m",
        "credential": "cairn-provider-anthropic", "auth_header": "x-api-key", "auth_scheme": "",
    }
    made_default = add(ADMIN_FILE, "fast", default=True, keyed=False, timeout_sec=30.0)
    data = tomllib.loads(made_default)
    assert data["default"] == "fast"
    assert made_default.count("default =") == 1
    assert "# the llama.cpp server" in made_default
    assert data["providers"]["fast"]["credential"] == ""
    assert data["providers"]["fast"]["timeout_sec"] == 30.0


def test_a_default_line_is_added_before_the_first_table_when_the_file_has_none() -> None:
    text = add("# comment\n[providers.a]\nbase_url = \"http://a/v1\"\nmodel = \"x\"\n", "b",
               default=True)
    assert tomllib.loads(text)["default"] == "b"
    assert text.startswith("# comment\ndefault = \"b\"\n")


@pytest.mark.parametrize("model", ['a "quoted" \\ model', "tab\there", "del\x7f", "ünï"])
def test_any_model_name_is_written_as_a_toml_string_that_reads_back_the_same(model: str) -> None:
    assert tomllib.loads(add("", "p", model=model))["providers"]["p"]["model"] == model


@pytest.mark.parametrize(
    ("name", "url", "says"),
    [("Bad Name", "http://h/v1", "provider"), ("ok", "ftp://h", "base_url"),
     ("ok", "http://h/v1 x", "base_url")],
)
def test_a_bad_name_or_url_is_refused_in_one_line_and_nothing_is_written(
    name: str, url: str, says: str
) -> None:
    with pytest.raises(UsageError) as caught:
        add(ADMIN_FILE, name, base_url=url)
    assert caught.value.message.startswith(says)
    assert "\n" not in caught.value.message
    assert caught.value.hint


def test_a_provider_already_there_is_not_replaced() -> None:
    with pytest.raises(UsageError, match="already in"):
        add(ADMIN_FILE, "hosted")


def test_a_file_a_launch_would_refuse_is_not_edited() -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        add("default = \n", "x")
    with pytest.raises(ConfigError, match="no \\[providers.gone\\] table"):
        add('default = "gone"\n', "x")
    with pytest.raises(ConfigError, match="surprise"):
        add('[providers.x]\nbase_url = "http://h/v1"\nmodel = "m"\nsurprise = 1\n', "y")


def test_removing_takes_out_its_table_only_and_a_default_that_named_it() -> None:
    text = setup.without_provider(ADMIN_FILE, "local", file=FILE)
    data = tomllib.loads(text)
    assert "default" not in data
    assert list(data["providers"]) == ["hosted"]
    assert "# hosted, for the big jobs" in text
    assert "# Providers of this host (kept by hand)" in text
    kept = setup.without_provider(ADMIN_FILE, "hosted", file=FILE)
    assert tomllib.loads(kept) == {"default": "local", "providers": {"local": {
        "base_url": "http://127.0.0.1:8080/v1", "model": "qwen", "credential": ""}}}
    assert setup.without_provider(kept, "local", file=FILE).strip().startswith("#")


def test_removing_what_is_not_there_or_not_a_plain_table_is_refused() -> None:
    with pytest.raises(NotFound, match="not in"):
        setup.without_provider(ADMIN_FILE, "nope", file=FILE)
    dotted = 'providers.x.base_url = "http://h/v1"\nproviders.x.model = "m"\n'
    with pytest.raises(UsageError, match="edit the file by hand"):
        setup.without_provider(dotted, "x", file=FILE)


@pytest.mark.parametrize("key", ["", "  \n", "two words", "a\x7fb", "x" * (16 << 10 + 1)])
def test_a_key_the_coordinator_would_refuse_is_refused_before_it_is_stored(key: str) -> None:
    with pytest.raises(UsageError):
        setup.checked_key(key, "cairn-provider-x")


def test_a_key_is_taken_without_its_newline() -> None:
    assert setup.checked_key("sk-abc\n", "cairn-provider-x") == "sk-abc"


def test_key_state_says_where_the_key_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    encrypted, plain = setup.etc_stores()
    assert (encrypted, plain) == (tmp_path / "etc/credstore.encrypted", tmp_path / "etc/credstore")
    assert setup.key_state("") == "none"
    assert setup.key_state("cairn-provider-a") == "missing"
    plain.mkdir(parents=True)
    (plain / "cairn-provider-a").write_text("k")
    assert setup.key_state("cairn-provider-a") == "stored"
    encrypted.mkdir()
    (encrypted / "cairn-provider-a").write_text("k")
    assert setup.key_state("cairn-provider-a") == "stored"  # the plain store is searched first
    assert setup.existing_keys("cairn-provider-a") == [
        encrypted / "cairn-provider-a", plain / "cairn-provider-a"]
    assert setup.remove_keys("cairn-provider-a") == [
        encrypted / "cairn-provider-a", plain / "cairn-provider-a"]
    assert setup.key_state("cairn-provider-a") == "missing"


def _probe_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, key: str,
                api: str = "openai") -> None:
    (tmp_path / "etc/cairn").mkdir(parents=True)
    (tmp_path / "etc/cairn/providers.toml").write_text(
        add("", "fake", base_url=url, model="fake-1", api=api))
    creds = tmp_path / "credentials"
    creds.mkdir()
    (creds / "cairn-provider-fake").write_text(key + "\n")
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))


def test_the_probe_reports_the_models_answer_through_the_relay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeProvider([Turn(content="ready", tokens=3)], require_key=KEY) as fake:
        _probe_host(tmp_path, monkeypatch, fake.base_url, KEY)
        ok, line = probe.probe("fake")
        (request,) = fake.requests
    assert ok, line
    assert line.startswith(f"provider fake (fake-1 at {fake.base_url}) answered in ")
    assert line.endswith(": ready")
    assert request.body["model"] == "fake-1"
    assert request.body["max_tokens"] == probe.PROBE_TOKENS
    assert request.headers["authorization"] == f"Bearer {KEY}"


def test_the_probe_speaks_anthropics_messages_api_with_its_key_header(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeProvider([Turn(content="ready", tokens=2)], require_key=KEY) as fake:
        _probe_host(tmp_path, monkeypatch, fake.base_url, KEY, api="anthropic")
        ok, line = probe.probe("fake")
        (request,) = fake.requests
    assert ok, line
    assert line.endswith(": ready")
    assert request.path == "/v1/messages"
    assert request.headers["x-api-key"] == KEY and "authorization" not in request.headers
    assert request.headers["anthropic-version"] == probe.ANTHROPIC_VERSION
    assert request.body["max_tokens"] == probe.PROBE_TOKENS


def test_the_probe_reports_a_wrong_key_as_the_providers_401_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeProvider([Turn(content="ready")], require_key=KEY) as fake:
        _probe_host(tmp_path, monkeypatch, fake.base_url, "sk-wrong")
        ok, line = probe.probe("fake")
    assert not ok
    assert line == f"provider fake (fake-1 at {fake.base_url}) answered 401: bad key"


def test_the_probe_escapes_what_a_hostile_provider_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    answer = "\x1b]0;owned\x07ready\r\nfake prompt $ " + "x" * 400
    with FakeProvider([Turn(content=answer)], require_key=KEY) as fake:
        _probe_host(tmp_path, monkeypatch, fake.base_url, KEY)
        ok, line = probe.probe("fake")
    assert ok
    assert "\x1b" not in line
    assert "\n" not in line
    assert "\r" not in line
    assert line.endswith("…")
    assert "\\x1b]0;owned\\x07ready fake prompt" in line


def test_the_probe_says_when_the_provider_cannot_be_reached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _probe_host(tmp_path, monkeypatch, "http://127.0.0.1:9/v1", KEY)
    ok, line = probe.probe("fake")
    assert not ok
    assert line.startswith("provider fake (fake-1 at http://127.0.0.1:9/v1): provider fake is "
                           "unreachable:")


def test_the_shipped_example_is_a_providers_file_a_launch_accepts() -> None:
    example = Path(__file__).resolve().parents[2] / "docs/examples/providers.toml"
    loaded = load_providers(example)
    assert loaded.default == "local"
    assert {name: loaded.route(name).api for name in loaded.providers} == {
        "local": "openai", "openai": "openai", "anthropic": "anthropic"}
    assert loaded.route("openai").timeout_sec == 300
