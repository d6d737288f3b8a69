"""docs/performance.md from a :class:`measure.Results`: machine, command, targets with
their verdicts, one table per figure, and what each figure includes. Every number comes
from the results; nothing here is typed in."""

from __future__ import annotations

from measure import Cell, Results, fmt_seconds
from verdicts import PROFILED_PREFIX, SEARCH_ALONE, SEND_ALONE, find, part, verdicts

FIGURES = (
    ("boundary", "Boundary overhead after an agent finishes"),
    ("quiesce", "QUIESCE proof (part of the boundary that needs systemd)"),
    ("checkpoint", "Checkpoint of W"),
    ("restore", "Restore W from S"),
    ("changes", "Change detection Q→P"),
    ("apply", "Three-way apply"),
    ("fork", "Fork of lanes"),
    ("replay", "Replay to the frontier"),
    ("unit", "Agent unit start → worker ready"),
    ("launch", "One-agent run: cairn launch → succeeded"),
    ("start", "Python start of each process a run starts (import only)"),
    ("concurrent", "One-agent runs launched at once by two users"),
    ("cpu", "CPU time per run, runs launched at once"),
    ("memory", "Resident memory"),
    ("journal", "Journal commit rate (settle+commit pairs per second)"),
)

INCLUDES = {
    "boundary": (
        "Timed from the moment the agent's unit has stopped until the operation is "
        "committed, with the library calls the coordinator and the broker make, in one "
        "process: `Journal.update_op` (finish, `op-finished`); `Journal.add_intents` "
        "(the `checkpoint` intent); the broker's checkpoint handler — "
        "`Journal.intents(run, 'storage-v1')`, a `ReceiptStore.get` per intent, "
        "`Journal.get_op_by_id`, `ReceiptStore.for_run` to find the start-agent receipt, "
        "`Pool.snapshot(W, S, read_only=True)` with its `SubvolumeReceipt`, "
        "`ReceiptStore.put`; `Journal.record_receipts`; MATERIALIZE — the `Boundary` "
        "model and `boundary.json`, `handoff.md`, `result.json` each written to a temp "
        "file, fsync'd and renamed (as the coordinator does); COMMIT — "
        "`Journal.update_op` to `settled` (result, checkpoint) and to `committed`. "
        "The agent made 10 edits in W just before and flushed them, as the worker does "
        "(`syncfs` of /workspace before `finish_work`, in the agent's own time). "
        "Not included: "
        "the broker socket round trips and process start of the broker (socket "
        "activation), and QUIESCE's systemd queries, which are timed separately in the "
        "booted machine (next table) because this host has no systemd PID 1. The journal "
        "and the broker's receipts live on the host's root filesystem, the pool on the "
        "loop Btrfs."),
    "quiesce": (
        "`cairn.broker.units.require_quiesced(unit, cgroup)` on a stopped agent unit inside "
        "the booted machine: `GetUnit` + properties over D-Bus and the cgroup emptiness "
        "check. Add it to the boundary figure for the whole QUIESCE → COMMIT cost."),
    "checkpoint": (
        "Each round the agent first makes 10 edits in W (7 modified, 2 created, 1 "
        "deleted) and flushes them (`syncfs`, untimed: the worker does it in the agent's "
        "own time before `finish_work`). Cairn: `Pool.snapshot(W, S, read_only=True)` "
        "returning the receipt. The `flushed` rows take the same snapshot after a full "
        "`sync` (untimed). "
        "Shadow git: `git add -A` and `git commit` with `GIT_DIR` in a separate directory "
        "and W as work tree; the first commit of the whole tree is made once beforehand "
        "and not timed, so this is the incremental cost. Shadow git honours the project's "
        "`.gitignore` (the build directory is not captured); the snapshot and `cp -a` "
        "capture everything. `cp -a` copies W to a new directory on the same Btrfs; "
        "coreutils 9 clones file data (reflink) there by default, so this is `cp -a` at "
        "its cheapest."),
    "restore": (
        "After a checkpoint the agent makes 10 more edits; then W is brought back to the "
        "checkpoint. Cairn: a writable snapshot of S as the next W generation, chown'd "
        "to the owner (the broker's `create-w` from a checkpoint); deleting the old "
        "generation is deferred and not timed. The `hot spare` rows are a reject after "
        "an accept (`broker/spare.py`): the spare, a writable snapshot of S made at the "
        "accept (untimed), checked untouched against its receipt (same subvolume, "
        "writable, generation unchanged, a snapshot of S), renamed to the next W "
        "generation and its receipt taken (`cairn.broker.spare.swap`). "
        "Git: `git checkout -f <commit>` and "
        "`git clean -f -d` in W. `cp -a` back: `rm -rf` of the edited tree's entries and "
        "`cp -a` of the copy made at checkpoint time into it."
        " The hot spare's rows and its target (median ≤ 2 ms at 100,000 files) are in "
        "this run's tables."),
    "changes": (
        "Q is a read-only snapshot of W; P is Q plus k edits in a branch of W, frozen. "
        "Cairn's tree-search diff is the settlement's source: root's record of the inodes P "
        "changed since Q's generation (`cairn.treesearch.change_record(Q, P)`, a Btrfs tree "
        "search) read by `cairn.settle.generations.changes_from_record(record, Q, P)`, as "
        "the owner's candidate unit reads it. The send-stream diff is its fallback, used "
        "when P does not descend from Q by snapshots: `cairn.settle.changes.changes(Q, P)` "
        "(`btrfs send --no-data -p Q P` and the stream replay). Git: "
        "`git status --porcelain` with the shadow repository whose HEAD and index match Q. "
        "Hash walk: SHA-256 of every file's content and every symlink target of P (Python, "
        "`os.walk`). The Targets table judges the tree-search diff (the send-stream diff in "
        "results without it) and explains a size where it loses to `git status` by its "
        "part alone (the tree search, or the send).\n\n"
        "Where the time goes: `.venv/bin/python tests/bench/diff_figures.py`, run as root, "
        "times both diffs, the tree search alone, the kernel's `btrfs send --no-data` alone, "
        "the send stream's replay alone (`changes_in`: parse, replay, `lstat` of Q and P) and "
        "`git status --porcelain`; `--profile` splits the send-stream diff (wall and CPU of "
        "the send); `--changes-from FILE` measures another `cairn/settle/changes.py` "
        "interleaved with this one; `--node-size 4096` makes the pool with 4 KiB nodes."
        "{rows}"),
    "apply": (
        "`cairn.settle.apply(Q, F, live, accepted, receipts)` where F is the candidate "
        "`cairn.settle.build_candidate` made from the same changes (untimed), and the live "
        "project is a fresh writable copy of Q each round (untimed). Includes the "
        "three-way plan (hashing Q, F and live for every path) and the receipts, written "
        "in batches of 1,024 paths once a `syncfs` has made them durable "
        "(`cairn/settle/apply.py`). The live project is on the pool's Btrfs here, so each "
        "temporary is a reflink of F and the apply makes one `syncfs`, after its renames "
        "(bytes copied from another filesystem get one more, before them).\n\n"
        "Where the time goes: {rows}, and "
        "`.venv/bin/python tests/bench/apply_figures.py --sizes 1000,100000 --profile` "
        "(run as root; `--apply-from FILE` measures an earlier `cairn/settle/apply.py` "
        "the same way, for a before/after; `--own-live` also times applies into a live "
        "project with its own metadata, Q → F and back, for a project that is no fresh "
        "snapshot). The apply is bounded no longer by a per-path fsync but by Btrfs's cost "
        "of changing 1,000 entries scattered over a large tree (renames, the `syncfs`) "
        "and by the plan's three reads per path, each a lookup in a tree that is cold in "
        "a fresh snapshot."),
    "fork": (
        "From one checkpoint S: Cairn verifies S against its receipt and makes one "
        "writable snapshot per lane as that lane's W (chown'd to the owner). `cp -a`: one "
        "copy of S per lane on the same Btrfs (reflinked data)."),
    "replay": (
        "A journal holds a run of the workflow below with N committed agent operations. "
        "Timed: the real coordinator (`Coordinator(run_id)` and `replay_once()`) "
        "opening the journal and loading the run, starting the control worker (`python "
        "-I -m cairn.workflow.runtime`) with the results of the committed calls, and "
        "checking every call the worker reports against the journal — manifest by call "
        "site, identity (kind, request hash, source location, predecessor) — until the "
        "workflow returns and its output is validated. The workflow is a `for` loop "
        "over `range(N)` calling `flow.agent` once per step."),
    "unit": (
        "In a booted Debian 13 machine (systemd-nspawn, systemd 257) with the package "
        "installed. Cairn: `Systemd.start_transient_service` with the full agent property "
        "set (`agent_unit_properties`: run owner, `ProtectSystem=strict`, masks, bind "
        "mounts of W, evidence, outputs, state and the socket, limits, private network, "
        "and the isolation from other processes: `PrivatePIDs=`, empty `/run`, private "
        "`/dev/shm`) "
        "until the process in the unit has connected to `/run/cairn/agent/agent.sock` and sent "
        "hello (a `python3 -I -S` one-liner: the worker's hello without the worker's "
        "imports). `start job done` is when `wait_started` returns (exec succeeded). "
        "The `without PrivatePIDs` row is the same unit without that isolation, started "
        "alternately with the isolated one: what the isolation costs at start. "
        "Each `same, without …` row leaves out one group of the agent's properties "
        "(started in turn with the full unit): where the start job's time goes. "
        "The bare row is the same D-Bus client starting a unit with no sandbox that runs "
        "`/bin/true`, until it has exited — what `systemd-run --wait true` does."),
    "launch": (
        "In a booted Debian 13 machine (systemd-nspawn, systemd 257) with the package "
        "installed and a loop Btrfs pool at `/var/lib/cairn/pool`: alice runs `cairn launch "
        "builtin:implement --scripted builtin:implementer=FILE` on a project of one file in "
        "her home (so Q is an import), with a scripted agent appending one line; one run "
        "after another, after one untimed warm-up run. Timed from invoking `cairn launch` "
        "(wall clock in the machine) until the journal's `run-succeeded` event; the `cairn "
        "launch returns` row is the launch process alone. The `of which` rows split each "
        "run at the journal's own timestamps: `run-created`, `lease-acquired`, the "
        "receipts of `create-w.root.1`, `start-agent.root-1.1`, `settle-candidate` and "
        "`start-apply.1`, and the `op-finished`, `op-committed` and `run-succeeded` events; "
        "their medians need not add up to the median of the whole. The bench polls the "
        "journal database read-only every 10 ms to learn that a run has ended "
        "(`tests/bench/run_figures.py`)."),
    "start": (
        "In the same machine, nothing else running: the wall time of `python3 -I -c "
        "'import MODULE'` (five times each) for the module each of a run's processes "
        "starts from, as the package installed it; the first row is Python alone. A run "
        "starts the CLI, a coordinator with its control worker, an import unit (Q of a "
        "project off the pool), an agent worker, a candidate unit and an apply unit; a "
        "run with model providers also a model egress unit (`Type=notify`, ordered "
        "before the coordinator, so the coordinator starts once it is ready), which PID 1 "
        "skips for any other run (`ConditionPathExists=!` on a flag the broker makes "
        "for a run without providers, `units/cairn-egress@.service`). "
        "The coordinator's main imports `cairn.coordinator.core` once it has checked its "
        "argument: that row is what every coordinator loads. "
        "The agent worker really starts from the sealed capsule (`python3 -I -B`, "
        "without bytecode); the row here imports the same module from the package."),
    "concurrent": (
        "The same machine and workflow: half the runs on projects of alice, half on "
        "projects of bob (the variant column says how many), one run per project, every "
        "`cairn launch` process started together (a thread each, released by one "
        "barrier). Each run's times and phases are taken as in the previous table; the "
        "`all succeeded` row is from the first invocation until the last "
        "`run-succeeded`."),
    "cpu": (
        "The CPU time (user + system) of the concurrent batch above divided by the number "
        "of runs, by the unit each process ran in. nspawn on this host gives the machine "
        "no cgroup controllers (`CPUUsageNSec` and `MemoryCurrent` are unset), so the "
        "bench counts processes instead: BSD process accounting (`acct(2)`) records every "
        "process of the machine that exits, and a scan of `/proc` every 20 ms reads each "
        "new process's unit from its cgroup (one that ended unseen counts as its "
        "parent's; a unit that is not Cairn's is named); processes that live on (cairnd, "
        "the broker, systemd, D-Bus, journald) count by the growth of their "
        "`/proc/PID/stat` times. The kernel records each ended process's user and system "
        "times in whole 10 ms ticks, truncated, so the rows of processes that ended "
        "undercount by up to 20 ms per process (the row says how many per run); the "
        "`cairn launch` row is exact (`getrusage` of the bench's children), and the same "
        "processes as process accounting saw them are shown, not counted, for comparison."),
    "memory": (
        "`VmRSS` from `/proc/PID/status` in the same machine. cairnd at rest: after the "
        "launch figures, with no run going. One agent waiting: a scripted agent that "
        "sleeps 5 s before its edit, read 2 s after its unit became active; the process "
        "rows are each unit's `MainPID`, the unit rows sum every process in the unit's "
        "cgroup (the coordinator's includes its control worker). The concurrent rows are "
        "sampled every 250 ms during the concurrent runs: resident memory summed over "
        "every process in the machine (shared pages counted once per process, so an upper "
        "bound; `RssAnon` counts only anonymous pages), and the host's used memory "
        "(`MemTotal − MemAvailable`: reclaimable page cache is not in it, and anything "
        "else the host ran meanwhile is)."),
    "journal": (
        "Per round, N operations are first recorded and started (untimed); timed: for "
        "each, `Journal.update_op(state='settled', result=…, checkpoint=…)` and "
        "`Journal.update_op(state='committed')`, each one fenced `BEGIN IMMEDIATE` "
        "transaction with its event row. Raw SQLite: the same file system and pragmas "
        "(WAL, `synchronous=FULL`, foreign keys, busy timeout), two transactions of one "
        "`INSERT` each per pair with the same JSON payload. Rates are pairs per second "
        "per round; the p95 column is the 5th percentile of the rate (95 % of rounds "
        "were at least that fast)."),
}


