"""The agent's only channel to the host: JSON lines over /run/cairn/agent.sock."""

from __future__ import annotations

import socket
from typing import Any

from cairn.errors import CairnError, ValidationFailed
from cairn.models import AgentInstruction, AgentMessage, AgentReply


class AgentChannel:
    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.connect(path)
        except OSError as exc:
            raise CairnError(f"cannot reach the coordinator at {path}: {exc.strerror}") from exc
        self.stream = self.sock.makefile("rwb")

    def __enter__(self) -> AgentChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def _send(self, message: AgentMessage) -> AgentReply:
        self.stream.write(message.model_dump_json().encode() + b"\n")
        self.stream.flush()
        line = self.stream.readline()
        if not line:
            raise CairnError("the coordinator closed the agent socket")
        return AgentReply.model_validate_json(line)

    def hello(self) -> AgentInstruction:
        reply = self._send(AgentMessage(type="hello"))
        if not reply.ok or reply.instruction is None:
            raise CairnError(f"no instruction from the coordinator: {reply.error}")
        return reply.instruction

    def note(self, text: str) -> None:
        self._send(AgentMessage(type="note", text=text))

    def finish(self, output: dict[str, Any], handoff: str) -> None:
        reply = self._send(AgentMessage(type="finish_work", output=output, handoff=handoff))
        if not reply.ok:
            raise ValidationFailed(f"finish_work refused: {reply.error}")
