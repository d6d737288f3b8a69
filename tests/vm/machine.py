"""Throwaway Debian 13 virtual machines under QEMU/TCG, for the VM test tier.

What nspawn cannot show on these hosts — enforced cgroup v2 limits, the OOM killer, a
unit's cgroup really emptying — needs the machine's own kernel. A :class:`VirtualMachine`
boots one with software emulation (KVM guests hang on the development hosts), reachable
only by SSH through a port forwarded from ``127.0.0.1``; the guest has no other network.

VM base (cached)
    ``${CAIRN_TEST_CACHE:-/var/cache/cairn-tests}/vm-<hash>``: a copy of the system tier's
    cached trixie root filesystem (:func:`ensure_base_rootfs`) plus a kernel, an initramfs,
    ``openssh-server``, a static address for QEMU's user network, and an SSH key pair made
    for this cache entry. The hash covers the base root filesystem and this recipe.

Each machine
    mounts an overlay over the cached tree, installs the package with ``dpkg -i`` and adds
    the test users, writes the result into a sparse ext4 image with ``mkfs.ext4 -d``
    (no loop device on the host), boots it and waits until systemd reports running.
    Teardown always runs: ``systemctl poweroff``, then ending the QEMU and SSH processes it
    started if they do not stop, unmounting the overlay and removing every temporary file.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType, TracebackType

from cairn.errors import CairnError, ProcessFailed
from cairn.proc import make_env, run

log = logging.getLogger(__name__)


def _system_harness() -> ModuleType:
    """``tests/system/machine.py``, loaded by path: both tiers' harness modules are named
    ``machine`` and may be collected in one pytest session."""
    path = Path(__file__).resolve().parents[1] / "system" / "machine.py"
    name = "cairn_tests_system_machine"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the system test harness from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_system = _system_harness()
ensure_base_rootfs = _system.ensure_base_rootfs
cache_dir = _system.cache_dir
locked = _system._locked
mountpoints_under = _system._mountpoints_under
TEST_USERS: dict[str, int] = _system.TEST_USERS

VM_PACKAGES = ("linux-image-cloud-amd64", "openssh-server")
RECIPE_VERSION = 1
GUEST_ADDRESS = "10.0.2.15/24"  # QEMU user networking's fixed guest address and gateway
GUEST_GATEWAY = "10.0.2.2"
IMAGE_SIZE = "8G"
MEMORY_MIB = 4096
CPUS = 2
BOOT_TIMEOUT = 240.0
POWEROFF_TIMEOUT = 30.0
SSH_USER_PATH = "/usr/local/bin:/usr/bin:/bin"
SSH_FAILED = 255  # ssh's own exit status when it could not run the command at all
CONSOLE_TAIL = 3000
KERNEL_ALARM = re.compile(r"Kernel panic|BUG:|Oops|soft lockup|hung_task|rcu_sched|Out of memory")
# Terminal control sequences systemd and getty write to the serial console.
ANSI_ESCAPE = re.compile(
    r"\x1b\[[0-9;?!]*[A-Za-z]"  # CSI
    r"|\x1b\][^\x07]*\x07"  # OSC
    r"|\x1b[()][A-Za-z0-9]"  # character set
    r"|[\x00-\x08\x0b-\x1f]"
)

NETWORK_UNIT = f"""[Match]
Name=en* eth*

[Network]
Address={GUEST_ADDRESS}
Gateway={GUEST_GATEWAY}
LinkLocalAddressing=no
IPv6AcceptRA=no
"""
SSHD_CONFIG = """PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
"""
FSTAB = "/dev/vda / ext4 rw,errors=remount-ro 0 1\n"


class VirtualMachineError(CairnError):
    """A test VM could not be built, booted, used or torn down."""

    code = "test-vm"


def vm_recipe_hash(base: Path) -> str:
    recipe = {
        "base": base.name,
        "packages": sorted(VM_PACKAGES),
        "network": NETWORK_UNIT,
        "sshd": SSHD_CONFIG,
        "fstab": FSTAB,
        "version": RECIPE_VERSION,
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


class VmBase:
    """A cached VM base: root tree, kernel, initramfs and the SSH key that logs in as root."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rootfs = path / "rootfs"
        self.kernel = path / "vmlinuz"
        self.initrd = path / "initrd.img"
        self.key = path / "id_ed25519"