# What an INCLUDES text says at ``{rows}``, one part per prefix: the first text when the
# figure has rows whose method starts with the prefix, the second for results made before
# those rows existed.
ROWS = {
    "changes": (
        (SEARCH_ALONE, (
            " The `of which: tree search alone` rows time root's `change_record(Q, P)` by "
            "itself, back to back with the others on the same Q and P.", "")),
        (SEND_ALONE, (
            " The `of which: btrfs send alone` rows time the fallback's "
            "`btrfs send --no-data -p Q P` by itself (its stream to /dev/null), back to back "
            "with the others on the same Q and P.", "")),
    ),
    "apply": (
        (PROFILED_PREFIX, (
            "the `of which, one apply under cProfile` rows — one apply of the same changes "
            "at the smallest and the largest size under the profiler: the whole apply "
            "(slower than without it), the plan's cumulative time, and each phase's own "
            "time summed over its calls (hashing and stat are also part of the plan)",
            "the profiled applies in the Notes below")),
    ),
}


def includes(figure: str, cells: list[Cell]) -> str:
    """What ``figure``'s table includes, worded for the rows these results have."""
    text = INCLUDES[figure]
    if figure in ROWS:
        rows = "".join(present if any(c.method.startswith(prefix) for c in cells) else absent
                       for prefix, (present, absent) in ROWS[figure])
        text = text.replace("{rows}", rows)
    return text


