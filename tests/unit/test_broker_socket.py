"""The broker socket's two parsers, fed hostile bytes: the request line (with the one
descriptor a launch may carry) and the owner's attestation read from that descriptor.
Real Unix sockets; hypothesis generates the hostile input."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cairn.broker import server
from cairn.broker.pins import Attestation
from cairn.broker.server import read_attestation, read_request
from cairn.errors import BrokerRefused
from cairn.protocol.attestation import attestation_line, parse_attestation
from cairn.protocol.broker import BrokerReply, Receipt

RUN = "flow_" + "0123456789abcdef" * 2
HASH = "sha256:" + "e" * 64


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    client, broker = socket.socketpair()
    with client, broker:
        broker.settimeout(5)
        yield client, broker


def open_fds() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


def send(client: socket.socket, data: bytes, fds: list[int] = []) -> None:  # noqa: B006
    if fds:
        socket.send_fds(client, [data], fds)
    else:
        client.sendall(data)
    client.shutdown(socket.SHUT_WR)


@pytest.mark.parametrize("verb", ["launch-v1", "storage-v1", "delete-v1"])
def test_an_exact_line_is_a_request(pair: tuple[socket.socket, socket.socket], verb: str) -> None:
    client, broker = pair
    send(client, f"{verb} {RUN}\n".encode())
    assert read_request(broker) == (verb, RUN, None)


@pytest.mark.parametrize(
    "line",
    [
        f"launch-v1 {RUN}\n\n",  # a trailing blank line
        f"launch-v1 {RUN}",  # no newline
        f"launch-v1  {RUN}\n",
        f"launch-v2 {RUN}\n",
        f"launch-v1 {RUN.upper()}\n",
        f"launch-v1 {RUN}0\n",
        f"launch-v1 {RUN} /etc/shadow\n",
        f"launch-v1 {RUN}\r\n",
        "",
        "x" * 4096,
    ],
)
def test_anything_but_the_exact_line_is_refused(
    pair: tuple[socket.socket, socket.socket], line: str
) -> None:
    client, broker = pair
    send(client, line.encode())
    assert read_request(broker) is None


@pytest.mark.parametrize(
    ("verb", "count"), [("storage-v1", 1), ("delete-v1", 1), ("launch-v1", 2)]
)
def test_a_descriptor_with_any_verb_but_one_launch_is_refused_and_closed(
    pair: tuple[socket.socket, socket.socket], verb: str, count: int
) -> None:
    client, broker = pair
    before = open_fds()
    passed = [os.open("/", os.O_RDONLY) for _ in range(count)]
    send(client, f"{verb} {RUN}\n".encode(), passed)
    for fd in passed:
        os.close(fd)
    assert read_request(broker) is None
    assert open_fds() == before  # what arrived was closed


def test_a_launch_may_carry_one_descriptor(pair: tuple[socket.socket, socket.socket]) -> None:
    client, broker = pair
    mine, theirs = socket.socketpair()
    with mine, theirs:
        send(client, f"launch-v1 {RUN}\n".encode(), [theirs.fileno()])
        request = read_request(broker)
        assert request is not None and request[:2] == ("launch-v1", RUN)
        assert request[2] is not None
        os.close(request[2])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200))
def test_generated_bytes_are_a_request_only_when_they_are_the_exact_line(data: bytes) -> None:
    client, broker = socket.socketpair()
    with client, broker:
        broker.settimeout(5)
        send(client, data)
        request = read_request(broker)
    if request is None:
        assert server.REQUEST_RE.match(data) is None
    else:
        assert f"{request[0]} {request[1]}\n".encode() == data and request[2] is None


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["launch-v1", "storage-v1", "delete-v1"]),
       st.from_regex(r"\Aflow_[0-9a-f]{32}\Z"), st.binary(max_size=8))
def test_a_valid_line_with_anything_after_it_is_refused(verb: str, run_id: str,
                                                        tail: bytes) -> None:
    client, broker = socket.socketpair()
    with client, broker:
        broker.settimeout(5)
        send(client, f"{verb} {run_id}\n".encode() + tail)
        request = read_request(broker)
    assert request == (None if tail else (verb, run_id, None))


def test_the_owners_line_on_its_own_socketpair_is_an_attestation() -> None:
    mine, theirs = socket.socketpair()
    mine.sendall(attestation_line(RUN, HASH))
    got = read_attestation(os.dup(theirs.fileno()))
    mine.close()
    theirs.close()
    assert (got.pid, got.uid, got.gid) == (os.getpid(), os.getuid(), os.getgid())
    assert (got.run_id, got.launch_hash) == (RUN, HASH)


def test_a_descriptor_that_is_not_a_local_stream_socket_is_refused() -> None:
    before = open_fds()
    read_end, write_end = os.pipe()
    with pytest.raises(BrokerRefused, match="not a socket"):
        read_attestation(read_end)
    os.close(write_end)
    one, other = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with pytest.raises(BrokerRefused, match="not a local stream socket"):
        read_attestation(one.detach())
    other.close()
    directory = os.open("/", os.O_RDONLY)
    with pytest.raises(BrokerRefused, match="not a socket"):
        read_attestation(directory)
    assert open_fds() == before


@pytest.mark.parametrize(
    "written",
    [
        b"",
        attestation_line(RUN, HASH)[:-1],
        attestation_line(RUN, HASH) + b"more",
        attestation_line(RUN, HASH).replace(b"attest-v1", b"attest-v2"),
        b"A" * 129,
        b'{"op": "launch"}\n',
        # The line's exact length, each with one thing wrong: what a parser by length and
        # words (not a pattern) must refuse too.
        attestation_line(RUN, HASH).replace(b" ", b"  ", 1)[:-2] + b"\n",
        attestation_line(RUN, HASH)[:-2] + b"\n\n",
        attestation_line(RUN, HASH).replace(HASH.encode(), HASH.upper().encode()),
        attestation_line(RUN, HASH).replace(b"flow_", b"flow-"),
        attestation_line(RUN, HASH).replace(b"sha256:", b"sha512:"),
        attestation_line(RUN, HASH)[:-3] + "é".encode() + b"\n",
        attestation_line(RUN, HASH)[:20] + b"\n" + attestation_line(RUN, HASH)[21:],
    ],
)
def test_anything_but_one_exact_line_is_no_attestation(written: bytes) -> None:
    mine, theirs = socket.socketpair()
    mine.sendall(written)
    mine.close()
    with pytest.raises(BrokerRefused, match="sent no valid attestation"):
        read_attestation(theirs.detach())


def test_an_owner_that_never_writes_is_not_waited_for_forever(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(server, "ATTESTATION_TIMEOUT_SEC", 0.2)
    mine, theirs = socket.socketpair()
    with mine, pytest.raises(BrokerRefused, match="no attestation from the run's owner"):
        read_attestation(theirs.detach())


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=160))
def test_generated_lines_attest_only_in_the_exact_form(data: bytes) -> None:
    parsed = parse_attestation(data)
    if parsed is not None:
        assert attestation_line(*parsed) == data


@given(st.from_regex(r"\Aflow_[0-9a-f]{32}\Z"), st.from_regex(r"\Asha256:[0-9a-f]{64}\Z"))
def test_every_well_formed_attestation_round_trips(run_id: str, launch_hash: str) -> None:
    assert parse_attestation(attestation_line(run_id, launch_hash)) == (run_id, launch_hash)


# --- one connection, served: what the caller hears --------------------------------------


def served(data: bytes, carry_out: server.CarryOut, *, fds: list[int] = [],  # noqa: B006
           uids: set[int] | None = None) -> dict[str, object]:
    """Send ``data`` (and ``fds``) to a BrokerServer's handler over a real socketpair;
    the caller's reply, parsed."""
    client, conn = socket.socketpair()
    with socket.socket(socket.AF_UNIX) as unused_listener, client:
        broker = server.BrokerServer(unused_listener, carry_out)
        if uids is not None:
            broker.uids = uids
        send(client, data, fds)
        broker.handle(conn)
        reply = b""
        while chunk := client.recv(4096):
            reply += chunk
    parsed: dict[str, object] = json.loads(reply)
    return parsed


