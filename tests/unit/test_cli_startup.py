"""What every ``cairn`` start loads: the commands and their options, the daemon client and
its protocol, nothing more. A module only some commands need when they run (the MCP
server, the workflow review, notification hooks and D-Bus, host checks) is imported inside
those commands, so ``cairn launch`` and ``cairn show`` never load it. Checked in a fresh
interpreter: the test process has imported everything long before."""

from __future__ import annotations

import ast
import json
import os
import pwd
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from cairn.proc import run
from cairn.protocol.attestation import parse_attestation
from cairn.protocol.daemon import MODEL_OF_OP, LaunchRequest
from cairn.protocol.launch import LaunchDescription, ProjectSpec

# Each loaded only by the commands that use it; at the top it slowed every cairn start.
COMMAND_ONLY = frozenset({
    "cairn.mcp.server",  # cairn mcp
    "cairn.mcp.tools",
    "cairn.definitions.resolve",  # launch of a FILE.py, user: or project:; workflow; project
    "cairn.definitions.user",
    "cairn.definitions.trust",
    "cairn.workflow.review",
    "cairn.notify",  # cairn notify
    "cairn.protocol.notify",
    "cairn.systemd",
    "jeepney",
    "cairn.hostcheck",  # cairn doctor
    "cairn.hostconfig",  # cairn config check
    "cairn.schedules",  # cairn schedule, cairn doctor
})
BUILT = (
    "from cairn.protocol import daemon\n"
    "ops = daemon.MODEL_OF_OP.items()\n"
    "print('built', *sorted(op for op, m in ops if m.__pydantic_complete__), file=sys.stderr)"
)

# Not json: a launch itself must not load it.
REPORT = "import sys; print(repr(sorted(sys.modules)))"
REPO = str(Path(__file__).resolve().parents[2])
# Standard modules a launch does without: each costs every launch 0.5-8 ms of CPU to import
# (the client uses _socket, the C module beneath socket, and cairn.leanjson for json, which
# loads re and with it enum, functools and collections).
LAUNCH_LEAN = frozenset({"typing", "pathlib", "dataclasses", "inspect", "socket", "signal",
                         "selectors", "json", "re", "enum", "functools", "collections"})


def modules_after(code: str, root: Path, *, bare: bool = False) -> tuple[set[str], str]:
    """The modules a fresh interpreter has loaded after ``code``, and its stderr. ``bare``:
    without ``site`` (a development install's import hooks load modules of their own),
    the tree on ``sys.path``."""
    argv = [sys.executable, "-c", f"{code}\n{REPORT}"]
    if bare:
        argv[1:] = ["-I", "-S", "-c", f"import sys; sys.path.insert(0, {REPO!r})\n{code}\n{REPORT}"]
    proc = run(argv, env={"CAIRN_ROOT": str(root)}, timeout=60)
    return set(ast.literal_eval(proc.stdout.decode().splitlines()[-1])), proc.stderr.decode()


def dispatched(argv: list[str]) -> str:
    """A child that runs ``cairn ARGV`` to its exit and then reports its modules (a launch
    ends with ``os._exit``, which the child turns into the SystemExit it reports)."""
    return (
        "import os, sys\n"
        "def _exit(code):\n"
        "    raise SystemExit(code)\n"
        "os._exit = _exit\n"
        "from cairn import cli\n"
        f"sys.argv = ['cairn', *{argv!r}]\n"
        "try:\n"
        "    cli.main()\n"
        "except SystemExit as exc:\n"
        "    print('exit', exc.code, file=sys.stderr)"
    )


# What a launch read without click loads none of (cairn.cli.launching): a burst of
# launches costs about as many interpreters.
LAUNCH_FREE = frozenset({"click", "pydantic", "pydantic_core", "cairn.cli.commands",
                         "cairn.cli.runs", "cairn.protocol.daemon", "cairn.protocol.launch",
                         "cairn.protocol.base", "cairn.definitions.resolve"})


def test_the_command_tree_loads_no_command_only_module(tmp_path: Path) -> None:
    loaded, _ = modules_after("import cairn.cli.commands", tmp_path)
    assert {"cairn.cli.runs", "cairn.cli.mcp", "cairn.cli.notify", "cairn.cli.workflow"} <= loaded
    assert sorted(COMMAND_ONLY & loaded) == []
    assert sorted({"typer", "rich"} & loaded) == []  # click alone
    bare, _ = modules_after("import cairn.cli", tmp_path)
    assert sorted(LAUNCH_FREE & bare) == []


def test_show_loads_no_command_only_module_and_builds_only_its_request(tmp_path: Path) -> None:
    argv = ["show", "flow_" + "0" * 32]
    loaded, stderr = modules_after(f"{dispatched(argv)}\n{BUILT}", tmp_path)
    # No cairnd under this root: the command got as far as sending its request.
    assert "cannot reach cairnd" in stderr and "exit 1" in stderr, stderr
    assert sorted(COMMAND_ONLY & loaded) == []
    assert stderr.splitlines()[-1] == "built show"