def ensure_vm_base(deb: Path) -> VmBase:
    """Return the cached VM base for ``deb``'s base root filesystem, building it once.

    Parallel callers serialize on a lock file; the entry is built beside its final name
    and renamed into place only when complete.
    """
    base = ensure_base_rootfs(deb)
    target = cache_dir() / f"vm-{vm_recipe_hash(base)}"
    if target.is_dir():
        return VmBase(target)
    with locked(cache_dir() / f".{target.name}.lock"):
        if target.is_dir():
            return VmBase(target)
        started = time.monotonic()
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=cache_dir()))
        try:
            _build_vm_base(base, VmBase(staging))
            staging.chmod(0o755)
            staging.rename(target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        log.info("built VM base %s in %.1f s", target, time.monotonic() - started)
    return VmBase(target)


def _build_vm_base(base: Path, vm: VmBase) -> None:
    run(["cp", "-a", "--reflink=auto", base, vm.rootfs], timeout=600)
    root = vm.rootfs
    apt_env = {"DEBIAN_FRONTEND": "noninteractive"}
    run(["chroot", root, "apt-get", "update"], env=apt_env, timeout=600)
    run(
        ["chroot", root, "apt-get", "install", "-y", "--no-install-recommends", *VM_PACKAGES],
        env=apt_env,
        timeout=1800,
    )
    run(["chroot", root, "apt-get", "clean"], env=apt_env)
    (root / "etc/systemd/network").mkdir(parents=True, exist_ok=True)
    (root / "etc/systemd/network/20-qemu-user.network").write_text(NETWORK_UNIT)
    run(["chroot", root, "systemctl", "enable", "systemd-networkd.service", "ssh.service"])
    (root / "etc/ssh/sshd_config.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/ssh/sshd_config.d/cairn-test.conf").write_text(SSHD_CONFIG)
    (root / "etc/fstab").write_text(FSTAB)
    (root / "etc/hostname").write_text("cairn-vm\n")
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "cairn-vm-test", "-f", vm.key])
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(vm.key.with_suffix(".pub").read_text())
    (ssh_dir / "authorized_keys").chmod(0o600)
    kernels = sorted((root / "boot").glob("vmlinuz-*"))
    initrds = sorted((root / "boot").glob("initrd.img-*"))
    if len(kernels) != 1 or len(initrds) != 1:
        raise VirtualMachineError(
            f"expected one kernel and one initramfs in {root}/boot, found "
            f"{[k.name for k in kernels]} and {[i.name for i in initrds]}",
            hint="delete the VM base directory and rebuild it",
        )
    shutil.copyfile(kernels[0], vm.kernel)
    shutil.copyfile(initrds[0], vm.initrd)


