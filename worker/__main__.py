"""cairn-worker: the agent runtime inside an agent unit.

Connects to /run/cairn/agent.sock, receives its instruction, runs the profile in
/workspace and ends with exactly one ``finish_work``.
"""

from __future__ import annotations

import logging
import os
import sys

from cairn import journald
from cairn.errors import CairnError
from cairn.worker.channel import AgentChannel
from cairn.worker.profiles import run_profile

log = logging.getLogger("cairn.worker")


def main() -> None:
    journald.setup_logging()
    socket_path = os.environ.get("CAIRN_AGENT_SOCKET", "/run/cairn/agent.sock")
    try:
        with AgentChannel(socket_path) as channel:
            instruction = channel.hello()
            log.info(
                "agent %s attempt %d: %s", instruction.op_id, instruction.attempt, instruction.title
            )
            output, handoff = run_profile(instruction, channel)
            channel.finish(output, handoff)
    except CairnError as exc:
        log.error("%s", exc)
        sys.exit(1)


if __name__ == "__main__":
    main()