def nothing(verb: str, run_id: str, attestation: object, uids: frozenset[int]) -> list[Receipt]:
    raise AssertionError("a refused request reaches no verb")


def test_a_malformed_request_hears_the_usage() -> None:
    reply = served(b"launch-v1 flow_nope\n", nothing)
    assert reply["ok"] is False and reply["code"] == "usage"
    assert "expected '<launch-v1|storage-v1|delete-v1> flow_<32 hex>'" in str(reply["error"])


def test_a_caller_not_allowed_hears_why_and_its_descriptor_is_closed() -> None:
    before = open_fds()
    owner, channel = socket.socketpair()
    with owner, channel:
        reply = served(f"launch-v1 {RUN}\n".encode(), nothing, fds=[channel.fileno()],
                       uids={os.getuid() + 4242})
    assert reply == {"ok": False, "code": "permission-denied",
                     "error": "only root and the cairn user may call", "receipts": []}
    assert open_fds() <= before


def test_a_launch_carries_the_owners_attestation_to_the_verb() -> None:
    seen: list[tuple[str, str, object]] = []

    def carry_out(verb: str, run_id: str, attestation: object,
                  uids: frozenset[int]) -> list[Receipt]:
        seen.append((verb, run_id, attestation))
        return []

    owner, channel = socket.socketpair()
    with owner, channel:
        owner.sendall(attestation_line(RUN, HASH))
        reply = served(f"launch-v1 {RUN}\n".encode(), carry_out, fds=[channel.fileno()])
    assert reply == {"ok": True, "code": None, "error": None, "receipts": []}
    ((verb, run_id, attestation),) = seen
    assert (verb, run_id) == ("launch-v1", RUN)
    assert isinstance(attestation, Attestation)
    assert (attestation.uid, attestation.run_id, attestation.launch_hash) == (
        os.getuid(), RUN, HASH)


