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
    const STATES = ["queued", "pending", "running", "waiting", "paused", "blocked",
        "succeeded", "failed", "stopped", "cancelled"];
    const ENDED = ["succeeded", "failed", "stopped", "cancelled"];
    const view = document.getElementById("view");
    const status = document.getElementById("status");
    let timer = null;
    let shown = null; // the path drawn last, to keep a form the person is filling in
    let drawn = null; // what cairn answered for it

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
        for (const child of children.flat()) {
            if (child === null || child === undefined || child === false)
                continue;
            node.append(child instanceof Node ? child : String(child));
        }
        return node;
    }

    /* `cairn ARGS`: a Promise of its stdout, or of an Error with what it printed on
     * stderr (a native Promise: what cockpit.spawn returns chains its own way). */
    function cairn(args) {
        return new Promise((resolve, reject) => {
            cockpit.spawn(["cairn", ...args], {
                err: "message",
                environ: ["LC_ALL=C.UTF-8", "NO_COLOR=1", "PAGER=cat"],
            }).then(resolve, ex => {
                reject(new Error((ex.message || ex.problem || String(ex)).trim()));
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

    function stateBadge(state) {
        const known = /^[a-z-]{1,20}$/.test(state) ? state : "other";
        return h("span", { class: `cairn-state cairn-state-${known}` }, state);
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

    /* A button that runs `cairn ARGS` once confirmed, then reports what cairn said. */
    function action(label, args, question) {
        return h("button", {
            class: "cairn-button",
            type: "button",
            onclick: ev => {
                if (question && !confirmed(question))
                    return;
                ev.target.disabled = true;
                say("");
                cairn(args)
                    .then(out => { say(out.trim() || `${label}: done`); })
                    .catch(ex => say(ex.message, true))
                    .finally(() => { ev.target.disabled = false; refresh(true) });
            },
        }, label);
    }

    function errorBox(ex) {
        return h("div", { class: "cairn-error", role: "alert" }, ex.message);
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

    function runPage(run, diff, logs) {
        const r = run.run;
        const ops = run.operations || [];
        const actions = [];
        if (r.state === "paused")
            actions.push(action("Resume", ["resume", r.run_id], null));
        else if (["running", "waiting", "queued", "pending"].includes(r.state))
            actions.push(action("Pause", ["pause", r.run_id], null));
        if (!ENDED.includes(r.state)) {
            actions.push(action("Stop", ["stop", r.run_id],
                `Stop run ${r.run_id}? It starts no new operation; its running agents finish.`));
            actions.push(action("Cancel", ["cancel", "--yes", r.run_id],
                `Cancel run ${r.run_id}? Its running agents are stopped.`));
        }
        if (ENDED.includes(r.state) && !run.storage.deleted)
            actions.push(action("Delete storage", ["rm", "--yes", r.run_id],
                `Delete the storage of run ${r.run_id} (its checkpoints)? Its history stays.`));
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
                r.error ? [h("dt", null, "Error"), h("dd", { id: "run-error" }, r.error)] : null,
                r.output ? [h("dt", null, "Output"),
                    h("dd", null, h("code", { id: "run-output" }, JSON.stringify(r.output)))]
                    : null),
            h("h3", null, "Operations"),
            h("table", { class: "cairn-table", id: "operations" },
                h("thead", null, h("tr", null, ["Operation", "Kind", "Scope", "Attempt",
                    "State", ""].map(c => h("th", { scope: "col" }, c)))),
                h("tbody", null, ops.map(o => h("tr", { "data-op": o.op_id },
                    h("td", { "data-label": "Operation" }, o.op_id),
                    h("td", { "data-label": "Kind" }, o.kind),
                    h("td", { "data-label": "Scope", class: "cairn-scope" }, o.scope),
                    h("td", { "data-label": "Attempt" }, String(o.attempt)),
                    h("td", { "data-label": "State" }, stateBadge(o.state),
                        o.error ? h("span", { class: "cairn-muted" }, ` ${o.error}`) : null),
                    h("td", null, o.state === "uncertain"
                        ? action("Retry", ["retry", r.run_id, o.op_id],
                            `Run ${o.op_id} again? Its effects may then happen twice.`)
                        : null))))),
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
                fields.push(h("label", { for: id }, p.title || name), input);
            }
        } else {
            const id = `answer-${q.op_id}`;
            fields.push(h("label", { for: id }, q.schema_name ? "Answer (JSON)" : "Answer"),
                h("textarea", { id, name: "text", rows: 3, required: true }));
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
                cairn(["answer", q.run_id, "--challenge", q.challenge, "--", read(form)])
                    .then(out => say(out.trim()))
                    .catch(ex => say(ex.message, true))
                    .finally(() => refresh(true));
            },
        }, fields, h("button", { class: "cairn-button cairn-primary", type: "submit" }, "Answer"));
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
                    action("Approve", ["approve", item.run_id, item.request_id,
                        "--fingerprint", item.fingerprint], null),
                    action("Reject", ["reject", item.run_id, item.request_id],
                        "Reject this request? The operation does not run.")));
        }
        const label = item.kind === "blocked" ? "Blocked run"
            : item.kind === "schedule-blocked" ? "Blocked schedule" : item.kind;
        return h("li", { class: "cairn-item", "data-run": item.run_id, "data-kind": item.kind },
            head(label, item.run_id),
            item.reason ? h("p", { class: "cairn-question" }, item.reason) : null,
            (item.commands || []).length
                ? h("pre", { class: "cairn-commands" }, item.commands.join("\n")) : null);
    }

    function inboxPage(items) {
        return h("section", { "aria-labelledby": "inbox-heading" },
            h("h2", { id: "inbox-heading" }, "Inbox"),
            items.length
                ? h("ul", { class: "cairn-inbox", id: "inbox", role: "list" },
                    items.map(inboxItem))
                : h("p", { class: "cairn-empty" }, "Nothing waits for you."));
    }

    // --- Rendering ----------------------------------------------------------------------

    function showCount(items) {
        const badge = document.getElementById("inbox-count");
        badge.textContent = String(items.length);
        badge.hidden = items.length === 0;
    }

    /* What the page at ``path`` shows: cairn's answers as they came (to tell whether
     * anything changed) and a function that draws them. */
    function load(path) {
        if (path[0] === "run" && path[1])
            return Promise.all([cairn(["show", path[1], "--json"]),
                cairn(["diff", path[1], "--json"]),
                cairn(["logs", path[1], "-n", String(LOG_LINES), "--no-pager"])])
                .then(([run, diff, logs]) => [run + diff + logs,
                    () => runPage(JSON.parse(run), JSON.parse(diff), logs)]);
        if (path[0] === "inbox")
            return cairn(["inbox", "--json"]).then(out => [out, () => {
                const items = JSON.parse(out);
                showCount(items);
                return inboxPage(items);
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

    for (const [id, path] of [["tab-runs", []], ["tab-inbox", ["inbox"]]])
        document.getElementById(id).addEventListener("click", ev => {
            ev.preventDefault();
            go(path);
        });
    cockpit.addEventListener("locationchanged", () => refresh(true));
    refresh(true);
    poll();
}());