def fmt(cell: Cell, value: float) -> str:
    if cell.unit == "bytes":
        return f"{value / (1 << 20):,.1f} MiB"
    return f"{value:,.0f}/s" if cell.unit == "per_s" else fmt_seconds(value)


def _cpu_bound(results: Results) -> list[str]:
    """What the CPU time per run means for the concurrent batch on this machine."""
    per_run = find(results.cells, "cpu", "every process")
    everything = find(results.cells, "concurrent", "first launch → all")
    if per_run is None or everything is None:
        return []
    runs = int(everything.variant.split()[0])
    cpus = results.machine.cpus
    floor = runs * per_run.median / cpus
    return [f"At {fmt_seconds(per_run.median)} of CPU per run, {runs} runs keep this "
            f"machine's {cpus} CPUs busy for at least {floor:.1f} s; all were done after "
            f"{fmt_seconds(everything.median)} ({floor / everything.median:.0%} of that time "
            "is the CPU floor). To finish within 20 s, a run may use at most "
            f"{fmt_seconds(20 * cpus / runs)} of CPU here.", ""]


def _versus(c: Cell, base: Cell, label: str) -> str:
    ratio = c.median / base.median
    if ratio >= 1:
        return f"**{ratio:.1f}× slower** than Cairn{label}"
    return f"**{1 / ratio:.1f}× faster** than Cairn{label}"