def test_a_broker_bug_still_answers_the_caller() -> None:
    def crash(verb: str, run_id: str, attestation: object,
              uids: frozenset[int]) -> list[Receipt]:
        raise KeyError("intent-kind")

    reply = served(f"storage-v1 {RUN}\n".encode(), crash)
    assert reply["ok"] is False and reply["code"] == "internal"
    assert reply["error"] == "internal error: 'intent-kind'"


def test_a_caller_gone_before_the_reply_costs_the_broker_nothing() -> None:
    client, conn = socket.socketpair()
    client.close()
    with conn:
        server.BrokerServer.reply(conn, BrokerReply(ok=True))  # EPIPE is swallowed


def test_a_caller_that_stalls_after_passing_a_descriptor_leaves_nothing_open(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    client, broker = pair
    before = open_fds()
    mine, theirs = socket.socketpair()
    with mine, theirs:
        socket.send_fds(client, [b"launch-v1 "], [theirs.fileno()])  # and then nothing
        broker.setblocking(False)  # the read that would wait fails at once
        with pytest.raises(BlockingIOError):
            read_request(broker)
    assert open_fds() <= before  # the descriptor that did arrive was closed


class OneConnection:
    """A listener that hands the server one real connection, then stops it."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn: socket.socket | None = conn

    def accept(self) -> tuple[socket.socket, str]:
        if self.conn is None:
            raise StopIteration
        conn, self.conn = self.conn, None
        return conn, ""


def test_the_server_answers_each_connection_on_a_thread_of_its_own() -> None:
    seen: list[str] = []

    def carry_out(verb: str, run_id: str, attestation: object,
                  uids: frozenset[int]) -> list[Receipt]:
        seen.append(threading.current_thread().name)
        return []

    client, conn = socket.socketpair()
    with client:
        broker = server.BrokerServer(OneConnection(conn), carry_out)  # type: ignore[arg-type]
        client.sendall(f"delete-v1 {RUN}\n".encode())
        with pytest.raises(StopIteration):
            broker.serve_forever()
        client.settimeout(10)
        assert json.loads(client.recv(4096)) == {"ok": True, "code": None, "error": None,
                                                 "receipts": []}
    assert seen and seen[0] != threading.current_thread().name
