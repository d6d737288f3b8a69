"""Throwaway Debian 13 machines with a real systemd PID 1, for the system test tier.

A machine is a ``systemd-nspawn`` container booted from an overlay of a cached base root
filesystem, with the package under test installed by ``dpkg -i``. Every machine is torn
down completely — powered off, unmounted, loop devices detached, temporary files removed —
also when a test fails or the boot hangs.

Base root filesystem
    ``${CAIRN_TEST_CACHE:-/var/cache/cairn-tests}/trixie-<recipe hash>``, built once by
    ``debootstrap --variant=minbase`` plus ``apt-get install`` (in a chroot) of the
    package's runtime dependencies, read from the built ``.deb``. A changed recipe or
    dependency list gives a new hash and a new directory; delete the cache directory to
    rebuild. ``CAIRN_TEST_MIRROR`` overrides the Debian mirror.

Coverage of the root broker
    With ``CAIRN_BROKER_COVERAGE`` set to a host directory, the installed broker of every
    machine runs under coverage.py (``python3-coverage`` is in the base root filesystem;
    a ``.pth`` starts it in a process whose environment has ``COVERAGE_PROCESS_START``,
    which only a test drop-in of ``cairn-broker.service`` sets), and the data files are
    copied into that directory after the machine powers off. ``./dev test`` combines them
    with the host's (``[tool.coverage.paths]`` in pyproject.toml).

Limits of the tier
    cgroup limits (``MemoryMax=``, ``TasksMax=``, ``CPUQuota=``) are not enforced inside
    nspawn on hosts with a cgroup v1 hybrid; those belong to the VM tier.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType

from cairn.errors import CairnError
from cairn.proc import run

log = logging.getLogger(__name__)

SUITE = "trixie"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_CACHE = "/var/cache/cairn-tests"

# debootstrap's resolver cannot pick providers of virtual packages (python3-cryptography
# needs python3-cffi-backend-api-*), so only plain packages go into --include and the
# package's dependencies are installed with apt inside the chroot.
BASE_INCLUDE = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "dbus-user-session",
    "libpam-systemd",
    "sudo",
    "util-linux",
    "procps",
    "iproute2",
    "btrfs-progs",
    "python3",
)
# Not dependencies of the package: the broker's coverage in the system tier, and SSH
# between two machines for 'cairn -H' (sshd is off unless a test starts it).
TEST_PACKAGES = ("python3-coverage", "openssh-client", "openssh-server")

COVERAGE_ENV = "CAIRN_BROKER_COVERAGE"
COVERAGE_DATA = "/var/lib/cairn-coverage"
COVERAGE_CONFIG = "/etc/cairn-coverage.toml"
# The broker's own modules and the library it loads, where the package installs them.
COVERAGE_MACHINE_CONFIG = f"""\
[tool.coverage.run]
branch = true
parallel = true
sigterm = true
data_file = "{COVERAGE_DATA}/data"
include = ["/usr/lib/python3/dist-packages/cairn/*"]
"""
COVERAGE_DROP_IN = f"""\
[Service]
Environment=COVERAGE_PROCESS_START={COVERAGE_CONFIG}
ReadWritePaths=-{COVERAGE_DATA}
"""
# Every Python process reads it; only one with COVERAGE_PROCESS_START imports coverage.
COVERAGE_PTH = (
    "import os; os.environ.get('COVERAGE_PROCESS_START') "
    "and __import__('coverage').process_startup()\n"
)

TEST_USERS = {"alice": 1001, "bob": 1002}

BOOT_TIMEOUT = 60.0
POWEROFF_TIMEOUT = 20.0
POOL_IMAGE_SIZE = "2G"


class MachineError(CairnError):
    """A test machine could not be built, booted, used or torn down."""

    code = "test-machine"


def cache_dir() -> Path:
    return Path(os.environ.get("CAIRN_TEST_CACHE", DEFAULT_CACHE))


def mirror() -> str:
    return os.environ.get("CAIRN_TEST_MIRROR", DEFAULT_MIRROR)


def deb_runtime_packages(deb: Path) -> list[str]:
    """The package names the ``.deb`` depends on (first alternative, versions dropped)."""
    field = run(["dpkg-deb", "-f", deb, "Depends"]).stdout.decode().strip()
    names: list[str] = []
    for clause in field.split(","):
        first = clause.split("|")[0].strip()
        if not first:
            continue
        name = re.split(r"[\s(]", first, maxsplit=1)[0]
        name = name.split(":", 1)[0]  # python3:any -> python3
        if name not in names:
            names.append(name)
    return names


def recipe_hash(packages: Sequence[str]) -> str:
    """Identity of a base root filesystem: suite, mirror, included and installed packages."""
    recipe = {
        "suite": SUITE,
        "mirror": mirror(),
        "include": sorted(BASE_INCLUDE),
        "packages": sorted(packages),
        "test_packages": sorted(TEST_PACKAGES),
        "version": 2,
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _cached(root: Path, build: Callable[[Path], None]) -> Path:
    """``root``, built once by ``build`` into a temporary directory beside it and renamed
    into place only when complete; parallel callers serialize on a lock file."""
    if root.is_dir():
        return root
    with _locked(cache_dir() / f".{root.name}.lock"):
        if root.is_dir():
            return root
        started = time.monotonic()
        staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=cache_dir()))
        try:
            build(staging)
            staging.chmod(0o755)
            staging.rename(root)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        log.info("built rootfs %s in %.1f s", root, time.monotonic() - started)
    return root


def ensure_base_rootfs(deb: Path) -> Path:
    """Return the cached base root filesystem for ``deb``'s dependencies, building it once."""
    packages = deb_runtime_packages(deb) + list(TEST_PACKAGES)
    return _cached(cache_dir() / f"{SUITE}-{recipe_hash(packages)}",
                   lambda staging: _build_rootfs(staging, packages))


