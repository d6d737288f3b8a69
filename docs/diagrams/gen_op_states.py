"""Write op-states.dot from the journal's transition table (cairn.journal.operations), so
the picture of an operation's states is the table the journal enforces:
``python3 docs/diagrams/gen_op_states.py > docs/diagrams/op-states.dot``."""

from __future__ import annotations

import sys

from cairn.journal.operations import OP_TRANSITIONS

FINAL = ("committed", "failed", "not-started")


def dot() -> str:
    lines = [
        "// An operation's states: generated from OP_TRANSITIONS in",
        "// cairn/journal/operations.py by docs/diagrams/gen_op_states.py; do not edit.",
        "digraph op_states {",
        "    rankdir=LR;",
        '    node [shape=box, style=rounded, fontname="sans-serif", fontsize=10];',
    ]
    for state in OP_TRANSITIONS:
        extra = " [peripheries=2]" if state in FINAL else ""
        lines.append(f'    "{state}"{extra};')
    for state, targets in OP_TRANSITIONS.items():
        for target in sorted(targets):
            lines.append(f'    "{state}" -> "{target}";')
    lines.append("}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(dot())