def _free_local_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class VirtualMachine:
    """One booted throwaway VM; use as a context manager or call :meth:`close`."""

    def __init__(self, deb: Path, *, memory_mib: int = MEMORY_MIB, cpus: int = CPUS) -> None:
        self.deb = deb
        self.memory_mib = memory_mib
        self.cpus = cpus
        self.tmp = Path(tempfile.mkdtemp(prefix="cairn-vm-"))
        self.merged = self.tmp / "root"
        self.image = self.tmp / "vm.img"
        self.console_log = self.tmp / "console.log"
        self.qemu_stderr = self.tmp / "qemu.stderr"
        self.control_socket = self.tmp / "ssh.ctl"
        self.port = 0
        self.timings: dict[str, float] = {}
        self._base: VmBase | None = None
        self._qemu: subprocess.Popen[bytes] | None = None
        self._ssh_master: subprocess.Popen[bytes] | None = None
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> VirtualMachine:
        """Build the disk image with the package installed and boot until systemd runs."""
        try:
            t = time.monotonic()
            self._base = ensure_vm_base(self.deb)
            self.timings["base"] = time.monotonic() - t
            t = time.monotonic()
            self._make_image(self._base)
            self.timings["image"] = time.monotonic() - t
            t = time.monotonic()
            self._boot(self._base)
            self.timings["boot"] = time.monotonic() - t
        except BaseException:
            self.close()
            raise
        log.info("VM ready on 127.0.0.1:%d: %s", self.port, self.timings)
        return self

    def __enter__(self) -> VirtualMachine:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _make_image(self, base: VmBase) -> None:
        upper, work = self.tmp / "upper", self.tmp / "work"
        for d in (upper, work, self.merged):
            d.mkdir()
        run(
            [
                "mount",
                "-t",
                "overlay",
                "overlay",
                "-o",
                f"lowerdir={base.rootfs},upperdir={upper},workdir={work}",
                self.merged,
            ]
        )
        try:
            self._install_package()
            self._create_users()
            run(["truncate", "-s", IMAGE_SIZE, self.image])
            run(
                ["mkfs.ext4", "-q", "-F", "-L", "cairn-vm", "-d", self.merged, self.image],
                timeout=600,
            )
        finally:
            run(["umount", self.merged])
        shutil.rmtree(upper)
        shutil.rmtree(work)

    def _install_package(self) -> None:
        staged = self.merged / "tmp" / self.deb.name
        shutil.copyfile(self.deb, staged)
        result = run(
            ["chroot", self.merged, "dpkg", "-i", f"/tmp/{self.deb.name}"],
            env={"DEBIAN_FRONTEND": "noninteractive"},
            check=False,
            timeout=300,
        )
        staged.unlink()
        audit = run(["chroot", self.merged, "dpkg", "--audit"], check=False).stdout.decode()
        if result.returncode != 0 or audit.strip():
            output = (result.stdout + result.stderr).decode(errors="replace")
            raise VirtualMachineError(
                f"dpkg -i {self.deb.name} left the package unconfigured",
                hint=f"dpkg output:\n{output}\ndpkg --audit:\n{audit}",
            )

    def _create_users(self) -> None:
        for user, uid in TEST_USERS.items():
            run(
                [
                    "chroot",
                    self.merged,
                    "useradd",
                    "--create-home",
                    "--user-group",
                    "--uid",
                    str(uid),
                    "--shell",
                    "/bin/bash",
                    user,
                ]
            )

    def _qemu_argv(self, base: VmBase) -> list[str]:
        return [
            "qemu-system-x86_64",
            "-nodefaults",
            "-no-user-config",
            # KVM guests hang at kernel start on the development hosts. One host thread for
            # all vCPUs: with one each, a vCPU ran the scheduler's code while the other
            # patched it, and the guest panicked (test_the_guest_kernel_survives_cpu_quota_flips).
            "-accel",
            f"tcg,thread={os.environ.get('CAIRN_VM_TCG_THREAD', 'single')}",
            "-cpu",
            "max",
            "-m",
            str(self.memory_mib),
            "-smp",
            str(self.cpus),
            "-kernel",
            str(base.kernel),
            "-initrd",
            str(base.initrd),
            "-append",
            # panic=1 with -no-reboot: a guest kernel panic ends qemu at once, and the
            # next exec says so with the console log, instead of ssh timing out.
            "root=/dev/vda rw console=ttyS0 quiet systemd.show_status=false panic=1",
            "-drive",
            f"file={self.image},if=virtio,format=raw,cache=unsafe",
            # restrict=on: the guest reaches nothing outside; only the forward comes in.
            "-netdev",
            f"user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:{self.port}-:22",
            "-device",
            "virtio-net-pci,netdev=n0",
            "-display",
            "none",
            "-serial",
            f"file:{self.console_log}",
            "-monitor",
            "none",
            "-no-reboot",
        ]

    def _boot(self, base: VmBase) -> None:
        self.port = _free_local_port()
        # A long-running child, so not cairn.proc.run; we keep its PID to end it.
        with open(self.qemu_stderr, "wb") as stderr:
            self._qemu = subprocess.Popen(
                self._qemu_argv(base),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=make_env(),
            )
        deadline = time.monotonic() + BOOT_TIMEOUT
        self._connect(deadline)
        while True:
            remaining = max(5.0, deadline - time.monotonic())
            state = self.exec(
                ["systemctl", "is-system-running", "--wait"], check=False, timeout=remaining
            ).stdout.decode().strip()
            if state in ("running", "degraded"):
                if state == "degraded":
                    failed = self.exec(["systemctl", "--failed", "--no-legend"], check=False)
                    log.warning("VM booted degraded: %s", failed.stdout.decode().strip())
                return
            if time.monotonic() > deadline:
                raise VirtualMachineError(
                    f"VM did not finish booting (state {state or 'unknown'})",
                    hint=self.health(),
                )
            time.sleep(1)

    def _ssh_base(self) -> list[str]:
        assert self._base is not None
        return [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            str(self._base.key),
            "-p",
            str(self.port),
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            f"ControlPath={self.control_socket}",
        ]

    def _connect(self, deadline: float) -> None:
        """Wait for sshd, then keep one master connection that every :meth:`exec` reuses."""
        assert self._qemu is not None
        while True:
            if self._qemu.poll() is not None:
                raise VirtualMachineError(
                    f"qemu exited with status {self._qemu.returncode} during boot",
                    hint=self.health(),
                )
            probe = run(
                [*self._ssh_base(), "-o", "ConnectTimeout=10", "root@127.0.0.1", "true"],
                check=False,
                timeout=60,
            )
            if probe.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise VirtualMachineError(
                    f"the VM's sshd did not answer within {BOOT_TIMEOUT:.0f} s (last ssh error:"
                    f" {probe.stderr.decode(errors='replace').strip()})",
                    hint=self.health(),
                )
            time.sleep(1)
        self._ssh_master = subprocess.Popen(
            [
                *self._ssh_base(),
                "-M",
                "-N",
                "-o",
                "ControlPersist=no",
                "-o",
                "ServerAliveInterval=15",
                "root@127.0.0.1",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=make_env(),
        )
        while not self.control_socket.exists():
            if self._ssh_master.poll() is not None:
                raise VirtualMachineError("the SSH master connection to the VM ended at once")
            if time.monotonic() > deadline:
                raise VirtualMachineError("the SSH master connection to the VM did not come up")
            time.sleep(0.1)

    def poweroff(self) -> None:
        """Shut the VM down cleanly; end the QEMU process we started if it does not stop."""
        qemu = self._qemu
        if qemu is None or qemu.poll() is not None:
            return
        if self._ssh_master is not None:
            with contextlib.suppress(CairnError, subprocess.TimeoutExpired):
                self.exec(["systemctl", "poweroff", "--no-block"], check=False, timeout=20)
        try:
            qemu.wait(timeout=POWEROFF_TIMEOUT)
            return
        except subprocess.TimeoutExpired:
            log.warning("VM did not power off; ending qemu %d", qemu.pid)
        qemu.send_signal(signal.SIGTERM)
        try:
            qemu.wait(timeout=10)
        except subprocess.TimeoutExpired:
            qemu.kill()
            qemu.wait(timeout=10)

    def _end_ssh_master(self) -> None:
        master = self._ssh_master
        if master is None or master.poll() is not None:
            return
        master.terminate()
        try:
            master.wait(timeout=5)
        except subprocess.TimeoutExpired:
            master.kill()
            master.wait(timeout=5)

    def close(self) -> None:
        """Power off and remove every trace: processes, the overlay mount, temporary files."""
        if self._closed:
            return
        self._closed = True
        problems: list[str] = []
        try:
            self.poweroff()
        except Exception as err:  # teardown must go on to end processes and clean up
            problems.append(f"poweroff: {err}")
        try:
            self._end_ssh_master()
        except Exception as err:
            problems.append(f"ssh master: {err}")
        if self._qemu is not None and self._qemu.poll() is None:
            self._qemu.kill()
            self._qemu.wait(timeout=10)
        for mountpoint in sorted(mountpoints_under(self.tmp), key=len, reverse=True):
            result = run(["umount", mountpoint], check=False)
            if result.returncode != 0:
                problems.append(f"umount {mountpoint}: {result.stderr.decode().strip()}")
        left = mountpoints_under(self.tmp)
        if left:
            problems.append(f"still mounted, not removing {self.tmp}: {left}")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)
        if problems:
            raise VirtualMachineError(f"teardown of the VM was incomplete: {problems}")

    @property
    def qemu_pid(self) -> int | None:
        return self._qemu.pid if self._qemu is not None else None

    @property
    def running(self) -> bool:
        """Whether the QEMU process this machine started is still alive."""
        return self._qemu is not None and self._qemu.poll() is None

    # -- using the machine ---------------------------------------------------------------

    def exec(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        check: bool = True,
        timeout: float | None = 120,
        input: bytes | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        """Run ``argv`` in the VM over SSH, as root or as ``user`` with a login-like env."""
        if not self.running:
            raise VirtualMachineError("the VM is not running", hint=self.health())
        inner: list[str] = list(argv)
        if user is not None:
            inner = [
                "setpriv",
                f"--reuid={user}",
                f"--regid={user}",
                "--init-groups",
                "--reset-env",
                "--",
                "env",
                f"HOME=/home/{user}",
                f"USER={user}",
                f"LOGNAME={user}",
                f"PATH={SSH_USER_PATH}",
                "LANG=C.UTF-8",
                "SHELL=/bin/bash",
                *argv,
            ]
        ssh = [*self._ssh_base(), "-o", "ControlMaster=no", "root@127.0.0.1", "--"]
        # sshd hands the command to the remote shell as one string.
        try:
            result = run([*ssh, shlex.join(inner)], check=check, timeout=timeout, input=input)
        except subprocess.TimeoutExpired as err:
            raise VirtualMachineError(
                f"{shlex.join(argv)} did not finish in the VM within {timeout:.0f} s",
                hint=self.health(),
            ) from err
        except ProcessFailed as err:
            if err.returncode == SSH_FAILED:
                raise self._unreachable(argv, err.stderr) from err
            raise
        if result.returncode == SSH_FAILED:
            raise self._unreachable(argv, result.stderr.decode(errors="replace"))
        return result

    def _unreachable(self, argv: Sequence[str], stderr: str) -> VirtualMachineError:
        lines = stderr.strip().splitlines()
        reason = lines[-1] if lines else "no message"
        return VirtualMachineError(
            f"ssh could not run {shlex.join(argv)} in the VM: {reason}", hint=self.health()
        )

    def health(self) -> str:
        """What a failed boot or call into the VM should report, since teardown removes the
        logs: whether QEMU still runs (or what it printed when it ended), and the end of
        the guest's console (where a kernel panic or an OOM report shows)."""
        if self._qemu is None:
            return "qemu was never started"
        status = self._qemu.poll()
        if status is None:
            state = "qemu is running"
        else:
            printed = self.qemu_stderr.read_text(errors="replace").strip()[-CONSOLE_TAIL:]
            state = f"qemu exited with status {status}, printing: {printed or 'nothing'}"
        try:
            console = self.console_log.read_text(errors="replace")
        except OSError as err:
            return f"{state}; the console log cannot be read: {err}"
        cleaned = (ANSI_ESCAPE.sub("", line).strip() for line in console.splitlines())
        lines = [line for line in cleaned if line]
        # A panic's headline scrolls out of the tail behind its stack trace.
        alarms = [line for line in lines if KERNEL_ALARM.search(line)][-10:]
        tail = "\n".join(lines)[-CONSOLE_TAIL:]
        return (
            f"{state}; kernel alarms on the guest console: {alarms or 'none'};"
            f" the end of the console:\n{tail}"
        )

    def read(self, path: str) -> str:
        """The text of a file in the VM, read as root."""
        return self.exec(["cat", path]).stdout.decode(errors="replace")

    def journal(self, unit: str | None = None, run_id: str | None = None) -> str:
        """The VM's journal as plain messages, optionally for one unit or one run."""
        argv = ["journalctl", "--no-pager", "--output=cat"]
        if unit is not None:
            argv += ["--unit", unit]
        if run_id is not None:
            argv.append(f"CAIRN_RUN={run_id}")
        return self.exec(argv, check=False).stdout.decode(errors="replace")