def test_a_launch_loads_neither_click_nor_a_model(tmp_path: Path) -> None:
    argv = ["launch", "builtin:implement", "--project", str(tmp_path), "--limit", "max_agent_ops=3"]
    loaded, stderr = modules_after(dispatched(argv), tmp_path)
    assert "cannot reach cairnd" in stderr and "exit 1" in stderr, stderr
    assert sorted((LAUNCH_FREE | COMMAND_ONLY) & loaded) == []
    lean, stderr = modules_after(dispatched(argv), tmp_path, bare=True)
    assert "cannot reach cairnd" in stderr and "exit 1" in stderr, stderr
    assert "cairn.cli.launching" in lean and sorted(LAUNCH_LEAN & lean) == []
    helped, stderr = modules_after(dispatched(["launch", "--help"]), tmp_path)
    assert "exit 0" in stderr and {"click", "cairn.cli.runs"} <= helped


def test_a_whole_launch_attests_the_models_hash_without_loading_a_model(
    tmp_path: Path,
) -> None:
    """``cairn launch`` against a stand-in cairnd that freezes a description with the
    protocol's model: the CLI, which reads it as JSON, attests the model's own hash, prints
    the run and loads no model or click."""
    run_id = "flow_" + "c3" * 16
    project = tmp_path / "proj"
    project.mkdir()
    (tmp_path / "run/cairn").mkdir(parents=True)
    heard: dict[str, Any] = {}

    def cairnd(listener: socket.socket) -> None:
        conn, _ = listener.accept()
        with conn:
            line, fds, _, _ = socket.recv_fds(conn, 1 << 20, 4)
            request = LaunchRequest.model_validate_json(line)
            heard["request"] = request
            heard["project"] = os.readlink(f"/proc/self/fd/{fds[0]}")
            desc = frozen(run_id, request)
            with socket.socket(fileno=fds[1]) as channel:
                os.close(fds[0])
                channel.sendall(desc.model_dump_json().encode() + b"\n")
                heard["attestation"] = channel.recv(4096)
            heard["hash"] = desc.launch_hash()
            conn.sendall(json.dumps({"ok": True, "result": {"run_id": run_id,
                                                            "state": "running"}}).encode())

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(tmp_path / "run/cairn/cairnd.sock"))
        listener.listen(1)
        thread = threading.Thread(target=cairnd, args=(listener,))
        thread.start()
        argv = ["launch", "builtin:implement", f"--project={project}", "--args",
                '{"objective": "tidy"}', "--apply", "ask"]
        proc = run([sys.executable, "-c", f"{dispatched(argv)}\n{REPORT}"],
                   env={"CAIRN_ROOT": str(tmp_path)}, timeout=60)
        thread.join(timeout=30)
    stdout = proc.stdout.decode().splitlines()
    assert stdout[0] == run_id and "exit 0" in proc.stderr.decode(), proc.stderr
    assert sorted(LAUNCH_FREE & set(ast.literal_eval(stdout[-1]))) == []
    assert heard["project"] == str(project)
    assert (heard["request"].args, heard["request"].apply_mode) == ({"objective": "tidy"}, "ask")
    assert parse_attestation(heard["attestation"]) == (run_id, heard["hash"])


def frozen(run_id: str, request: LaunchRequest) -> LaunchDescription:
    """The description a cairnd would freeze for ``request`` (its defaults and all)."""
    account = pwd.getpwuid(os.getuid())
    assert request.project is not None and request.definition is not None
    return LaunchDescription(
        run_id=run_id, owner_uid=account.pw_uid, owner_gid=account.pw_gid,
        owner_name=account.pw_name, definition=request.definition, source="print(1)",
        source_filename="implement.py", review_hash="sha256:" + "b" * 64, review={},
        args={**request.args, "depth": 1.5},
        project=ProjectSpec(root=request.project, owner_uid=account.pw_uid, on_pool_fs=False),
        profiles={}, apply_mode=request.apply_mode, cairn_version="t", created_at=2.5,
    )


# Loaded only by a command that sends cairnd a request (the protocol's models) or checks a
# description (the launch): help, the version and a command name's completion build no model.
REQUEST_ONLY = frozenset({"pydantic", "pydantic_core", "cairn.protocol.daemon",
                          "cairn.protocol.launch", "cairn.protocol.base"})


def test_help_version_and_completing_a_command_load_no_protocol_model(tmp_path: Path) -> None:
    for argv in (["--version"], ["--help"], ["launch", "--help"], ["__complete", "cairn", "la"]):
        loaded, stderr = modules_after(dispatched(argv), tmp_path)
        assert "exit 0" in stderr or "exit None" in stderr, (argv, stderr)
        assert sorted(REQUEST_ONLY & loaded) == [], argv


def test_a_threaded_process_builds_every_daemon_model_before_its_threads(
    tmp_path: Path,
) -> None:
    unbuilt = (
        "from cairn.protocol import daemon\n"
        "models = [*daemon.MODEL_OF_OP.values(), daemon.RequestEnvelope, daemon.DaemonReply]\n"
        "adapter = daemon.DAEMON_REQUEST.pydantic_complete\n"
        "print(sum(not m.__pydantic_complete__ for m in models) + (not adapter), file=sys.stderr)\n"
    )
    _, stderr = modules_after(f"import sys\n{unbuilt}daemon.build_models()\n{unbuilt}", tmp_path)
    before, after = stderr.split()
    assert int(before) == len(MODEL_OF_OP) + 3  # nothing is built at import
    assert int(after) == 0


def test_a_command_still_loads_what_it_needs(tmp_path: Path) -> None:
    loaded, stderr = modules_after(dispatched(["config", "check"]), tmp_path)
    assert "cairn.hostconfig" in loaded, stderr
