"""The ``llm`` profile end to end in a booted machine: the coordinator's model relay, the
run's egress unit, a provider key held as a systemd credential, and an agent sandbox that
sees none of it.

The provider is ``tests/support/fake_provider.py``, a real chat-completions server with
scripted tool calls, started inside the machine on its loopback. The agent's first tool
call probes its own sandbox and writes what it could reach into the workspace, so the
answer arrives in the project like any other change.
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Any

from machine import Machine
from test_recovery import enable_failpoint, wait_finished

REPO = Path(__file__).resolve().parents[2]
PORT = 18080
PROJECT = "/home/alice/app"
PROBED = [
    "/etc/credstore/cairn-provider-fake",
    "/etc/cairn/providers.toml",
    "/var/lib/cairn/journal",
    "/var/lib/cairn/pool/runs",
    "/var/lib/cairn/runs",
    "/home/alice/secret.txt",
    "/home/bob",
    "/root",
]
PROBE = (
    "for p in " + " ".join(PROBED) + "; do "
    'if cat "$p" >/dev/null 2>&1 || [ -n "$(ls -A "$p" 2>/dev/null)" ]; '
    'then echo "readable $p"; else echo "denied $p"; fi; done > probes.txt; '
    "python3 -c \"import socket; socket.create_connection(('127.0.0.1', "
    f"{PORT}), timeout=3)\" 2>/dev/null && echo 'network reachable' >> probes.txt "
    "|| echo 'network unreachable' >> probes.txt; "
    "echo \"key in environment: $(env | grep -c sk-test-)\" >> probes.txt"
)


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def start_provider(
    machine: Machine, turns: list[dict[str, Any]] | dict[str, Any], key: str | None,
    *, port: int = PORT, unit: str = "fake-provider",
) -> None:
    """The fake provider on ``port`` of the machine's loopback as unit ``unit``, asking
    for ``key`` (None: no key)."""
    machine.exec(["tee", "/root/fake_provider.py"],
                 input=(REPO / "tests" / "support" / "fake_provider.py").read_bytes())
    machine.exec(["tee", f"/root/{unit}.json"], input=json.dumps(turns).encode())
    machine.exec(["systemctl", "stop", f"{unit}.service"], check=False)
    machine.exec(["systemd-run", f"--unit={unit}", "--collect", "python3",
                  "/root/fake_provider.py", str(port), f"/root/{unit}.json",
                  *([key] if key is not None else [])])
    deadline = time.monotonic() + 30
    probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=1)"
    while machine.exec(["python3", "-c", probe], check=False).returncode != 0:
        assert time.monotonic() < deadline, machine.journal(f"{unit}.service")
        time.sleep(0.2)


def configure(machine: Machine) -> str:
    """A default provider and its key, the way an administrator sets them up."""
    key = "sk-test-" + secrets.token_hex(16)
    machine.exec(["tee", "/etc/cairn/providers.toml"], input=(
        'default = "fake"\n\n[providers.fake]\n'
        f'base_url = "http://127.0.0.1:{PORT}/v1"\nmodel = "fake-1"\n'
        'credential = "cairn-provider-fake"\n').encode())
    machine.exec(["install", "-d", "-m", "0700", "/etc/credstore"])
    machine.exec(["install", "-m", "0600", "/dev/stdin", "/etc/credstore/cairn-provider-fake"],
                 input=key.encode())
    machine.exec(["mkdir", "-p", PROJECT], user="alice")
    machine.exec(["tee", f"{PROJECT}/app.py"], user="alice",
                 input=b"def value():\n    return 1\n")
    machine.exec(["tee", "/home/alice/secret.txt"], user="alice", input=b"private\n")
    machine.exec(["mkdir", "-p", "/home/bob/notes"], user="bob")
    machine.exec(["tee", "/home/bob/notes/todo.txt"], user="bob", input=b"private\n")
    return key


def launch(machine: Machine, *extra: str) -> str:
    out = machine.exec(
        ["cairn", "launch", "builtin:implement", "--project", PROJECT,
         "--args", '{"objective": "make value() return 2"}', *extra],
        user="alice",
    )
    return out.stdout.decode().strip().splitlines()[-1]


def launch_reviewed(
    machine: Machine, name: str, goal: str, source: bytes | None = None
) -> tuple[str, str]:
    """Review ``tests/system/data/NAME`` (or ``source`` under that name) as alice and
    launch it with the review's hash; return the review and the run ID."""
    path = f"/home/alice/{name}"
    workflow = source or (REPO / "tests" / "system" / "data" / name).read_bytes()
    machine.exec(["tee", path], user="alice", input=workflow)
    review = machine.exec(["cairn", "workflow", "review", path], user="alice").stdout.decode()
    review_hash = review.strip().splitlines()[-1].split()[-1]
    out = machine.exec(
        ["cairn", "launch", path, "--confirm", review_hash, "--project", PROJECT,
         "--args", json.dumps({"goal": goal})],
        user="alice",
    )
    return review, out.stdout.decode().strip().splitlines()[-1]


