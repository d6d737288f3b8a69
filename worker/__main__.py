"""cairn-worker: the agent runtime inside an agent unit.

Connects to /run/cairn/agent/agent.sock, receives its instruction, runs the profile in
/workspace and ends with exactly one ``finish_work``. The finish message is written to
/outputs/finish.json first, so a coordinator that crashes before it arrives can settle
the operation from the file instead of running the agent again. A result refused here or
by the coordinator (:class:`~cairn.resultjson.ResultInvalid`) is written to
/outputs/result-invalid.json instead, so the coordinator judges the attempt once.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from cairn import journald
from cairn.errors import CairnError
from cairn.failpoints import failpoint
from cairn.fsutil import write_atomic
from cairn.protocol.agent import MESSAGE_LIMIT, AgentMessage
from cairn.protocol.launch import PROFILE_SHA256_ENV, ProfileSpec
from cairn.resultjson import ResultInvalid, check_value
from cairn.worker.channel import AgentChannel
from cairn.worker.profiles import flush_workspace, run_profile

if TYPE_CHECKING:
    from cairn.protocol.jsonvalue import JSONObject, JSONValue

log = logging.getLogger("cairn.worker")

RESULT_FILE = Path("/outputs/finish.json")
INVALID_FILE = Path("/outputs/result-invalid.json")


def write_result(output: Mapping[str, JSONValue], handoff: str, path: Path = RESULT_FILE) -> None:
    write_atomic(path, json.dumps({"output": output, "handoff": handoff}))


def write_invalid(error: ResultInvalid, path: Path = INVALID_FILE) -> None:
    write_atomic(path, json.dumps({"reason": error.reason, "sha256": error.sha256}))


def finish_message(output: JSONObject, handoff: str) -> AgentMessage:
    """The finish message, once it is sure to reach the coordinator whole: JSON types,
    bounded depth, Unicode text, and a line under the socket's limit."""
    check_value(output, "the output")
    check_value(handoff, "the handoff")
    message = AgentMessage(type="finish_work", output=output, handoff=handoff)
    size = len(message.model_dump_json().encode())
    if size >= MESSAGE_LIMIT:
        raise ResultInvalid(
            "size", f"the finish message is {size} bytes; it may have at most {MESSAGE_LIMIT - 1}"
        )
    return message


def _terminate(signum: int, _frame: object) -> None:
    """The worker is PID 1 of the agent's PID namespace, where the kernel drops signals
    that have no handler: without this, stopping the unit would wait for SIGKILL."""
    os._exit(128 + signum)


def check_profile(profile: ProfileSpec) -> None:
    """Run only the profile root froze for this unit: the coordinator that sends it is
    less trusted than the run's owner, as whom this worker runs."""
    expected = os.environ.get(PROFILE_SHA256_ENV, "")
    if profile.sha256() != expected:
        raise CairnError(
            f"the coordinator sent profile {profile.name!r}, which is not the one root froze "
            "for this agent; nothing was run"
        )


def main() -> None:
    if sys.argv[1:2] == ["agent-result"]:  # a command profile's wrapper, not the worker
        from cairn.worker.agent_result import main as agent_result

        sys.exit(agent_result(sys.argv[2:]))
    signal.signal(signal.SIGTERM, _terminate)
    journald.setup_logging()
    socket_path = os.environ.get("CAIRN_AGENT_SOCKET", "/run/cairn/agent/agent.sock")
    try:
        with AgentChannel(socket_path) as channel:
            instruction = channel.hello()
            check_profile(instruction.profile)
            log.info(
                "agent %s attempt %d: %s", instruction.op_id, instruction.attempt, instruction.title
            )
            try:
                message = finish_message(*run_profile(instruction, channel))
                if instruction.attempt == 1:
                    failpoint("agent-before-finish", Path("/state"))
                flush_workspace(os.environ.get("CAIRN_WORKSPACE", "/workspace"))
                write_result(message.output, message.handoff)
                if instruction.attempt == 1:  # the result is on disk, never delivered
                    failpoint("agent-after-result-file", Path("/state"))
                channel.finish(message)
            except ResultInvalid as exc:
                RESULT_FILE.unlink(missing_ok=True)
                write_invalid(exc)
                raise
    except CairnError as exc:
        log.error("%s", exc)
        sys.exit(1)


if __name__ == "__main__":
    main()
