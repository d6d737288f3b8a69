"""cairn-coordinator RUN_ID: run by cairn-coordinator@RUN_ID.service as user cairn."""

from __future__ import annotations

import logging
import sys

from cairn import journald
from cairn.errors import CairnError
from cairn.protocol.names import is_run_id


def main() -> None:
    journald.setup_logging()
    if len(sys.argv) != 2 or not is_run_id(sys.argv[1]):
        print("usage: cairn-coordinator flow_<32 hex>", file=sys.stderr)
        sys.exit(2)
    from cairn.background import yield_own_session
    from cairn.coordinator.core import Coordinator
    from cairn.journal.runs import Busy, RunEnded
    from cairn.protocol.base import build_loaded_models

    build_loaded_models()  # before its threads (relay, agent socket, budget) use one
    yield_own_session()  # the broker did when it started the unit; not when systemd restarts it

    try:
        sys.exit(Coordinator(sys.argv[1]).run())
    except (Busy, RunEnded) as exc:  # held by another, or ended before it could start
        logging.getLogger("cairn.coordinator").warning("%s", exc)
        sys.exit(0)
    except CairnError as exc:
        logging.getLogger("cairn.coordinator").error("%s", exc)
        sys.exit(1)


if __name__ == "__main__":
    main()
