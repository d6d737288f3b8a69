"""Network modes and allowlist entries: review and broker accept exactly the same entries.

Every entry of the table goes through the real paths: static review of a workflow that
declares it, the root broker's check of the run's review (``units.run_allowlist``) and,
when accepted, the allowlist proxy, which must admit the destination it names.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from cairn import netpolicy, workflow
from cairn.broker import units
from cairn.errors import BrokerRefused
from cairn.protocol.launch import LaunchDescription, ProjectSpec
from cairn.proxy import Allowlist
from cairn.unitprops import AgentUnitSpec
from cairn.workflow.review import AgentEntry, ReviewRejected, review_source

LONGEST_LABEL = "a" * 63
LONGEST_HOST = ".".join(["b" * 63] * 3 + ["c" * 61])  # 253 characters

ACCEPTED = [
    "example.com",
    "docs.python.org",
    "*.debian.org",
    "Example.COM",
    "localhost",
    "allowed.test",
    "xn--bcher-kva.example",
    "my-host-1.example",
    "1.2.3.4",
    "example.com:8443",
    "example.com:1",
    "example.com:65535",
    "*.com",
    f"{LONGEST_LABEL}.example",
    LONGEST_HOST,
    f"*.{LONGEST_HOST}",
    f"{LONGEST_HOST}:443",
]

REFUSED = [
    "",
    " example.com",
    "example.com ",
    "example.com\n",
    "exa mple.com",
    "a..b",
    ".example.com",
    "example.com.",
    "-example.com",
    "example-.com",
    "example.-com",
    "exa_mple.com",
    f"{LONGEST_LABEL}a.example",
    LONGEST_HOST + "c",
    "*",
    "*.",
    "*example.com",
    "*.*.example.com",
    "a.*.example.com",
    "*.example.com:443",
    "example.com:",
    "example.com:0",
    "example.com:65536",
    "example.com:123456",
    "example.com:8a",
    "example.com:443:443",
    "http://example.com",
    "example.com/path",
    "user@example.com",
    "[::1]:443",
    "::1",
    "bücher.example",
    "\u212a.example",  # KELVIN SIGN, which case-folds to 'k'
    "ſ.example",  # LATIN SMALL LETTER LONG S, which case-folds to 's'
]

TABLE = [(entry, True) for entry in ACCEPTED] + [(entry, False) for entry in REFUSED]


def workflow_with(entry: object) -> str:
    return f"""\
from cairn.workflow import Field, Model, agent, workflow


class Objective(Model):
    objective: str = Field(min_length=1)


class Summary(Model):
    summary: str


fetch = agent(
    profile="builtin:fetcher", network="allowlist", allowlist=({entry!r},), output=Summary
)


@workflow(description="Fetch.", input=Objective, output=Summary)
async def run(flow, args: Objective) -> Summary:
    result = await flow.agent(fetch, prompt=args.objective)
    return result.output
"""


def description(review: dict[str, object]) -> LaunchDescription:
    return LaunchDescription(
        run_id="flow_" + "0" * 31 + "7", owner_uid=1001, owner_gid=1001, owner_name="alice",
        definition="builtin:fetch", source="x = 1\n", source_filename="fetch.py",
        review_hash="sha256:" + "b" * 64, review=review, args={}, profiles={},
        project=ProjectSpec(root="/home/alice/p", owner_uid=1001, on_pool_fs=False),
        cairn_version="0", created_at=time.time(),
    )


def review_accepts(entry: object) -> bool:
    try:
        review = review_source(workflow_with(entry), filename="fetch.py")
    except ReviewRejected as exc:
        # the descriptor is refused, so flow.agent(fetch, ...) names no descriptor either
        assert [(v.rule, v.message) for v in exc.violations][0] == (  # noqa: PT017
            "agent", f"allowlist entry {entry!r} is not a domain name"
        )
        return False
    assert review.agents["fetch"].allowlist == (entry,)
    return True


def broker_accepts(entry: object) -> bool:
    agent = {"profile": "builtin:fetcher", "access": "read", "network": "allowlist",
             "output": "Summary", "allowlist": [entry]}
    try:
        allowed = units.run_allowlist(description({"agents": {"fetch": agent}}))
    except BrokerRefused as exc:
        assert "is not a domain" in exc.message  # noqa: PT017
        return False
    assert isinstance(entry, str) and allowed == [entry.lower()]
    return True


@pytest.mark.parametrize(("entry", "accepted"), TABLE, ids=[repr(e)[:40] for e, _ in TABLE])
def test_review_and_broker_accept_the_same_allowlist_entries(entry: str, accepted: bool) -> None:
    assert netpolicy.is_allowlist_entry(entry) is accepted
    assert review_accepts(entry) is accepted
    assert broker_accepts(entry) is accepted


@pytest.mark.parametrize("entry", [5, None, True, ["example.com"]])
def test_entries_that_are_not_strings_are_refused_by_both(entry: object) -> None:
    assert not netpolicy.is_allowlist_entry(entry)
    assert not review_accepts(entry)
    assert not broker_accepts(entry)


def test_the_broker_reads_what_review_wrote() -> None:
    review = review_source(workflow_with("Docs.Python.org:8443"), filename="fetch.py")
    desc = description(review.model_dump(mode="json"))
    assert units.run_allowlist(desc) == ["docs.python.org:8443"]
    assert units.agent_network(desc, "fetch") == "allowlist"


@pytest.mark.parametrize("entry", ACCEPTED)
def test_every_accepted_entry_reaches_something_through_the_proxy(entry: str) -> None:
    allow = Allowlist([entry.lower()])
    host, _, port = entry.lower().partition(":")
    if host.startswith("*."):
        assert allow.admits("sub" + host[1:], 443) and not allow.admits(host[2:], 443)
    else:
        assert allow.admits(host, int(port or 443))


def test_network_modes_have_one_definition() -> None:
    assert netpolicy.NETWORK_MODES == ("none", "allowlist", "host")
    annotations: tuple[object, ...] = (
        AgentEntry.model_fields["network"].annotation,
        AgentUnitSpec.model_fields["network"].annotation,
    )
    for annotated in annotations:
        assert annotated == workflow.Network == netpolicy.NetworkMode
    assert vars(units)["NETWORK_MODES"] is netpolicy.NETWORK_MODES


def test_the_module_imports_only_the_standard_library() -> None:
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import cairn.netpolicy, cairn.canonical\n"
        "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in "
        "('cairn', 'pydantic')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['cairn', 'cairn.canonical', 'cairn.leanjson', 'cairn.netpolicy']"