def _figure_table(cells: list[Cell]) -> list[str]:
    lines = ["| files | variant | method | median | p95 | n | vs Cairn (same run) |",
             "| ---: | --- | --- | ---: | ---: | ---: | --- |"]
    groups: dict[tuple[int | None, str], list[Cell]] = {}
    for c in cells:
        groups.setdefault((c.size, c.variant), []).append(c)
    for (size, variant), group in groups.items():
        bases = [c for c in group if c.cairn and not part(c)]
        base = bases[0] if bases else None
        for c in sorted(group, key=lambda c: (not c.cairn, part(c))):
            if c is base or base is None or c.unit == "bytes":
                versus = "—"
            elif c.cairn:
                versus = f"{c.median / base.median:.2f}× of it"
            elif c.unit == "per_s":
                versus = f"Cairn reaches {base.median / c.median:.2f}× this rate"
            else:
                versus = "; ".join(
                    _versus(c, b, f" ({b.method})" if len(bases) > 1 else "") for b in bases)
            name = f"Cairn: {c.method}" if c.cairn else c.method
            lines.append(
                f"| {'' if size is None else f'{size:,}'} | {variant} | {name} | "
                f"{fmt(c, c.median)} | {fmt(c, c.p95)} | {len(c.samples)} | {versus} |")
    return lines


