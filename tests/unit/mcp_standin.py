"""What the ``cairn mcp`` tests share: a stand-in cairnd on a real Unix socket (answers
each op from a table, records every request and the descriptor a launch passed), the
user's definitions (one exposed, one installed only, one draft, one reinstalled since it
was exposed), and a JSON-RPC client of ``cairn mcp`` run as a real subprocess on stdio."""

from __future__ import annotations

import json
import os
import select
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from cairn.definitions import registry, user
from cairn.protocol.daemon import DaemonReply, ErrorBody
from cairn.workflow.review import review_source

SOURCE = user.draft_source("fix-flaky")
RUN = "flow_" + "3fa9c0d1" * 4
REPLY_SECONDS = 30  # a wait for a line the server owes, not a pause


def review_hash(source: str, name: str) -> str:
    return review_source(source, filename=f"{name}.py").review_hash


def install_definitions(tmp_path: Path) -> None:
    """user:fix-flaky exposed; user:tidy installed only; a draft user:sketch; user:stale
    exposed, then reinstalled with other content (stale until exposed again)."""
    for name, source in (("fix-flaky", SOURCE), ("tidy", SOURCE), ("stale", SOURCE)):
        path = tmp_path / f"{name}.py"
        path.write_text(source)
        user.install(path, review_hash(source, name))
    registry.expose("user:fix-flaky", review_hash(SOURCE, "fix-flaky"))
    registry.expose("user:stale", review_hash(SOURCE, "stale"))
    changed = SOURCE.replace("max_length=4_000", "max_length=5_000")
    path = tmp_path / "stale.py"
    path.write_text(changed)
    user.install(path, review_hash(changed, "stale"), replace=True)
    user.create_draft("sketch")


class StandInDaemon:
    """Answers the daemon socket as cairnd would, from ``answers`` (op → result, or an
    ``ErrorBody`` to refuse with); keeps each request and, for a launch, the identity
    (device, inode) of the descriptor it carried."""

    def __init__(self, path: Path, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.asked: list[dict[str, Any]] = []
        self.passed: list[tuple[int, int]] = []
        self.channels = 0  # attestation channels passed (sockets)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen()
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                line = b""
                while not line.endswith(b"\n"):
                    chunk, fds, _, _ = socket.recv_fds(conn, 1 << 16, 4)
                    for fd in fds:
                        st = os.fstat(fd)
                        if stat.S_ISSOCK(st.st_mode):
                            self.channels += 1
                        else:
                            self.passed.append((st.st_dev, st.st_ino))
                        os.close(fd)
                    if not chunk:
                        break
                    line += chunk
                request = json.loads(line)
                self.asked.append(request)
                answer = self.answers[request["op"]]
                if isinstance(answer, ErrorBody):
                    reply = DaemonReply(ok=False, error=answer)
                else:
                    reply = DaemonReply(ok=True, result=answer)
                conn.sendall(reply.model_dump_json().encode())

    def ops(self) -> list[str]:
        return [r["op"] for r in self.asked]

    def close(self) -> None:
        self.listener.close()


class StdioClient:
    """``cairn mcp`` as a subprocess; one JSON-RPC message a line each way."""

    def __init__(self, cwd: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cairn.cli", "mcp"],
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.next_id = 0

    def send(self, message: dict[str, Any] | bytes) -> None:
        assert self.proc.stdin is not None
        line = message if isinstance(message, bytes) else json.dumps(message).encode()
        self.proc.stdin.write(line + b"\n")
        self.proc.stdin.flush()

    def receive(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], REPLY_SECONDS)
        assert ready, "cairn mcp did not answer"
        line = self.proc.stdout.readline()
        assert line.endswith(b"\n"), f"not a whole line: {line!r}"
        message: dict[str, Any] = json.loads(line)
        return message

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.next_id += 1
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": self.next_id, "method": method}
        if params is not None:
            body["params"] = params
        self.send(body)
        reply = self.receive()
        assert reply["id"] == self.next_id
        return reply

    def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        reply = self.request("tools/call", {"name": name, "arguments": arguments})
        assert "result" in reply, reply
        result: dict[str, Any] = reply["result"]
        return result

    def initialize(self, version: str = "2025-06-18") -> dict[str, Any]:
        reply = self.request(
            "initialize",
            {"protocolVersion": version, "capabilities": {},
             "clientInfo": {"name": "test", "version": "1"}},
        )
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        result: dict[str, Any] = reply["result"]
        return result

    def close(self) -> tuple[int, bytes]:
        """Close stdin (how a client ends the session); the exit status and stderr."""
        assert self.proc.stdin is not None and self.proc.stderr is not None
        self.proc.stdin.close()
        status = self.proc.wait(timeout=REPLY_SECONDS)
        return status, self.proc.stderr.read()