def test_llm_agent_edits_through_the_relay_and_sees_no_secret(machine: Machine) -> None:
    key = configure(machine)
    start_provider(machine, [
        call("bash", command=PROBE),
        call("edit", path="app.py", old_text="return 1", new_text="return 2"),
        call("bash", command="python3 -c 'import app; print(app.value())' > value.txt"),
        call("finish_work", output={"summary": "value() returns 2"}, handoff="run the tests"),
    ], key)
    run_id = launch(machine)
    data = wait_finished(machine, run_id)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert data["run"]["output"] == {"summary": "value() returns 2"}

    def project_file(name: str) -> str:
        return machine.exec(["cat", f"{PROJECT}/{name}"]).stdout.decode()

    assert project_file("app.py") == "def value():\n    return 2\n"
    assert project_file("value.txt") == "2\n"
    probes = project_file("probes.txt").splitlines()
    assert probes == [f"denied {p}" for p in PROBED] + [
        "network unreachable", "key in environment: 0"]

    (op,) = data["operations"]
    boundary = f"/var/lib/cairn/runs/{run_id}/boundaries/{op['op_id']}"
    transcript = machine.exec(["cat", f"{boundary}/transcript.jsonl"]).stdout.decode()
    entries = [json.loads(line) for line in transcript.splitlines()]
    assert [e["status"] for e in entries] == [200] * 4
    assert key not in transcript
    usage = json.loads(machine.exec(["cat", f"{boundary}/boundary.json"]).stdout)["usage"]
    assert usage["requests"] == 4 and usage["output_tokens"] == 40
    assert usage["total_tokens"] > 40
    # The egress unit came and went with the coordinator; the key never left the relay.
    log = machine.journal(unit=f"cairn-egress@{run_id}.service")
    assert f"admits 127.0.0.1:{PORT}" in log
    assert "unmet condition" not in log, log
    # A run with a provider has no flag that would skip its egress.
    flag = f"/run/cairn/egress-skipped/{run_id}"
    assert machine.exec(["test", "-e", flag], check=False).returncode != 0


def test_a_restarted_coordinator_still_reaches_its_provider(machine: Machine) -> None:
    """The coordinator dies right after starting the agent (a failpoint) and systemd
    restarts it (``Restart=on-failure``): its egress unit still starts (no flag skips
    it), and the agent's model calls reach the provider through it."""
    key = configure(machine)
    start_provider(machine, [
        call("edit", path="app.py", old_text="return 1", new_text="return 2"),
        call("finish_work", output={"summary": "value() returns 2"}, handoff=""),
    ], key)
    enable_failpoint(machine, "after-unit-started")
    run_id = launch(machine)
    data = wait_finished(machine, run_id)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    leases = [e for e in data["events"] if e["event"] == "lease-acquired"]
    assert len(leases) >= 2, "the coordinator was never restarted"
    assert machine.exec(["cat", f"{PROJECT}/app.py"]).stdout == b"def value():\n    return 2\n"
    log = machine.journal(unit=f"cairn-egress@{run_id}.service")
    assert f"admits 127.0.0.1:{PORT}" in log and "unmet condition" not in log, log


