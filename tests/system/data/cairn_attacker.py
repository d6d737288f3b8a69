"""What code running as the ``cairn`` service user can do to root: rewrite the journal
it owns and call the broker socket directly. Run inside the test machine as ``cairn``:

    attacker.py forge RUN_ID FROM_RUN OWNER HOME      a run of OWNER on HOME, with a Q intent
    attacker.py set RUN_ID JSON_PATH JSON_VALUE       rewrite one field of the description
    attacker.py restore RUN_ID                        undo every rewrite of the description
    attacker.py sql SQL [PARAMS_JSON]                 any statement on the journal
    attacker.py schedule-sql SQL [PARAMS_JSON]        any statement on cairnd's schedules
    attacker.py intent RUN_ID INTENT_JSON             queue an intent as a coordinator would
    attacker.py hash RUN_ID                           the launch hash of its description
    attacker.py broker VERB RUN_ID [FDS]              one request; FDS: own-channel:HASH,
                                                      dir, two, pipe
Prints the broker's reply (or what happened) as one JSON line.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import sys
import time
from collections.abc import Callable
from typing import Any

JOURNAL = "/var/lib/cairn/journal/journal.db"
SCHEDULES = "/var/lib/cairn/journal/schedules.db"
BACKUP = "/var/lib/cairn/journal/attacker-backup.json"
VERB_OF = {"prepare-q": "storage-v1", "create-w": "storage-v1", "start-agent": "launch-v1",
           "start-coordinator": "launch-v1", "delete-run": "delete-v1",
           "verify-storage": "storage-v1", "start-apply": "launch-v1"}


def db(path: str = JOURNAL) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None, timeout=30)


def launch_of(run_id: str) -> dict[str, Any]:
    (raw,) = db().execute("SELECT launch FROM runs WHERE run_id=?", (run_id,)).fetchone()
    desc: dict[str, Any] = json.loads(raw)
    return desc


def forge(run_id: str, source: str, owner: str, home: str) -> dict[str, Any]:
    import pwd

    account = pwd.getpwnam(owner)
    desc = launch_of(source)
    desc.update(run_id=run_id, owner_uid=account.pw_uid, owner_gid=account.pw_gid,
                owner_name=owner, created_at=time.time())
    desc["project"] = {**desc["project"], "root": home, "owner_uid": account.pw_uid}
    now = time.time()
    conn = db()
    conn.execute(
        "INSERT INTO runs (run_id, owner_uid, definition, review_hash, project, state, launch,"
        " created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?)",
        (run_id, account.pw_uid, desc["definition"], desc["review_hash"], home, "pending",
         json.dumps(desc), now, now),
    )
    for kind in ("prepare-q", "start-coordinator"):
        intent = {"intent_id": kind, "run_id": run_id, "kind": kind}
        conn.execute("INSERT INTO intents (run_id, intent_id, verb, body, created_at)"
                     " VALUES (?,?,?,?,?)", (run_id, kind, VERB_OF[kind], json.dumps(intent), now))
    return {"forged": run_id}


def set_field(run_id: str, path: str, value: str) -> dict[str, Any]:
    conn = db()
    if not os.path.exists(BACKUP):
        with open(BACKUP, "w") as out:
            json.dump({"run_id": run_id, "launch": json.dumps(launch_of(run_id))}, out)
    conn.execute("UPDATE runs SET launch=json_set(launch, ?, json(?)) WHERE run_id=?",
                 (path, value, run_id))
    return {"set": path}


def restore(run_id: str) -> dict[str, Any]:
    with open(BACKUP) as saved:
        backup = json.load(saved)
    db().execute("UPDATE runs SET launch=? WHERE run_id=?", (backup["launch"], run_id))
    os.unlink(BACKUP)
    return {"restored": run_id}


def intent(run_id: str, body: str) -> dict[str, Any]:
    data = json.loads(body)
    db().execute("INSERT INTO intents (run_id, intent_id, verb, body, created_at)"
                 " VALUES (?,?,?,?,?)",
                 (run_id, data["intent_id"], VERB_OF[data["kind"]], body, time.time()))
    return {"queued": data["intent_id"]}


def launch_hash(run_id: str) -> dict[str, Any]:
    from cairn.protocol.launch import LaunchDescription

    desc = LaunchDescription.model_validate(launch_of(run_id))
    return {"hash": desc.launch_hash()}


def broker(verb: str, run_id: str, fds: str = "") -> dict[str, Any]:
    passed: list[int] = []
    keep: list[socket.socket] = []
    if fds.startswith("own-channel:"):
        mine, theirs = socket.socketpair()
        mine.sendall(f"attest-v1 {run_id} {fds.split(':', 1)[1]}\n".encode())
        keep += [mine, theirs]
        passed.append(theirs.fileno())
    elif fds == "dir":
        passed.append(os.open("/etc", os.O_RDONLY | os.O_DIRECTORY))
    elif fds == "pipe":
        read_end, write_end = os.pipe()
        os.write(write_end, f"attest-v1 {run_id} sha256:{'0' * 64}\n".encode())
        passed.append(read_end)
    elif fds == "two":
        one, two = socket.socketpair()
        keep += [one, two]
        passed += [one.fileno(), two.fileno()]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(120)
        sock.connect("/run/cairn/broker.sock")
        line = f"{verb} {run_id}\n".encode()
        if passed:
            socket.send_fds(sock, [line], passed)
        else:
            sock.sendall(line)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    result: dict[str, Any] = json.loads(reply)
    return result


def main() -> None:
    command, *args = sys.argv[1:]
    if command in ("sql", "schedule-sql"):
        params = json.loads(args[1]) if len(args) > 1 else []
        rows = db(JOURNAL if command == "sql" else SCHEDULES).execute(args[0], params).fetchall()
        result: dict[str, Any] = {"rows": [list(r) for r in rows]}
    else:
        commands: dict[str, Callable[..., dict[str, Any]]] = {
            "forge": forge, "set": set_field, "restore": restore, "intent": intent,
            "hash": launch_hash, "broker": broker}
        result = commands[command](*args)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