def render(results: Results, workflow_source: str, json_name: str) -> str:
    m = results.machine
    lines = [
        "# Performance",
        "",
        "Generated by the benchmark suite in `tests/bench/`; do not edit by hand, run it "
        f"again. The machine-readable results of the same run are in `{json_name}`.",
        "",
        "```",
        results.command,
        "```",
        "",
        f"Run started {results.started_at}, took {results.duration_s / 60:.1f} min"
        f"{' (quick smoke run: small sizes, few samples)' if results.quick else ''}. "
        f"Project sizes: {', '.join(f'{s:,}' for s in results.sizes)} files; up to "
        f"{results.repeat} samples per figure, fewer where a cell's {results.cell_budget_s:g} s "
        "budget ran out (the n column). Median and p95 (nearest rank; with fewer than 20 "
        "samples the p95 is the slowest sample).",
        "",
        "## Machine",
        "",
        "| | |",
        "| --- | --- |",
        f"| kernel | {m.kernel} |",
        f"| OS | {m.os_release} |",
        f"| CPU | {m.cpu}, {m.cpus} CPUs |",
        f"| memory | {m.memory_gib} GiB |",
        f"| Python | {m.python} |",
        f"| tools | {m.btrfs_progs}; {m.git}; {m.coreutils}; SQLite {m.sqlite} |",
        "",
        "## Targets",
        "",
        "| target | measured | met | missed by | why (measured) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for v in verdicts(results):
        met = "yes" if v.met else "**no**"
        lines.append(f"| {v.target} | {v.measured} | {met} | {v.miss or '—'} | "
                     f"{v.why or '—'} |")
    lines += ["", "## Figures", ""]
    for figure, title in FIGURES:
        cells = [c for c in results.cells if c.figure == figure]
        if not cells:
            continue
        lines += [f"### {title}", "", *_figure_table(cells), "", includes(figure, cells), ""]
        if figure == "cpu":
            lines += _cpu_bound(results)
        if figure == "replay":
            lines += ["```python", workflow_source.rstrip(), "```", ""]
    if results.notes:
        lines += ["## Notes", ""]
        lines += [f"- {note}" for note in results.notes]
        lines.append("")
    return "\n".join(lines)