def test_a_spent_token_budget_stops_the_run_cleanly(machine: Machine) -> None:
    key = configure(machine)
    start_provider(machine, [
        call("write", path="partial.txt", content="half done\n"),
        call("finish_work", output={"summary": "never reached"}, handoff=""),
    ], key)
    run_id = launch(machine, "--limit", "model_tokens=60")
    data = wait_finished(machine, run_id)
    assert data["run"]["state"] == "failed"
    assert "model token budget (60) is spent" in data["run"]["error"]
    assert data["settlement"] is None
    listed = machine.exec(["ls", PROJECT]).stdout.decode().split()
    assert listed == ["app.py"]


def test_a_spent_money_budget_stops_the_run_cleanly(machine: Machine) -> None:
    """The run's money budget, then the owner's daily one, kept at the provider's prices:
    an input token costs 1 micro-unit, an output token 1,000 (0.1 cent)."""
    key = configure(machine)
    machine.exec(["sed", "-i", r"s/^credential = .*/&\ninput_price_per_million = 1.0\n"
                  r"output_price_per_million = 1000.0/", "/etc/cairn/providers.toml"])
    # 20 output tokens cost 2 cents, whatever the relay capped the call at
    turns = [{**call("write", path="partial.txt", content="half done\n"), "tokens": 20},
             call("finish_work", output={"summary": "never reached"}, handoff="")]
    start_provider(machine, turns, key)
    try:
        run_id = launch(machine, "--limit", "model_cost_cents=1")
        data = wait_finished(machine, run_id)
        assert data["run"]["state"] == "failed"
        assert "the run's model money budget (0.01) is spent" in data["run"]["error"]
        assert data["model"]["calls"] == 1 and data["model"]["cost_limit"] == "0.01"
        assert float(data["model"]["cost"]) >= 0.02
        shown = machine.exec(["cairn", "show", run_id], user="alice").stdout.decode()
        assert f"model: 1 call · {data['model']['tokens']:,} of 2,000,000 tokens · cost " \
            f"{data['model']['cost']} of 0.01" in shown, shown
        assert machine.exec(["ls", PROJECT]).stdout.decode().split() == ["app.py"]

        # The same owner's day is spent now: a run without a budget of its own stops too.
        machine.exec(["tee", "/etc/cairn/admission.toml"],
                     input=b"max_daily_cost_cents_per_user = 1\n")
        start_provider(machine, turns, key)
        second = wait_finished(machine, launch(machine))
        assert second["run"]["state"] == "failed"
        assert "the owner's daily model money budget (0.01) is spent" in \
            second["run"]["error"]
        assert second["model"] is None  # no call was made

        # A budget the host could not keep is refused at launch.
        machine.exec(["sed", "-i", "/_price_per_million/d", "/etc/cairn/providers.toml"])
        refused = machine.exec(["cairn", "launch", "builtin:implement", "--project", PROJECT,
                                "--args", '{"objective": "x"}'], user="alice", check=False)
        assert refused.returncode != 0
        assert b"provider fake has no prices" in refused.stderr, refused.stderr
    finally:
        machine.exec(["rm", "-f", "/etc/cairn/admission.toml"])


FETCH = """python3 - > fetched.txt <<'EOF'
import socket, urllib.request
def get(url):
    try:
        return urllib.request.urlopen(url, timeout=10).read().decode().strip()
    except Exception as exc:
        return f"{type(exc).__name__} {getattr(exc, 'code', '') or getattr(exc, 'reason', '')}"
print("allowed:", get("http://allowed.test/hello.txt"))
print("denied:", get("http://denied.test/hello.txt"))
try:
    socket.create_connection(("127.0.0.1", 80), timeout=3)
    print("direct: connected")
except OSError as exc:
    print("direct:", type(exc).__name__)
open("/tmp/agent-was-here", "w").close()
EOF"""


