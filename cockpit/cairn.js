/* Cairn's Cockpit page: the runs, one run, and what waits for a person.
 *
 * It talks to Cairn only by spawning `cairn ... --json` as the logged-in user, so every
 * permission is the CLI's. Everything Cairn returns may hold text an agent or a workflow
 * wrote: it reaches the page only as DOM text (textContent, never markup), and no value
 * from it becomes a URL, a handler or an attribute that could run. */
"use strict";

(function () {
    const POLL_MS = 3000;
    const LOG_LINES = 100;
    const FAILED_DAYS = 7; // the inbox lists the failed runs of the last week
    const STATES = ["queued", "pending", "running", "waiting", "paused", "blocked",
        "succeeded", "failed", "stopped", "cancelled"];
    const ENDED = ["succeeded", "failed", "stopped", "cancelled"];
    const view = document.getElementById("view");
    const status = document.getElementById("status");
    let timer = null;
    let shown = null; // the path drawn last, to keep a form the person is filling in
    let drawn = null; // what cairn answered for it

    /* PatternFly's classes (Cockpit's, see index.html) of the elements the page makes:
     * every table is a compact PatternFly table, every button a PatternFly button. */
    const PF = {
        table: "pf-v6-c-table pf-m-compact",
        thead: "pf-v6-c-table__thead",
        tbody: "pf-v6-c-table__tbody",
        tr: "pf-v6-c-table__tr",
        th: "pf-v6-c-table__th",
        td: "pf-v6-c-table__td",
        button: "pf-v6-c-button",
    };
    // Actions that end, undo or delete: PatternFly's danger buttons.
    const DANGER = ["Cancel", "Delete storage", "Reject", "Revert"];

    /* An element with attributes and children; a child string becomes a text node. */
    function h(tag, attrs, ...children) {
        const node = document.createElement(tag);
        for (const [key, value] of Object.entries(attrs || {})) {
            if (value === null || value === undefined || value === false)
                continue;
            if (key === "class")
                node.className = value;
            else if (key.startsWith("on"))
                node.addEventListener(key.slice(2), value);
            else
                node.setAttribute(key, value === true ? "" : String(value));
        }
        if (PF[tag])
            node.classList.add(...PF[tag].split(" "));
        for (const child of children.flat()) {
            if (child === null || child === undefined || child === false)
                continue;
            node.append(child instanceof Node ? child : String(child));
        }
        return node;
    }

    /* `cairn ARGS` (with ``input`` on its stdin): a Promise of its stdout, or of an Error
     * with what it printed on stderr (a native Promise: what cockpit.spawn returns chains
     * its own way). */
    function cairn(args, input) {
        return new Promise((resolve, reject) => {
            const proc = cockpit.spawn(["cairn", ...args], {
                err: "message",
                environ: ["LC_ALL=C.UTF-8", "NO_COLOR=1", "PAGER=cat"],
            });
            if (input !== undefined)
                proc.input(input);
            // a refusal cairn explains on stdout (a revert's conflicts) is said too
            proc.then(resolve, (ex, out) => {
                const said = [(out || "").trim(), (ex.message || ex.problem || String(ex)).trim()];
                reject(new Error(said.filter(Boolean).join("\n")));
            });
        });
    }

    function cairnJSON(args) {
        return cairn([...args, "--json"]).then(out => JSON.parse(out));
    }

    function say(text, failed) {
        status.textContent = text;
        status.classList.toggle("cairn-status-error", Boolean(failed));
    }

    function age(epoch) {
        const s = Math.max(0, Date.now() / 1000 - epoch);
        if (s < 60)
            return `${Math.floor(s)} s`;
        if (s < 3600)
            return `${Math.floor(s / 60)} min`;
        if (s < 86400)
            return `${Math.floor(s / 3600)} h`;
        return `${Math.floor(s / 86400)} d`;
    }

    const LABEL_COLOUR = {
        running: "blue", started: "blue", pending: "blue", queued: "blue",
        succeeded: "green", committed: "green", accepted: "green",
        waiting: "orange", paused: "orange", blocked: "orange", requested: "orange",
        failed: "red", uncertain: "red", rejected: "red", refused: "red",
    };

    /* A state as a PatternFly label, coloured by what it asks of a person. */
    function stateBadge(state) {
        const known = /^[a-z-]{1,20}$/.test(state) ? state : "other";
        const colour = LABEL_COLOUR[known] ? ` pf-m-${LABEL_COLOUR[known]}` : "";
        return h("span", { class: `pf-v6-c-label pf-m-compact${colour} cairn-state cairn-state-${known}` },
            h("span", { class: "pf-v6-c-label__content" },
                h("span", { class: "pf-v6-c-label__text" }, state)));
    }

    /* A form control as PatternFly wraps it. */
    function control(input) {
        const kind = input.tagName === "TEXTAREA" ? " pf-m-textarea pf-m-resize-vertical" : "";
        return h("span", { class: `pf-v6-c-form-control${kind}` }, input);
    }

    function runLink(runId) {
        return h("a", {
            href: "#/run/" + encodeURIComponent(runId),
            onclick: ev => { ev.preventDefault(); go(["run", runId]) },
        }, runId);
    }

    function go(path) {
        cockpit.location.go(path);
    }

    function confirmed(question) {
        return window.confirm(question);
    }

    /* A button that runs `cairn ARGS` once confirmed, then reports what cairn said (and
     * hands it to ``then``). */
    function action(label, args, question, then) {
        return h("button", {
            class: DANGER.includes(label) ? "pf-m-secondary pf-m-danger" : "pf-m-secondary",
            type: "button",
            onclick: ev => {
                if (question && !confirmed(question))
                    return;
                ev.target.disabled = true;
                say("");
                cairn(args)
                    .then(out => { say(out.trim() || `${label}: done`); if (then) then(out) })
                    .catch(ex => say(ex.message, true))
                    .finally(() => { ev.target.disabled = false; refresh(true) });
            },
        }, label);
    }

    /* `cairn replay RUN --through OP` as a button: a new run from the run's checkpoint,
     * shown once cairn made it. */
    function replayAction(runId, through) {
        return action(`Retry from ${through}`, ["replay", "--through", through, "--", runId],
            `Start a new run from run ${runId}'s checkpoint at ${through}? The operations up to ` +
            `it are imported; the rest of the workflow runs fresh.`,
            out => {
                const made = /^(flow_[0-9a-f]{32}):/.exec(out.trim());
                if (made)
                    go(["run", made[1]]);
            });
    }

    function errorBox(ex) {
        return h("div", { class: "pf-v6-c-alert pf-m-danger pf-m-inline", role: "alert" },
            h("p", { class: "pf-v6-c-alert__title cairn-error" }, ex.message));
    }

    // --- Runs ---------------------------------------------------------------------------

    let filter = "";
    let everyone = false; // `cairn list --all`: every user's runs (for cairn-admin)

    function runsPage(runs) {
        const select = h("select", {
            id: "state-filter",
            "aria-label": "Show runs in state",
            onchange: ev => { filter = ev.target.value; refresh(true) },
        }, h("option", { value: "" }, "all states"),
        STATES.map(s => h("option", { value: s, selected: s === filter }, s)));
        const rows = runs.filter(r => !filter || r.state === filter);
        const table = h("table", { class: "cairn-table", id: "runs" },
            h("thead", null, h("tr", null,
                ["Run", "State", "Definition", "Project", "Current operation", "Settlement",
                    "Age"].map(c => h("th", { scope: "col" }, c)))),
            h("tbody", null, rows.map(r => h("tr", { "data-run": r.run_id },
                h("td", { "data-label": "Run" }, runLink(r.run_id)),
                h("td", { "data-label": "State" }, stateBadge(r.state),
                    r.position ? ` #${r.position}` : null),
                h("td", { "data-label": "Definition" }, r.definition),
                h("td", { "data-label": "Project", class: "cairn-path" }, r.project),
                h("td", { "data-label": "Current operation" }, r.current_op
                    ? `${r.current_op.kind} ${r.current_op.op_id} (${r.current_op.state})`
                    : "—"),
                h("td", { "data-label": "Settlement" },
                    r.settlement_summary ? r.settlement_summary.label : "—"),
                h("td", { "data-label": "Age", "data-created": r.created_at },
                    age(r.created_at))))));
        const all = h("input", {
            id: "all-users", type: "checkbox", checked: everyone,
            onchange: ev => { everyone = ev.target.checked; refresh(true) },
        });
        return h("section", { "aria-labelledby": "runs-heading" },
            h("div", { class: "cairn-toolbar" },
                h("h2", { id: "runs-heading" }, "Runs"),
                h("label", { for: "state-filter" }, "State "), select,
                h("label", { for: "all-users" }, all, " All users")),
            rows.length ? table : h("p", { class: "cairn-empty" }, "No runs."));
    }

    // --- One run ------------------------------------------------------------------------

    function diffView(diff) {
        const lines = diff.diff ? diff.diff.replace(/\n$/, "").split("\n") : [];
        const kind = line => line.startsWith("+++") || line.startsWith("---") ? "file"
            : line.startsWith("@@") ? "hunk"
                : line.startsWith("+") ? "add"
                    : line.startsWith("-") ? "del"
                        : line.startsWith("diff ") ? "file" : "ctx";
        return h("section", { "aria-labelledby": "diff-heading" },
            h("h3", { id: "diff-heading" }, "Changes ",
                h("span", { class: "cairn-muted" },
                    diff.summary ? diff.summary.label : diff.status)),
            diff.refused.length
                ? h("ul", { class: "cairn-refused" }, diff.refused.map(p =>
                    h("li", null, `refused: ${p.path} (${p.reason})`)))
                : null,
            lines.length
                ? h("pre", { class: "cairn-diff", id: "diff" },
                    lines.map(l => h("span", { class: `cairn-diff-${kind(l)}` }, l)))
                : h("p", { class: "cairn-empty" }, "No changes."));
    }

    function logsView(text) {
        return h("section", { "aria-labelledby": "logs-heading" },
            h("h3", { id: "logs-heading" }, "Logs ",
                h("span", { class: "cairn-muted" }, `the last ${LOG_LINES} entries`)),
            text ? h("pre", { class: "cairn-logs", id: "logs" }, text)
                : h("p", { class: "cairn-empty" }, "No entries."));
    }

    /* The kind of operation whose lanes run in scopes named ``<its op_id>-<lane>``. */
    const FORKS = ["parallel", "map"];

    /* The operations as a tree: the root scope's in order, each fork followed by its
     * lanes in the order the workflow named them (its request's ``lanes``; a lane that
     * has no operation yet shows empty), each lane's operations below it, nested forks
     * deeper. A lane's scope is ``<fork op_id>-<lane>``; a scope belongs to the fork with
     * the longest op_id it starts with. A row: [depth, lane name or null, operation or
     * null]. */
    function opTree(ops) {
        const forks = ops.filter(o => FORKS.includes(o.kind))
            .sort((a, b) => b.op_id.length - a.op_id.length);
        const byScope = new Map();
        for (const o of ops) {
            if (!byScope.has(o.scope))
                byScope.set(o.scope, []);
            byScope.get(o.scope).push(o);
        }
        const lanesOf = new Map(forks.map(f => [f.op_id,
            Array.isArray((f.request || {}).lanes) ? f.request.lanes.map(String) : []]));
        for (const scope of byScope.keys()) {
            const fork = forks.find(f => scope.startsWith(f.op_id + "-"));
            const lane = fork ? scope.slice(fork.op_id.length + 1) : null;
            if (fork && scope !== "root" && !lanesOf.get(fork.op_id).includes(lane))
                lanesOf.get(fork.op_id).push(lane);
        }
        const rows = [];
        const walk = (scope, depth) => {
            const here = (byScope.get(scope) || []).slice().sort((a, b) => a.seq - b.seq);
            for (const o of here) {
                rows.push([depth, null, o]);
                for (const lane of lanesOf.get(o.op_id) || []) {
                    rows.push([depth + 1, lane, null]);
                    walk(`${o.op_id}-${lane}`, depth + 2);
                }
            }
        };
        walk("root", 0);
        // a scope no fork names (a journal that contradicts itself) is still shown
        const placed = new Set(rows.filter(r => r[2]).map(r => r[2].op_id));
        for (const o of ops.filter(x => !placed.has(x.op_id)))
            rows.push([0, null, o]);
        return rows;
    }

    function checkpointText(o, deleted) {
        if (o.imported_from)
            return `imported from ${o.imported_from.run_id} ${o.imported_from.op_id}`;
        const s = (o.checkpoint || {}).s;
        if (!s || !s.path)
            return "—";
        return `${s.path}` + (deleted ? " (deleted)" : "")
            + (o.checkpoint.changed === false ? " (no changes)" : "");
    }

    function operationsView(run) {
        const r = run.run;
        const rows = opTree(run.operations || []);
        return h("section", { "aria-labelledby": "operations-heading" },
            h("h3", { id: "operations-heading" }, "Operations"),
            h("table", { class: "cairn-table", id: "operations" },
                h("thead", null, h("tr", null, ["Operation", "Kind", "Attempt", "State",
                    "Checkpoint", ""].map(c => h("th", { scope: "col" }, c)))),
                h("tbody", null, rows.map(([depth, lane, o]) => lane !== null
                    ? h("tr", { class: "cairn-lane", "data-lane": lane,
                        "data-depth": Math.min(depth, 6) },
                        h("td", { colspan: 6 },
                            h("span", { class: "cairn-kind" }, "lane "), lane))
                    : h("tr", { "data-op": o.op_id, "data-depth": Math.min(depth, 6) },
                        h("td", { "data-label": "Operation" }, o.op_id),
                        h("td", { "data-label": "Kind" }, o.kind),
                        h("td", { "data-label": "Attempt" }, String(o.attempt)),
                        h("td", { "data-label": "State" }, stateBadge(o.state),
                            o.error ? h("span", { class: "cairn-muted" }, ` ${o.error}`) : null),
                        h("td", { "data-label": "Checkpoint", class: "cairn-path" },
                            checkpointText(o, run.storage.deleted)),
                        h("td", null, o.state === "uncertain"
                            ? action("Retry", ["retry", "--", r.run_id, o.op_id],
                                `Run ${o.op_id} again? Its effects may then happen twice.`)
                            : null))))));
    }

    /* A facet of the run page: a section ``id`` headed ``title``. */
    function facet(id, title, ...children) {
        return h("section", { "aria-labelledby": `${id}-heading`, id },
            h("h3", { id: `${id}-heading` }, title), ...children);
    }

    function progressView(progress) {
        const phases = Object.keys(progress || {}).sort();
        if (!phases.length)
            return null;
        return facet("progress", "Progress",
            phases.map(phase => {
                const p = progress[phase];
                const total = typeof p.total === "number" ? p.total : null;
                return h("p", { "data-phase": phase },
                    h("label", null, `${phase} ${p.done}` + (total !== null ? `/${total}` : ""),
                        " ", total ? h("progress", { max: total, value: p.done }) : null));
            }));
    }

    const ITEM_MARK = { done: "✓", active: "●", waiting: "○" };

    function worklistsView(lists) {
        if (!lists.length)
            return null;
        return facet("worklists", "Worklists",
            lists.map(w => h("div", { class: "cairn-facet", "data-worklist": w.title },
                h("p", { class: "cairn-item-head" }, h("span", { class: "cairn-kind" }, w.title),
                    ` r${w.revision} · ${w.done}/${w.items.length} · `,
                    w.complete ? "done" : "active"),
                h("ul", { class: "cairn-worklist" }, w.items.map((item, i) => h("li", {
                    "data-state": w.states[i],
                }, h("span", { "aria-label": w.states[i] }, ITEM_MARK[w.states[i]] || "?"),
                " ", item))))));
    }

    function measured(entry) {
        return entry ? `${entry.value} (${entry.measurement})` : "—";
    }

    function experimentsView(facets) {
        if (!facets.length)
            return null;
        return facet("experiments", "Experiments",
            facets.map(e => h("div", { class: "cairn-facet", "data-experiment": e.scope },
                h("dl", { class: "cairn-facts" },
                    h("dt", null, "Metric"), h("dd", null, e.metric),
                    h("dt", null, "Baseline"), h("dd", null, measured(e.baseline)),
                    h("dt", null, "Best"), h("dd", null, measured(e.best)),
                    h("dt", null, "Gain"), h("dd", { class: "cairn-gain" },
                        e.gain === null || e.gain === undefined ? "—"
                            : `${e.gain >= 0 ? "+" : ""}${(e.gain * 100).toFixed(1)}%`),
                    e.target ? [h("dt", null, "Target"), h("dd", null,
                        `${e.target.value} ${e.target.reached ? "reached" : "not reached"}`)]
                        : null),
                h("table", { class: "cairn-table" },
                    h("thead", null, h("tr", null, ["Candidate", "Value", "Disposition",
                        "Reason"].map(c => h("th", { scope: "col" }, c)))),
                    h("tbody", null, (e.candidates || []).map(c => h("tr", {
                        "data-disposition": c.disposition,
                    },
                    h("td", { "data-label": "Candidate" }, c.measurement),
                    h("td", { "data-label": "Value" }, c.value === null ? "—" : String(c.value)),
                    h("td", { "data-label": "Disposition" }, stateBadge(c.disposition)),
                    h("td", { "data-label": "Reason" }, c.reason || ""))))))));
    }

    function runPage(run, diff, logs) {
        const r = run.run;
        const settlement = run.settlement || {};
        const applied = (settlement.apply || {}).applied || [];
        const reverted = (settlement.revert || {}).status === "applied";
        const actions = [];
        if (r.state === "paused")
            actions.push(action("Resume", ["resume", "--", r.run_id], null));
        else if (["running", "waiting", "queued", "pending"].includes(r.state))
            actions.push(action("Pause", ["pause", "--", r.run_id], null));
        if (!ENDED.includes(r.state)) {
            actions.push(action("Stop", ["stop", "--", r.run_id],
                `Stop run ${r.run_id}? It starts no new operation; its running agents finish.`));
            actions.push(action("Cancel", ["cancel", "--yes", "--", r.run_id],
                `Cancel run ${r.run_id}? Its running agents are stopped.`));
        }
        if (r.state !== "succeeded" && ENDED.includes(r.state) && run.replay_through
            && !run.storage.deleted)
            actions.push(replayAction(r.run_id, run.replay_through));
        if (ENDED.includes(r.state) && applied.length && !reverted)
            actions.push(action("Revert", ["revert", "--yes", "--", r.run_id],
                `Revert what run ${r.run_id} applied to its project? Every path still as the ` +
                "run left it gets its content from before the run back."));
        if (ENDED.includes(r.state) && !run.storage.deleted)
            actions.push(action("Delete storage", ["rm", "--yes", "--", r.run_id],
                `Delete the storage of run ${r.run_id} (its checkpoints)? Its history stays.`));
        const waiting = run.question;
        return h("section", { "aria-labelledby": "run-heading" },
            h("p", null, h("a", {
                href: "#/", onclick: ev => { ev.preventDefault(); go([]) },
            }, "← All runs")),
            h("div", { class: "cairn-toolbar" },
                h("h2", { id: "run-heading" }, `Run ${r.run_id} `), stateBadge(r.state),
                h("span", { class: "cairn-actions" }, actions)),
            h("dl", { class: "cairn-facts" },
                h("dt", null, "Definition"), h("dd", null, r.definition),
                h("dt", null, "Project"), h("dd", { class: "cairn-path" }, r.project),
                run.replayed_from ? [h("dt", null, "Replayed from"), h("dd", { id: "replayed-from" },
                    runLink(run.replayed_from.run_id), ` through ${run.replayed_from.through}`)]
                    : null,
                r.error ? [h("dt", null, "Error"), h("dd", { id: "run-error" }, r.error)] : null,
                r.state === "failed" && run.replay_through ? [h("dt", null, "Retry"),
                    h("dd", null, h("code", { id: "retry-command" },
                        `cairn replay ${r.run_id} --through ${run.replay_through}`))] : null,
                waiting ? [h("dt", null, "Waiting"), h("dd", null, h("a", {
                    href: "#/inbox", onclick: ev => { ev.preventDefault(); go(["inbox"]) },
                }, waiting.kind === "question" ? waiting.question : `approval ${waiting.request_id}`))]
                    : null,
                reverted ? [h("dt", null, "Reverted"), h("dd", { id: "reverted" },
                    "what the run applied was put back")] : null,
                run.model ? [h("dt", null, "Model"), h("dd", null,
                    `${run.model.calls} calls · ${run.model.tokens} of ${run.model.token_limit} tokens`
                    + (run.model.cost ? ` · cost ${run.model.cost}` : ""))] : null,
                r.output ? [h("dt", null, "Output"),
                    h("dd", null, h("code", { id: "run-output" }, JSON.stringify(r.output)))]
                    : null),
            progressView(run.progress),
            operationsView(run),
            worklistsView(run.worklists || []),
            experimentsView(run.experiments || []),
            diffView(diff),
            logsView(logs));
    }

    // --- Inbox --------------------------------------------------------------------------

    /* The fields of an answer form, from the question's JSON schema: one input per
     * property of a plain type; anything else is answered as JSON text. */
    function answerForm(q) {
        const schema = q.json_schema || {};
        const props = schema.type === "object" && schema.properties ? schema.properties : null;
        const plain = props && Object.values(props).every(p =>
            ["string", "integer", "number", "boolean"].includes(p.type) || Array.isArray(p.enum));
        const fields = [];
        if (plain) {
            for (const [name, p] of Object.entries(props)) {
                const id = `answer-${q.op_id}-${name}`;
                let input;
                if (Array.isArray(p.enum))
                    input = h("select", { id, name }, p.enum.map(v =>
                        h("option", { value: JSON.stringify(v) }, String(v))));
                else if (p.type === "boolean")
                    input = h("input", { id, name, type: "checkbox" });
                else
                    input = h("input", {
                        id, name, type: p.type === "string" ? "text" : "number",
                        step: p.type === "integer" ? "1" : "any",
                        required: (schema.required || []).includes(name),
                    });
                fields.push(h("label", { for: id }, p.title || name),
                    ["text", "number"].includes(input.type) ? control(input) : input);
            }
        } else {
            const id = `answer-${q.op_id}`;
            fields.push(h("label", { for: id }, q.schema_name ? "Answer (JSON)" : "Answer"),
                control(h("textarea", { id, name: "text", rows: 3, required: true })));
        }
        const read = form => {
            if (!plain)
                return form.elements.text.value;
            const value = {};
            for (const [name, p] of Object.entries(props)) {
                const input = form.elements[name];
                if (Array.isArray(p.enum))
                    value[name] = JSON.parse(input.value);
                else if (p.type === "boolean")
                    value[name] = input.checked;
                else if (p.type === "string")
                    value[name] = input.value;
                else if (input.value !== "")
                    value[name] = Number(input.value);
            }
            return JSON.stringify(value);
        };
        return h("form", {
            class: "cairn-form",
            onsubmit: ev => {
                ev.preventDefault();
                const form = ev.target;
                form.querySelector("button").disabled = true;
                cairn(["answer", "--challenge", q.challenge, "--", q.run_id, read(form)])
                    .then(out => { say(out.trim()); refresh(true) })
                    .catch(ex => {
                        // what the person typed stays, to be corrected
                        say(ex.message, true);
                        form.querySelector("button").disabled = false;
                    });
            },
        }, fields, h("button", { class: "pf-m-primary", type: "submit" }, "Answer"));
    }

    function inboxItem(item) {
        const head = (label, runId) => h("p", { class: "cairn-item-head" },
            h("span", { class: "cairn-kind" }, label), " ", runId ? runLink(runId) : null,
            item.definition ? ` · ${item.definition}` : null);
        if (item.kind === "question")
            return h("li", { class: "cairn-item", "data-run": item.run_id, "data-kind": "question" },
                head("Question", item.run_id),
                h("p", { class: "cairn-question" }, item.question),
                answerForm(item));
        if (item.kind === "approval") {
            const p = item.prepared || {};
            const subject = p.subject || p.title || p.prompt
                || (p.accepted ? `apply ${p.accepted.length} path(s) to ${p.project}` : "");
            return h("li", { class: "cairn-item", "data-run": item.run_id, "data-kind": "approval" },
                head("Approval", item.run_id),
                h("p", { class: "cairn-question" }, subject),
                h("p", { class: "cairn-muted" }, "Fingerprint ",
                    h("code", { class: "cairn-fingerprint" }, item.fingerprint)),
                h("span", { class: "cairn-actions" },
                    action("Approve", ["approve", "--fingerprint", item.fingerprint, "--",
                        item.run_id, item.request_id], null),
                    action("Reject", ["reject", "--", item.run_id, item.request_id],
                        "Reject this request? The operation does not run.")));
        }
        const label = item.kind === "blocked" ? "Blocked run"
            : item.kind === "schedule-blocked" ? "Blocked schedule" : item.kind;
        return h("li", {
            class: "cairn-item", "data-run": item.run_id, "data-kind": item.kind,
            "data-op": item.op_id || null,
        },
        head(label, item.run_id),
        item.op_id ? h("p", null, "Operation ", h("code", null, item.op_id),
            " may have reached outside and has no result. Decide what happened:") : null,
        item.reason ? h("p", { class: "cairn-question" }, item.reason) : null,
        item.kind === "blocked" && item.op_id ? reconcileChoices(item) : null,
        (item.commands || []).length
            ? h("pre", { class: "cairn-commands" }, item.commands.join("\n")) : null);
    }

    /* A blocked run's choices for its uncertain operation, as `cairn reconcile` and
     * `cairn retry` offer them: it reached nothing outside, its real result, or run again. */
    function reconcileChoices(item) {
        const id = `result-${item.run_id}-${item.op_id}`;
        const result = h("form", {
            class: "cairn-form",
            onsubmit: ev => {
                ev.preventDefault();
                const form = ev.target;
                form.querySelector("button").disabled = true;
                cairn(["reconcile", "--result", "/dev/stdin", "--", item.run_id, item.op_id],
                    form.elements.result.value)
                    .then(out => { say(out.trim()); refresh(true) })
                    .catch(ex => {
                        // what the person typed stays, to be corrected
                        say(ex.message, true);
                        form.querySelector("button").disabled = false;
                    });
            },
        }, h("label", { for: id }, "Its result as it happened (a JSON object)"),
        control(h("textarea", { id, name: "result", rows: 2, required: true })),
        h("button", { class: "pf-m-secondary", type: "submit" }, "Record result"));
        return [h("span", { class: "cairn-actions" },
            action("No effect", ["reconcile", "--no-effect", "--", item.run_id, item.op_id],
                `Record that ${item.op_id} reached nothing outside? It is then run again.`),
            action("Run again", ["retry", "--", item.run_id, item.op_id],
                `Run ${item.op_id} again? Its effects may then happen twice.`)),
        result];
    }

    /* A failed run: why, and how to retry it from its last checkpoint. */
    function failedItem(run) {
        return h("li", { class: "cairn-item", "data-run": run.run_id, "data-kind": "failed" },
            h("p", { class: "cairn-item-head" }, h("span", { class: "cairn-kind" }, "Failed run"),
                " ", runLink(run.run_id), ` · ${run.definition} · ${age(run.created_at)} ago`),
            run.error ? h("p", { class: "cairn-question" }, run.error) : null,
            run.replay_through
                ? [h("pre", { class: "cairn-commands" },
                    `cairn replay ${run.run_id} --through ${run.replay_through}`),
                h("span", { class: "cairn-actions" }, replayAction(run.run_id, run.replay_through))]
                : h("p", { class: "cairn-muted" },
                    "No checkpoint to retry from: launch the workflow again."));
    }

    function inboxPage(items, failed) {
        return h("section", { "aria-labelledby": "inbox-heading" },
            h("h2", { id: "inbox-heading" }, "Inbox"),
            items.length
                ? h("ul", { class: "cairn-inbox", id: "inbox", role: "list" },
                    items.map(inboxItem))
                : h("p", { class: "cairn-empty" }, "Nothing waits for you."),
            failed.length ? [
                h("h3", { id: "failed-heading" }, "Failed runs ",
                    h("span", { class: "cairn-muted" }, `the last ${FAILED_DAYS} days`)),
                h("ul", { class: "cairn-inbox", id: "failed", role: "list",
                    "aria-labelledby": "failed-heading" }, failed.map(failedItem))] : null);
    }

    // --- Rendering ----------------------------------------------------------------------

    function showCount(items) {
        const badge = document.getElementById("inbox-count");
        badge.textContent = String(items.length);
        badge.hidden = items.length === 0;
    }

    /* The failed runs launched in the last FAILED_DAYS days and not retried yet (none when
     * cairn cannot list them: the inbox still shows what waits). */
    function recentlyFailed() {
        const since = Date.now() / 1000 - FAILED_DAYS * 86400;
        return cairnJSON(["list"])
            .then(runs => runs.filter(r => r.state === "failed" && r.created_at >= since &&
                !(r.replayed_by || []).length))
            .catch(() => []);
    }

    /* What the page at ``path`` shows: cairn's answers as they came (to tell whether
     * anything changed) and a function that draws them. */
    function load(path) {
        if (path[0] === "run" && path[1])
            return Promise.all([cairn(["show", "--json", "--", path[1]]),
                cairn(["diff", "--json", "--", path[1]]),
                cairn(["logs", "-n", String(LOG_LINES), "--no-pager", "--", path[1]])])
                .then(([run, diff, logs]) => [run + diff + logs,
                    () => runPage(JSON.parse(run), JSON.parse(diff), logs)]);
        if (path[0] === "inbox")
            return Promise.all([cairn(["inbox", "--json"]), recentlyFailed()])
                .then(([out, failed]) => [out + JSON.stringify(failed), () => {
                    const items = JSON.parse(out);
                    showCount(items);
                    return inboxPage(items, failed);
                }]);
        return cairn(["list", "--json", ...everyone ? ["--all"] : []])
            .then(out => [out + filter + everyone, () => runsPage(JSON.parse(out))]);
    }

    /* Draw the page for the current location when what cairn says changed (or ``force``);
     * a poll leaves alone a page whose form the person is in the middle of. */
    function refresh(force) {
        const path = cockpit.location.path;
        const key = JSON.stringify(path);
        if (!force && key === shown && view.contains(document.activeElement)
            && document.activeElement.form)
            return;
        // an answer for a location the person has since left is dropped
        const here = () => JSON.stringify(cockpit.location.path) === key;
        load(path)
            .then(([answer, draw]) => {
                if (!here())
                    return;
                if (!force && key === shown && answer === drawn) {
                    for (const cell of view.querySelectorAll("[data-created]"))
                        cell.textContent = age(Number(cell.dataset.created));
                    return;
                }
                view.replaceChildren(draw());
                shown = key;
                drawn = answer;
                view.setAttribute("data-loaded", key);
                view.dataset.draws = String(Number(view.dataset.draws || 0) + 1);
            })
            .catch(ex => {
                if (!here())
                    return;
                view.replaceChildren(errorBox(ex));
                shown = key;
                drawn = null;
                view.setAttribute("data-loaded", key);
            });
        document.getElementById("tab-runs").toggleAttribute("aria-current", path[0] !== "inbox");
        document.getElementById("tab-inbox").toggleAttribute("aria-current", path[0] === "inbox");
        if (path[0] !== "inbox")
            cairnJSON(["inbox"]).then(showCount).catch(() => {});
    }

    function poll() {
        clearTimeout(timer);
        timer = setTimeout(() => {
            if (!document.hidden)
                refresh(false);
            poll();
        }, POLL_MS);
    }

    /* Cockpit's light or dark style, as its Session menu sets it ("shell:style": light,
     * dark, or auto: the browser's), on PatternFly's dark-theme class. */
    function followStyle(chosen) {
        const style = chosen || window.localStorage.getItem("shell:style") || "auto";
        const prefersDark = window.matchMedia("(prefers-color-scheme: dark)").matches;
        document.documentElement.classList.toggle("pf-v6-theme-dark",
            style === "dark" || (style === "auto" && prefersDark));
    }
    window.addEventListener("storage", ev => {
        if (ev.key === "shell:style")
            followStyle();
    });
    window.addEventListener("cockpit-style", ev => followStyle(ev.detail && ev.detail.style));
    window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => followStyle());
    followStyle();

    for (const [id, path] of [["tab-runs", []], ["tab-inbox", ["inbox"]]])
        document.getElementById(id).addEventListener("click", ev => {
            ev.preventDefault();
            go(path);
        });
    cockpit.addEventListener("locationchanged", () => refresh(true));
    refresh(true);
    poll();
}());
