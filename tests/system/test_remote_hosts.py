"""``cairn -H alice@machine2 …`` from one booted machine to another, over real SSH: the
remote cairn answers as alice there, with machine2's runs, its logs followed to the end,
its JSON byte-exact, its exit status and errors unchanged. The two machines have no
network between them (each its own); machine2's sshd listens on a Unix socket in a
directory bound into both, reached through systemd's ssh proxy, the way a jump host or
a VSOCK would carry SSH."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from machine import Machine
from test_cli import launch_script
from test_end_to_end import cairn, finished, wait_for

SHARED = "/shared"
SSH_SOCKET = f"{SHARED}/ssh.sock"
SSHD_SOCKET_UNIT = f"""\
[Socket]
ListenStream={SSH_SOCKET}
SocketMode=0666
Accept=yes
"""
SSHD_SERVICE_UNIT = """\
[Service]
ExecStart=-/usr/sbin/sshd -i
StandardInput=socket
StandardError=journal
RuntimeDirectory=sshd
RuntimeDirectoryPreserve=yes
"""
SSH_CONFIG = f"""\
Host machine2
    ProxyCommand /usr/lib/systemd/systemd-ssh-proxy unix{SSH_SOCKET} %p
    ProxyUseFdpass yes
    StrictHostKeyChecking accept-new
    BatchMode yes
"""


@pytest.fixture(scope="module")
def machines(deb: Path) -> Iterator[tuple[Machine, Machine]]:
    shared = Path(tempfile.mkdtemp(prefix="cairn-shared-"))
    shared.chmod(0o755)
    try:
        with Machine(deb, with_pool=True, binds=[(shared, SHARED)]) as machine2, Machine(
            deb, binds=[(shared, SHARED)]
        ) as machine1:
            _serve_ssh(machine2)
            _trust(machine1, machine2)
            yield machine1, machine2
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def _serve_ssh(machine: Machine) -> None:
    machine.exec(["tee", "/etc/systemd/system/cairn-test-ssh.socket"],
                 input=SSHD_SOCKET_UNIT.encode())
    machine.exec(["tee", "/etc/systemd/system/cairn-test-ssh@.service"],
                 input=SSHD_SERVICE_UNIT.encode())
    machine.exec(["systemctl", "daemon-reload"])
    machine.exec(["systemctl", "start", "cairn-test-ssh.socket"])


def _trust(machine1: Machine, machine2: Machine) -> None:
    """alice on machine1 gets a key that alice on machine2 accepts."""
    machine1.exec(["mkdir", "-m", "700", "-p", "/home/alice/.ssh"], user="alice")
    machine1.exec(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                   "/home/alice/.ssh/id_ed25519"], user="alice")
    machine1.exec(["tee", "/home/alice/.ssh/config"], user="alice", input=SSH_CONFIG.encode())
    public = machine1.exec(["cat", "/home/alice/.ssh/id_ed25519.pub"], user="alice").stdout
    machine2.exec(["mkdir", "-m", "700", "-p", "/home/alice/.ssh"], user="alice")
    machine2.exec(["tee", "/home/alice/.ssh/authorized_keys"], user="alice", input=public)
    machine2.exec(["chmod", "600", "/home/alice/.ssh/authorized_keys"], user="alice")


def test_list_on_machine2_shows_machine2s_runs(machines: tuple[Machine, Machine]) -> None:
    machine1, machine2 = machines
    run_id = launch_script(machine2, [{"action": "run", "argv": ["echo", "remote-token"]}])
    wait_for(machine2, run_id, finished)

    listed = cairn(machine1, "-H", "alice@machine2", "list", "-q")
    assert run_id in listed.split()
    shown = cairn(machine1, "-H", "alice@machine2", "list")
    assert run_id.removeprefix("flow_")[:8] in shown
    # machine1's own cairnd knows nothing of it
    assert run_id not in cairn(machine1, "list", "-q", check=False)

    as_json = json.loads(cairn(machine1, "--host=alice@machine2", "show", run_id, "--json"))
    assert as_json["run"]["run_id"] == run_id and as_json["run"]["state"] == "succeeded"
    # logs -f of a run that has ended prints its journal and exits 0, as it would there
    logs = cairn(machine1, "-H", "alice@machine2", "logs", "-f", "-n", "1000", "-o", "cat", run_id)
    assert "remote-token" in logs
    watched = cairn(machine1, "-H", "alice@machine2", "watch", run_id)
    assert "succeeded" in watched.splitlines()[-1]


def test_errors_and_exit_status_come_back_unchanged(machines: tuple[Machine, Machine]) -> None:
    machine1, machine2 = machines
    missing = machine1.exec(
        ["cairn", "-H", "alice@machine2", "show", "flow_" + "0" * 32], user="alice", check=False
    )
    assert missing.returncode == 2
    assert missing.stderr.decode().startswith("cairn: no run flow_" + "0" * 32)
    # a word the remote shell would expand reaches the remote cairn as typed
    odd = machine1.exec(
        ["cairn", "-H", "alice@machine2", "show", "$(touch /tmp/pwned)"], user="alice",
        check=False,
    )
    assert odd.returncode == 2 and "$(touch /tmp/pwned)" in odd.stderr.decode()
    assert machine2.exec(["test", "-e", "/tmp/pwned"], check=False).returncode == 1
    # an ssh failure is ssh's exit status, 255
    unknown = machine1.exec(["cairn", "-H", "bob@machine2", "list"], user="alice", check=False)
    assert unknown.returncode == 255