def ensure_rootfs_with(deb: Path, extra: Sequence[str]) -> Path:
    """The base root filesystem of ``deb`` with the ``extra`` packages installed (apt),
    cached beside it as ``<base>+<hash>``: a copy of the base, built once."""
    base = ensure_base_rootfs(deb)
    if not extra:
        return base
    digest = hashlib.sha256(json.dumps([base.name, sorted(extra)]).encode()).hexdigest()[:16]

    def build(staging: Path) -> None:
        run(["cp", "-a", f"{base}/.", staging], timeout=600)
        _apt_install(staging, extra)

    return _cached(cache_dir() / f"{base.name}+{digest}", build)


def _apt_install(target: Path, packages: Sequence[str]) -> None:
    apt_env = {"DEBIAN_FRONTEND": "noninteractive"}
    run(["chroot", target, "apt-get", "update"], env=apt_env, timeout=600)
    run(["chroot", target, "apt-get", "install", "-y", "--no-install-recommends", *packages],
        env=apt_env, timeout=1800)
    run(["chroot", target, "apt-get", "clean"], env=apt_env)


def _build_rootfs(target: Path, packages: Sequence[str]) -> None:
    run(
        [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(BASE_INCLUDE)}",
            SUITE,
            target,
            mirror(),
        ],
        timeout=1800,
    )
    _apt_install(target, packages)
    run(["chroot", target, "systemctl", "disable", "ssh.service", "ssh.socket"], check=False)
    # Each machine gets a fresh machine ID at first boot.
    (target / "etc/machine-id").write_text("")
    (target / "etc/hostname").write_text("cairn-test\n")


def _mountpoints_under(path: Path) -> list[str]:
    prefix = str(path).rstrip("/") + "/"
    found = []
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            mountpoint = line.split()[1].replace("\\040", " ")
            if mountpoint == str(path) or mountpoint.startswith(prefix):
                found.append(mountpoint)
    return found


def _attached_loops() -> dict[str, str]:
    """Attached loop devices: name -> backing file as the kernel reports it."""
    attached = {}
    for entry in Path("/sys/block").glob("loop*"):
        backing = entry / "loop" / "backing_file"
        with contextlib.suppress(FileNotFoundError):
            attached[entry.name] = backing.read_text().strip()
    return attached


