"""The coordinator's side of one agent's socket (bound to /run/cairn/agent.sock in the unit).

Only the run owner's UID may connect. The agent says ``hello`` and gets its instruction;
``note``/``progress`` are recorded; ``finish_work`` is validated against the descriptor's
output schema and, once valid, handed to the coordinator exactly once. A finish whose
output fails the schema, or a line past :data:`MESSAGE_LIMIT`, is refused as the
attempt's invalid result (:attr:`AgentSocket.refused`); the worker ends on that answer.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ValidationError

from cairn.canonical import sha256_hex
from cairn.protocol.agent import MESSAGE_LIMIT, AgentInstruction, AgentMessage, AgentReply
from cairn.resultjson import ResultInvalid
from cairn.validation import first_error

log = logging.getLogger(__name__)

__all__ = ["MESSAGE_LIMIT", "AgentSocket"]
MAX_NOTES = 500  # kept for boundary.json; ``on_note`` already cut and rate-limited them


class AgentSocket:
    """Serve one agent operation until it finishes (or the coordinator closes it)."""

    def __init__(
        self,
        path: Path,
        *,
        owner_uid: int,
        instruction: AgentInstruction,
        output_model: type[BaseModel],
        on_note: Callable[[str], str | None],
    ) -> None:
        self.path = path
        self.owner_uid = owner_uid
        self.instruction = instruction
        self.output_model = output_model
        self.on_note = on_note
        self.finished = threading.Event()
        self.finish: AgentMessage | None = None
        self.refused: ResultInvalid | None = None
        self.notes: list[str] = []
        path.parent.mkdir(mode=0o711, parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            path.unlink()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        os.chmod(path, 0o666)  # noqa: S103  (the owner's UID connects; SO_PEERCRED decides)
        self.sock.listen(4)
        self.thread = threading.Thread(target=self._serve, name=f"agent-{path.name}", daemon=True)
        self.thread.start()

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            if self.path.exists():
                self.path.unlink()

    def _serve(self) -> None:
        while not self.finished.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _pid, uid, _gid = struct.unpack("3i", creds)
            if uid != self.owner_uid:
                log.warning("refused agent socket connection from uid %d", uid)
                return
            # Two streams: BufferedRWPair.readline can return more than its limit.
            stream, out = conn.makefile("rb"), conn.makefile("wb")
            while True:
                line = stream.readline(MESSAGE_LIMIT)
                if not line:
                    return
                if not line.endswith(b"\n") and len(line) >= MESSAGE_LIMIT:
                    reply = self._refuse(ResultInvalid(
                        "size", f"a message may have at most {MESSAGE_LIMIT - 1} bytes",
                        sha256=sha256_hex(line),
                    ))
                    out.write(reply.model_dump_json().encode() + b"\n")
                    out.flush()
                    return  # the rest of that line is no message
                reply = self._answer(line)
                out.write(reply.model_dump_json().encode() + b"\n")
                out.flush()

    def _answer(self, line: bytes) -> AgentReply:
        try:
            message = AgentMessage.model_validate_json(line)
        except ValidationError as exc:
            return AgentReply(ok=False, error=f"malformed message: {exc.errors()[0]['msg']}")
        if message.type == "hello":
            return AgentReply(ok=True, instruction=self.instruction)
        if message.type in ("note", "progress"):
            admitted = self.on_note(message.text)
            if admitted is not None and len(self.notes) < MAX_NOTES:
                self.notes.append(admitted)
            return AgentReply(ok=True)
        if self.finished.is_set():
            if message == self.finish:
                return AgentReply(ok=True)  # the agent repeated it after a reconnect
            return AgentReply(ok=False, error="a different finish_work was already accepted")
        try:
            self.output_model.model_validate(message.output)
        except ValidationError as exc:
            where, problem = first_error(exc)
            at = f"output.{where}" if where else "output"
            return self._refuse(ResultInvalid("schema", f"{at}: {problem}",
                                              sha256=sha256_hex(line)))
        self.finish = message
        self.finished.set()
        return AgentReply(ok=True)

    def _refuse(self, invalid: ResultInvalid) -> AgentReply:
        """Refuse a result; the latest refusal is the attempt's if no finish follows."""
        self.refused = invalid
        return AgentReply(ok=False, refused=True, error=invalid.reason)