def test_allowlist_agent_reaches_only_reviewed_domains(machine: Machine) -> None:
    key = configure(machine)
    # A web server on the machine's own loopback, under two names.
    machine.exec(["mkdir", "-p", "/srv/www"])
    machine.exec(["tee", "/srv/www/hello.txt"], input=b"hello from the allowed server\n")
    machine.exec(["tee", "-a", "/etc/hosts"], input=b"127.0.0.1 allowed.test denied.test\n")
    machine.exec(["systemd-run", "--unit=web", "--collect", "python3", "-m", "http.server",
                  "80", "--bind", "127.0.0.1", "--directory", "/srv/www"])
    start_provider(machine, [
        call("bash", command=FETCH),
        call("finish_work", output={"summary": "fetched"}, handoff=""),
    ], key)
    review, run_id = launch_reviewed(machine, "fetching.py", "fetch")
    assert "network=allowlist" in review and "allowlist=allowed.test" in review
    data = wait_finished(machine, run_id)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    fetched = machine.exec(["cat", f"{PROJECT}/fetched.txt"]).stdout.decode().splitlines()
    proxy_log = machine.journal(unit=f"cairn-proxy-{run_id}.service")
    assert fetched == [
        "allowed: hello from the allowed server",
        "denied: HTTPError 403",
        "direct: ConnectionRefusedError",
    ], proxy_log
    assert "allowlist proxy refused denied.test:80" in proxy_log
    socket_unit = f"cairn-proxy-{run_id}.socket"
    assert machine.exec(["systemctl", "is-active", socket_unit]).stdout.strip() == b"active"
    # Joining the proxy's namespace never means joining the host's /tmp.
    assert machine.exec(["test", "-e", "/tmp/agent-was-here"], check=False).returncode == 1




def test_command_profile_runs_an_openai_client_through_the_relay(machine: Machine) -> None:
    key = configure(machine)
    start_provider(machine, [{"content": "the answer", "tokens": 7}], key)
    client = (REPO / "tests" / "support" / "openai_client.py").read_bytes()
    machine.exec(["install", "-D", "-m", "0755", "/dev/stdin",
                  "/usr/local/lib/cairn-test/client.py"], input=client)
    machine.exec(["install", "-d", "/etc/cairn/profiles.d"])
    machine.exec(["tee", "/etc/cairn/profiles.d/client.toml"], input=(
        b'kind = "command"\nprovider = "fake"\n'
        b'argv = ["/usr/bin/python3", "-I", "/usr/local/lib/cairn-test/client.py", '
        b'"--base-url", "{model_url}"]\n'
        b'settle_ignore = [".client-*"]\n'
        b'[env]\nCLIENT_MODEL = "{model}"\nCLIENT_CONFIG = "{home}/.config/client"\n'))
    # the CLI's own configuration, which the agent's home gets a copy of
    machine.exec(["install", "-D", "-m", "0644", "/dev/stdin",
                  "/etc/cairn/profiles.d/client.d/.config/client/config.json"],
                 input=b'{"provider": "cairn-relay"}')
    _review, run_id = launch_reviewed(machine, "command_client.py", "what is the answer?")
    data = wait_finished(machine, run_id)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert data["run"]["output"] == {"summary": "the answer"}
    assert machine.exec(["cat", f"{PROJECT}/ANSWER.txt"]).stdout == b"the answer"
    # the relay's URL reached the CLI through its argv ({model_url}), as codex takes it
    base = machine.exec(["cat", f"{PROJECT}/BASE_SEEN.txt"]).stdout.decode()
    assert base.startswith("http://127.0.0.1:") and base.endswith("/v1"), base
    seen = machine.exec(["cat", f"{PROJECT}/KEY_SEEN.txt"]).stdout.decode().strip()
    assert seen and key not in seen  # a dummy; the relay added the real one
    # the profile's env, its placeholders filled, and its files in the agent's own home
    given = json.loads(machine.exec(["cat", f"{PROJECT}/PROFILE_SEEN.json"]).stdout)
    assert given == {"env": {"CLIENT_MODEL": "fake-1", "CLIENT_CONFIG": "/state/.config/client"},
                     "home": "/state", "config": '{"provider": "cairn-relay"}'}
    # the client's own history is its profile's settle_ignore: left out, and said so
    assert machine.exec(["test", "-e", f"{PROJECT}/.client-history"], check=False).returncode
    assert data["settlement"]["candidate"]["ignored"] == [".client-history"]
    shown = machine.exec(["cairn", "show", run_id], user="alice").stdout.decode()
    assert "ignored (settle_ignore): .client-history" in shown, shown
    (op,) = data["operations"]
    boundary = f"/var/lib/cairn/runs/{run_id}/boundaries/{op['op_id']}"
    usage = json.loads(machine.exec(["cat", f"{boundary}/boundary.json"]).stdout)["usage"]
    assert usage["requests"] == 1 and usage["output_tokens"] == 7
