"""The agent's only channel to the host: JSON lines over /run/cairn/agent.sock.

The coordinator may restart while an agent works (a crash, an upgrade). The channel
reconnects and repeats the message: ``hello`` is answered the same way every time and a
repeated ``finish_work`` with the same content is acknowledged, so repeating is safe.
"""

from __future__ import annotations

import logging
import socket
import time

from cairn.errors import CairnError, ValidationFailed
from cairn.protocol.agent import AgentInstruction, AgentMessage, AgentReply
from cairn.resultjson import ResultInvalid

log = logging.getLogger(__name__)

# The model relay's socket, beside the agent socket in the channel directory.
MODEL_SOCKET = "/run/cairn/agent/model.sock"

RECONNECT_FOR = 600.0


class AgentChannel:
    def __init__(self, path: str, *, reconnect_for: float = RECONNECT_FOR) -> None:
        self.path = path
        self.reconnect_for = reconnect_for
        self.sock: socket.socket | None = None

    def __enter__(self) -> AgentChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self._drop()

    def _drop(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(self.path)
        return sock

    def _send(self, message: AgentMessage) -> AgentReply:
        """Send one message and read its reply, reconnecting while the coordinator is away."""
        deadline = time.monotonic() + self.reconnect_for
        payload = message.model_dump_json().encode() + b"\n"
        while True:
            try:
                if self.sock is None:
                    self.sock = self._connect()
                self.sock.sendall(payload)
                line = self.sock.makefile("rb").readline()
                if not line:
                    raise ConnectionResetError("coordinator closed the socket")
                return AgentReply.model_validate_json(line)
            except OSError as exc:
                self._drop()
                if time.monotonic() > deadline:
                    raise CairnError(f"cannot reach the coordinator at {self.path}: {exc}") from exc
                log.warning("coordinator unreachable (%s); retrying", exc)
                time.sleep(1.0)

    def hello(self) -> AgentInstruction:
        reply = self._send(AgentMessage(type="hello"))
        if not reply.ok or reply.instruction is None:
            raise CairnError(f"no instruction from the coordinator: {reply.error}")
        return reply.instruction

    def note(self, text: str) -> None:
        """Best effort: a note lost to a coordinator restart is not worth failing for."""
        try:
            self._send(AgentMessage(type="note", text=text))
        except CairnError as exc:
            log.warning("note not delivered: %s", exc)

    def finish(self, message: AgentMessage) -> None:
        """Deliver ``finish_work``; :class:`ResultInvalid` if the coordinator refuses the
        result (its reply is ``kind: detail``), ``ValidationFailed`` on any other refusal."""
        reply = self._send(message)
        if reply.ok:
            return
        if reply.refused:
            raise ResultInvalid.from_reason(reply.error or "")
        raise ValidationFailed(f"finish_work refused: {reply.error}")