class Machine:
    """One booted throwaway machine; use as a context manager or call :meth:`close`."""

    def __init__(
        self,
        deb: Path,
        *,
        with_pool: bool = False,
        bind_loop_devices: bool = False,
        name: str | None = None,
        binds: Sequence[tuple[Path, str]] = (),
        packages: Sequence[str] = (),
        debs: Sequence[Path] = (),
    ) -> None:
        """``binds``: host directories bound into the machine, at the given paths;
        ``packages``: Debian packages in its root filesystem beside the package's
        dependencies (a cached root of their own); ``debs``: more .deb files installed
        with ``deb``."""
        self.deb = deb
        self.packages = tuple(packages)
        self.debs = tuple(debs)
        self.binds = tuple(binds)
        self.with_pool = with_pool
        self.bind_loop_devices = bind_loop_devices
        self.tmp = Path(tempfile.mkdtemp(prefix="cairn-machine-"))
        self.name = name or f"cairn-{secrets.token_hex(4)}"
        self.merged = self.tmp / "root"
        self.pool_image = self.tmp / "pool.img"
        self.pool_mount = self.tmp / "pool"
        self.console_log = self.tmp / "console.log"
        self.timings: dict[str, float] = {}
        self._nspawn: subprocess.Popen[bytes] | None = None
        self._pid1: int | None = None
        self._loops_before_boot: dict[str, str] = {}
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Machine:
        """Prepare the root, install the package and boot until systemd reports running."""
        try:
            started = time.monotonic()
            base = ensure_rootfs_with(self.deb, self.packages)
            self.timings["base"] = time.monotonic() - started
            t = time.monotonic()
            self._mount_overlay(base)
            self._install_package()
            self._create_users()
            self._measure_broker()
            if self.with_pool:
                self._make_pool()
            self.timings["install"] = time.monotonic() - t
            t = time.monotonic()
            self._boot()
            self.timings["boot"] = time.monotonic() - t
        except BaseException:
            self.close()
            raise
        log.info("machine %s ready: %s", self.name, self.timings)
        return self

    def __enter__(self) -> Machine:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _mount_overlay(self, base: Path) -> None:
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
                f"lowerdir={base},upperdir={upper},workdir={work}",
                self.merged,
            ]
        )

    def _install_package(self) -> None:
        debs = (self.deb, *self.debs)
        for deb in debs:
            shutil.copyfile(deb, self.merged / "tmp" / deb.name)
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        result = run(
            ["chroot", self.merged, "dpkg", "-i", *(f"/tmp/{deb.name}" for deb in debs)],
            env=env,
            check=False,
            timeout=300,
        )
        for deb in debs:
            (self.merged / "tmp" / deb.name).unlink()
        audit = run(["chroot", self.merged, "dpkg", "--audit"], check=False).stdout.decode()
        if result.returncode != 0 or audit.strip():
            output = (result.stdout + result.stderr).decode(errors="replace")
            raise MachineError(
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

    def _measure_broker(self) -> None:
        """Run the installed broker under coverage if ``CAIRN_BROKER_COVERAGE`` asks."""
        if not os.environ.get(COVERAGE_ENV):
            return
        (self.merged / COVERAGE_CONFIG.lstrip("/")).write_text(COVERAGE_MACHINE_CONFIG)
        (self.merged / COVERAGE_DATA.lstrip("/")).mkdir(mode=0o700)
        drop_in = self.merged / "etc/systemd/system/cairn-broker.service.d/coverage.conf"
        drop_in.parent.mkdir(parents=True, exist_ok=True)
        drop_in.write_text(COVERAGE_DROP_IN)
        pth = self.merged / "usr/lib/python3/dist-packages/zz-cairn-coverage.pth"
        pth.write_text(COVERAGE_PTH)

    def _collect_coverage(self) -> None:
        """Copy the broker's coverage data out of the powered-off machine."""
        target = os.environ.get(COVERAGE_ENV)
        data = self.merged / COVERAGE_DATA.lstrip("/")
        if not target or not data.is_dir():
            return
        Path(target).mkdir(parents=True, exist_ok=True)
        for file in data.iterdir():
            shutil.copyfile(file, Path(target) / f"{file.name}.{self.name}")

    def _make_pool(self) -> None:
        run(["truncate", "-s", POOL_IMAGE_SIZE, self.pool_image])
        run(["mkfs.btrfs", "-q", self.pool_image])
        self.pool_mount.mkdir()
        run(["mount", "-o", "loop,noatime", self.pool_image, self.pool_mount])  # as storage init

    def _nspawn_argv(self) -> list[str]:
        argv = [
            "systemd-nspawn",
            "--quiet",
            "--directory",
            str(self.merged),
            "--machine",
            self.name,
            # The hosts have no systemd as PID 1 and no machined.
            "--register=no",
            "--keep-unit",
            "--private-network",
            "--resolv-conf=off",
            "--timezone=off",
            "--link-journal=no",
            "--console=read-only",
            # nspawn's own seccomp allow list (systemd 252 on the hosts) predates Landlock;
            # the control worker sandboxes itself with it, as on a real host.
            "--system-call-filter=landlock_create_ruleset landlock_add_rule "
            "landlock_restrict_self",
            "--boot",
        ]
        if self.with_pool:
            argv.insert(-1, f"--bind={self.pool_mount}:/var/lib/cairn/pool")
        argv[-1:-1] = [f"--bind={source}:{target}" for source, target in self.binds]
        if self.bind_loop_devices:
            # `mount -o loop` needs loop-control and every node it may hand out.
            nodes = ["/dev/loop-control", *sorted(map(str, Path("/dev").glob("loop[0-9]*")))]
            argv[-1:-1] = [f"--bind={node}" for node in nodes]
        return argv

    def _boot(self) -> None:
        self._loops_before_boot = _attached_loops()
        with open(self.console_log, "wb") as console:
            # A long-running child, so not cairn.proc.run; we keep its PID to end it.
            self._nspawn = subprocess.Popen(
                self._nspawn_argv(),
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
            )
        deadline = time.monotonic() + BOOT_TIMEOUT
        self._pid1 = self._wait_for_pid1(deadline)
        while True:
            state = (
                self.exec(
                    ["systemctl", "is-system-running", "--wait"],
                    check=False,
                    timeout=max(1.0, deadline - time.monotonic()),
                )
                .stdout.decode()
                .strip()
            )
            if state in ("running", "degraded"):
                return
            if time.monotonic() > deadline:
                raise MachineError(
                    f"machine {self.name} did not finish booting (state {state or 'unknown'})",
                    hint=f"see {self.console_log}",
                )
            time.sleep(0.2)

    def _wait_for_pid1(self, deadline: float) -> int:
        assert self._nspawn is not None
        while time.monotonic() < deadline:
            if self._nspawn.poll() is not None:
                raise MachineError(
                    f"systemd-nspawn exited with status {self._nspawn.returncode} during boot",
                    hint=self.console_log.read_text(errors="replace")[-2000:],
                )
            for child in self._children(self._nspawn.pid):
                with contextlib.suppress(FileNotFoundError, PermissionError):
                    exe = os.readlink(f"/proc/{child}/exe")
                    if exe.endswith("/systemd"):
                        return child
            time.sleep(0.05)
        raise MachineError(f"no systemd PID 1 appeared in machine {self.name}")

    @staticmethod
    def _children(pid: int) -> list[int]:
        children: list[int] = []
        for task in Path(f"/proc/{pid}/task").glob("*"):
            with contextlib.suppress(FileNotFoundError):
                children.extend(int(c) for c in (task / "children").read_text().split())
        return children

    def poweroff(self) -> None:
        """Shut the machine down cleanly; escalate to killing what we started if it hangs."""
        proc = self._nspawn
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(CairnError, subprocess.TimeoutExpired):
            self.exec(["systemctl", "poweroff", "--no-block"], check=False, timeout=10)
        try:
            proc.wait(timeout=POWEROFF_TIMEOUT)
            return
        except subprocess.TimeoutExpired:
            log.warning("machine %s did not power off; killing it", self.name)
        # Killing the container's PID 1 ends its whole PID namespace.
        if self._pid1 is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid1, signal.SIGKILL)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def reboot(self) -> None:
        """Power off cleanly and boot the same root again; everything on disk survives."""
        self.poweroff()
        self._nspawn = None
        self._pid1 = None
        t = time.monotonic()
        self._boot()
        self.timings["reboot"] = time.monotonic() - t

    def close(self) -> None:
        """Power off and remove every trace: mounts, loop devices, temporary files."""
        if self._closed:
            return
        self._closed = True
        problems: list[str] = []
        try:
            self.poweroff()
        except Exception as err:  # teardown must go on to unmount and detach
            problems.append(f"poweroff: {err}")
        try:
            self._collect_coverage()
        except OSError as err:
            problems.append(f"coverage data: {err}")
        for mountpoint in sorted(_mountpoints_under(self.tmp), key=len, reverse=True):
            result = run(["umount", mountpoint], check=False)
            if result.returncode != 0:
                problems.append(f"umount {mountpoint}: {result.stderr.decode().strip()}")
        problems.extend(self._detach_loops())
        left = _mountpoints_under(self.tmp)
        if left:
            problems.append(f"still mounted, not removing {self.tmp}: {left}")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)
        if problems:
            raise MachineError(f"teardown of machine {self.name} was incomplete: {problems}")

    def _detach_loops(self) -> list[str]:
        problems = []
        targets = set(self.attached_loop_devices())
        if self.bind_loop_devices:
            # Devices the machine attached itself: new since boot, backing file inside the
            # machine (the kernel reports it relative to the machine's root or under ours).
            for dev, backing in _attached_loops().items():
                if self._loops_before_boot.get(dev) == backing:
                    continue
                if backing.startswith(str(self.tmp)) or not Path(backing).exists():
                    targets.add(f"/dev/{dev}")
        for dev in sorted(targets):
            result = run(["losetup", "-d", dev], check=False)
            if result.returncode != 0:
                problems.append(f"losetup -d {dev}: {result.stderr.decode().strip()}")
        return problems

    # -- using the machine ---------------------------------------------------------------

    def exec(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        check: bool = True,
        timeout: float | None = 60,
        input: bytes | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        """Run ``argv`` inside the machine as root or as ``user`` with a login-like env."""
        return run(self.command(argv, user=user), check=check, timeout=timeout, input=input)

    def command(self, argv: Sequence[str], *, user: str | None = None) -> list[str]:
        """The host command line that runs ``argv`` inside the machine as :meth:`exec`
        does, for a caller that talks to the process itself (over its stdin and stdout)."""
        if self._pid1 is None:
            raise MachineError(f"machine {self.name} is not running")
        inner: list[str] = list(argv)
        if user is not None:
            uid = TEST_USERS.get(user)
            if uid is None:
                uid = int(self._getent(["passwd", user]).split(":")[2])
            env = [
                f"HOME=/home/{user}",
                f"USER={user}",
                f"LOGNAME={user}",
                "PATH=/usr/local/bin:/usr/bin:/bin",
                "LANG=C.UTF-8",
                "SHELL=/bin/bash",
            ]
            if self._path_exists(f"/run/user/{uid}/bus"):
                env += [
                    f"XDG_RUNTIME_DIR=/run/user/{uid}",
                    f"DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/{uid}/bus",
                ]
            inner = [
                "setpriv",
                f"--reuid={user}",
                f"--regid={user}",
                "--init-groups",
                "--reset-env",
                "--",
                "env",
                *env,
                *argv,
            ]
        return ["nsenter", "--target", str(self._pid1), "--all", "--", *inner]

    def _path_exists(self, path: str) -> bool:
        return self.exec(["test", "-e", path], check=False).returncode == 0

    def _getent(self, args: Sequence[str]) -> str:
        return self.exec(["getent", *args]).stdout.decode().strip()

    def journal(self, unit: str | None = None, run_id: str | None = None) -> str:
        """The machine's journal as plain messages, optionally for one unit or one run."""
        argv = ["journalctl", "--no-pager", "--output=cat"]
        if unit is not None:
            argv += ["--unit", unit]
        if run_id is not None:
            argv.append(f"CAIRN_RUN={run_id}")
        return self.exec(argv, check=False).stdout.decode(errors="replace")

    def enable_user_manager(self, user: str, timeout: float = 30) -> None:
        """Start ``user``'s systemd manager (linger) and wait until its bus is up."""
        uid = TEST_USERS[user]
        self.exec(["loginctl", "enable-linger", user])
        deadline = time.monotonic() + timeout
        while not self._path_exists(f"/run/user/{uid}/bus"):
            if time.monotonic() > deadline:
                raise MachineError(f"user manager for {user} did not start")
            time.sleep(0.1)

    @property
    def pid1(self) -> int:
        if self._pid1 is None:
            raise MachineError(f"machine {self.name} is not running")
        return self._pid1

    def attached_loop_devices(self) -> list[str]:
        """Host loop devices that belong to this machine (its pool image)."""
        if not self.pool_image.exists():
            return []
        listed = run(["losetup", "-j", self.pool_image], check=False).stdout.decode()
        return [line.split(":", 1)[0] for line in listed.splitlines() if line]
