"""The control worker's own OS sandbox (ARCHITECTURE §2, §4.2).

The review is the authority declaration, not the security boundary: if workflow source
ever got past it, the code runs in a process that can still do only what the worker
needs. :func:`enter` is called by the worker itself, after its imports and before it
reads the start message, and fails closed (:class:`SandboxUnavailable`):

1. resource limits (:func:`limit_resources`) and no descriptors beyond stdin, stdout and
   stderr;
2. ``PR_SET_NO_NEW_PRIVS``;
3. Landlock: every filesystem right the running ABI knows is handled, and the only
   rules grant *read* (files and directory listings, not execute) beneath the
   directories Python imports from (``sys.path`` and the ``cairn`` package), so lazy
   imports (pydantic, the stdlib) keep working while the journal, ``/var/lib/cairn``,
   ``/etc``, ``/proc`` and ``/run`` cannot be opened and nothing can be written,
   created, removed or renamed anywhere. From ABI 4 TCP bind/connect are handled with no
   rule; from ABI 6 abstract Unix sockets and signals are scoped to the worker;
4. a seccomp filter (:data:`FILTER`, one row per system call, x86_64 and aarch64
   numbers): EPERM for everything that reaches outside the process and Landlock does not
   cover (sockets other than ``socketpair``, ``sendto`` with an address, ``sendmsg``,
   exec, process creation (threads stay), tracing, signals to other processes,
   namespaces and mounts, SysV/POSIX IPC, io_uring, bpf, keyrings, ownership, mode,
   xattr and timestamp changes, resource changes of other processes). A call
   made with a foreign architecture's convention kills the process.

The filter is a deny list on purpose: under systemd the worker inherits the unit's
allow list (``SystemCallFilter=@system-service``), and both filters apply; elsewhere
(unit tests) the deny list alone still closes every way out the tests try. Landlock
limits what can be *opened*; ``stat``-like calls on paths outside it still answer
(metadata, never content).
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = [
    "FILTER",
    "SandboxUnavailable",
    "compile_filter",
    "enter",
    "import_roots",
    "landlock_abi",
    "limit_resources",
]

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.prctl.restype = ctypes.c_int


class SandboxUnavailable(RuntimeError):
    """The kernel (or a seccomp filter around us) refuses to build the sandbox."""


# --- resource limits --------------------------------------------------------------

LIMITS = {
    resource.RLIMIT_NOFILE: 64,
    resource.RLIMIT_AS: 1 << 30,
    resource.RLIMIT_CORE: 0,
}


def limit_resources() -> None:
    """Tight limits, set by the worker on itself (no ``preexec_fn`` in the coordinator)."""
    for which, value in LIMITS.items():
        resource.setrlimit(which, (value, value))


# --- Landlock ---------------------------------------------------------------------

_SYS_LANDLOCK_CREATE_RULESET = 444  # the same numbers on x86_64 and aarch64
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_LANDLOCK_CREATE_RULESET_VERSION = 1 << 0
_LANDLOCK_RULE_PATH_BENEATH = 1

ACCESS_FS_EXECUTE = 1 << 0
ACCESS_FS_READ_FILE = 1 << 2
ACCESS_FS_READ_DIR = 1 << 3
# Every filesystem right, by the ABI that introduced it (1: EXECUTE..MAKE_SYM, 2: REFER,
# 3: TRUNCATE, 5: IOCTL_DEV). ABIs 4, 6 and 7 added no filesystem right.
_FS_RIGHTS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
_ACCESS_NET_BIND_TCP = 1 << 0  # ABI 4
_ACCESS_NET_CONNECT_TCP = 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
_SCOPE_SIGNAL = 1 << 1

READ_ONLY = ACCESS_FS_READ_FILE | ACCESS_FS_READ_DIR
"""What the worker may do beneath its import roots: read files, list directories."""

PROTECTED = ("/etc/cairn", "/var/lib/cairn", "/run/cairn")
"""No import root may contain these (a root of '/' or '/var' would hand them out)."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_HOW_TO_FIX = (
    "the control worker needs Landlock (Linux >= 5.13 with 'landlock' in the lsm= boot "
    "parameter or CONFIG_LSM; Debian 13, Ubuntu 26.04 and Fedora 42 enable it)"
)


def _syscall(number: int, *args: object) -> int:
    return int(_libc.syscall(ctypes.c_long(number), *args))


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; :class:`SandboxUnavailable` if there is none."""
    abi = _syscall(
        _SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
        ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION),
    )
    if abi >= 1:
        return abi
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EOPNOTSUPP):
        raise SandboxUnavailable(f"Landlock is not available ({os.strerror(err)}): {_HOW_TO_FIX}")
    if err == errno.EPERM:
        raise SandboxUnavailable(
            "Landlock is refused by a seccomp filter (EPERM): add 'SystemCallFilter="
            "landlock_create_ruleset landlock_add_rule landlock_restrict_self' to the unit "
            "that starts the control worker"
        )
    raise SandboxUnavailable(f"Landlock ABI query failed: {os.strerror(err)}")


def fs_rights(abi: int) -> int:
    """Every filesystem access right ABI ``abi`` knows."""
    return _FS_RIGHTS_BY_ABI[max(v for v in _FS_RIGHTS_BY_ABI if v <= abi)]


def import_roots() -> list[Path]:
    """The directories (or zip files) this interpreter imports from: ``sys.path`` and the
    ``cairn`` package (an editable install maps it from elsewhere), existing ones only,
    resolved, without duplicates or entries beneath another entry."""
    import cairn

    candidates = [Path(p) for p in sys.path if p] + [Path(cairn.__file__).parent]
    found: list[Path] = []
    for candidate in candidates:
        try:
            path = candidate.resolve(strict=True)
        except OSError:
            continue
        if path not in found:
            found.append(path)
    roots = [p for p in found if not any(o != p and p.is_relative_to(o) for o in found)]
    for root in roots:
        for protected in PROTECTED:
            if Path(protected).is_relative_to(root):
                raise SandboxUnavailable(
                    f"import path {root} contains {protected}; refusing to sandbox with it"
                )
    return roots


def restrict_filesystem(abi: int, roots: Iterable[Path]) -> None:
    """Enforce a Landlock domain on this process: read-only beneath ``roots``, nothing
    anywhere else; no TCP (ABI >= 4); no abstract sockets or signals out (ABI >= 6)."""
    handled = fs_rights(abi)
    attr = _RulesetAttr(handled_access_fs=handled)
    size = 8
    if abi >= 4:
        attr.handled_access_net = _ACCESS_NET_BIND_TCP | _ACCESS_NET_CONNECT_TCP
        size = 16
    if abi >= 6:
        attr.scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL
        size = 24
    ruleset = _syscall(
        _SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size),
        ctypes.c_uint32(0),
    )
    if ruleset < 0:
        raise SandboxUnavailable(
            f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}"
        )
    try:
        for root in roots:
            fd = os.open(root, os.O_PATH | os.O_CLOEXEC)
            try:
                # directory rights only make sense on a directory (EINVAL on a file)
                access = READ_ONLY if root.is_dir() else ACCESS_FS_READ_FILE
                rule = _PathBeneathAttr(allowed_access=access & handled, parent_fd=fd)
                if _syscall(
                    _SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset),
                    ctypes.c_int(_LANDLOCK_RULE_PATH_BENEATH), ctypes.byref(rule),
                    ctypes.c_uint32(0),
                ) < 0:
                    err = ctypes.get_errno()
                    raise SandboxUnavailable(f"landlock_add_rule {root}: {os.strerror(err)}")
            finally:
                os.close(fd)
        if _syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            err = ctypes.get_errno()
            raise SandboxUnavailable(f"landlock_restrict_self: {os.strerror(err)}")
    finally:
        os.close(ruleset)


# --- seccomp ----------------------------------------------------------------------

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000  # x86_64 only: the x32 ABI shares AUDIT_ARCH_X86_64

DENY = "deny"  # EPERM
ENOSYS = "enosys"  # so glibc falls back to an older call (clone3 -> clone)
SELF = "self"  # args[0] must be this process's PID
SELF_OR_0 = "self-or-0"  # args[0] must be this process's PID or 0 (meaning itself)
THREADS = "threads"  # clone: CLONE_THREAD set and no namespace flag
NO_ADDRESS = "no-address"  # sendto: no destination address (socketpair peers only)
NO_TTY_INJECTION = "no-tty-injection"  # ioctl: not TIOCSTI or TIOCLINUX

# name, x86_64 number, aarch64 number (None: the architecture has no such call), rule
FILTER: tuple[tuple[str, int | None, int | None, str], ...] = (
    # sockets: socketpair, read/write, recv* and sendto without address stay
    ("socket", 41, 198, DENY),
    ("connect", 42, 203, DENY),
    ("accept", 43, 202, DENY),
    ("accept4", 288, 242, DENY),
    ("bind", 49, 200, DENY),
    ("listen", 50, 201, DENY),
    ("sendto", 44, 206, NO_ADDRESS),
    ("sendmsg", 46, 211, DENY),
    ("sendmmsg", 307, 269, DENY),
    # programs and processes
    ("execve", 59, 221, DENY),
    ("execveat", 322, 281, DENY),
    ("fork", 57, None, DENY),
    ("vfork", 58, None, DENY),
    ("clone", 56, 220, THREADS),
    ("clone3", 435, 435, ENOSYS),
    # signals only to itself (Landlock's signal scope says the same from ABI 6)
    ("kill", 62, 129, SELF),
    ("tkill", 200, 130, SELF),
    ("tgkill", 234, 131, SELF),
    ("rt_sigqueueinfo", 129, 138, SELF),
    ("rt_tgsigqueueinfo", 297, 240, SELF),
    ("pidfd_open", 434, 434, DENY),
    ("pidfd_send_signal", 424, 424, DENY),
    ("pidfd_getfd", 438, 438, DENY),
    # looking into other processes and the kernel
    ("ptrace", 101, 117, DENY),
    ("process_vm_readv", 310, 270, DENY),
    ("process_vm_writev", 311, 271, DENY),
    ("process_madvise", 440, 440, DENY),
    ("process_mrelease", 448, 448, DENY),
    ("kcmp", 312, 272, DENY),
    ("perf_event_open", 298, 241, DENY),
    ("syslog", 103, 116, DENY),
    ("bpf", 321, 280, DENY),
    ("userfaultfd", 323, 282, DENY),
    ("io_uring_setup", 425, 425, DENY),  # its operations would bypass this filter
    ("io_uring_enter", 426, 426, DENY),
    ("io_uring_register", 427, 427, DENY),
    ("add_key", 248, 217, DENY),
    ("request_key", 249, 218, DENY),
    ("keyctl", 250, 219, DENY),
    ("fanotify_init", 300, 262, DENY),
    ("fanotify_mark", 301, 263, DENY),
    ("inotify_init", 253, None, DENY),
    ("inotify_init1", 294, 26, DENY),
    ("name_to_handle_at", 303, 264, DENY),
    ("open_by_handle_at", 304, 265, DENY),
    ("memfd_create", 319, 279, DENY),
    ("memfd_secret", 447, 447, DENY),
    ("personality", 135, 92, DENY),
    ("modify_ldt", 154, None, DENY),
    ("iopl", 172, None, DENY),
    ("ioperm", 173, None, DENY),
    ("lsm_set_self_attr", 460, 460, DENY),
    ("ioctl", 16, 29, NO_TTY_INJECTION),
    # namespaces and mounts
    ("unshare", 272, 97, DENY),
    ("setns", 308, 268, DENY),
    ("mount", 165, 40, DENY),
    ("umount2", 166, 39, DENY),
    ("pivot_root", 155, 41, DENY),
    ("chroot", 161, 51, DENY),
    ("open_tree", 428, 428, DENY),
    ("move_mount", 429, 429, DENY),
    ("fsopen", 430, 430, DENY),
    ("fsconfig", 431, 431, DENY),
    ("fsmount", 432, 432, DENY),
    ("fspick", 433, 433, DENY),
    ("mount_setattr", 442, 442, DENY),
    ("statmount", 457, 457, DENY),
    ("listmount", 458, 458, DENY),
    ("listns", 470, 470, DENY),
    ("open_tree_attr", 467, 467, DENY),
    # SysV and POSIX IPC
    ("shmget", 29, 194, DENY),
    ("shmat", 30, 196, DENY),
    ("shmctl", 31, 195, DENY),
    ("shmdt", 67, 197, DENY),
    ("semget", 64, 190, DENY),
    ("semop", 65, 193, DENY),
    ("semctl", 66, 191, DENY),
    ("semtimedop", 220, 192, DENY),
    ("msgget", 68, 186, DENY),
    ("msgsnd", 69, 189, DENY),
    ("msgrcv", 70, 188, DENY),
    ("msgctl", 71, 187, DENY),
    ("mq_open", 240, 180, DENY),
    ("mq_unlink", 241, 181, DENY),
    ("mq_timedsend", 242, 182, DENY),
    ("mq_timedreceive", 243, 183, DENY),
    ("mq_notify", 244, 184, DENY),
    ("mq_getsetattr", 245, 185, DENY),
    # changes to files Landlock does not cover (mode, owner, xattrs, times, sizes)
    ("chmod", 90, None, DENY),
    ("fchmod", 91, 52, DENY),
    ("fchmodat", 268, 53, DENY),
    ("fchmodat2", 452, 452, DENY),
    ("chown", 92, None, DENY),
    ("fchown", 93, 55, DENY),
    ("lchown", 94, None, DENY),
    ("fchownat", 260, 54, DENY),
    ("setxattr", 188, 5, DENY),
    ("lsetxattr", 189, 6, DENY),
    ("fsetxattr", 190, 7, DENY),
    ("setxattrat", 463, 463, DENY),
    ("removexattr", 197, 14, DENY),
    ("lremovexattr", 198, 15, DENY),
    ("fremovexattr", 199, 16, DENY),
    ("removexattrat", 466, 466, DENY),
    ("file_setattr", 469, 469, DENY),
    ("utime", 132, None, DENY),
    ("utimes", 235, None, DENY),
    ("futimesat", 261, None, DENY),
    ("utimensat", 280, 88, DENY),
    ("truncate", 76, 45, DENY),
    ("ftruncate", 77, 46, DENY),
    ("fallocate", 285, 47, DENY),
    # resources: its own limits only; nothing about other processes or the system
    ("prlimit64", 302, 261, SELF_OR_0),
    ("setpriority", 141, 140, DENY),
    ("sched_setaffinity", 203, 122, DENY),
    ("sched_setscheduler", 144, 119, DENY),
    ("sched_setparam", 142, 118, DENY),
    ("sched_setattr", 314, 274, DENY),
    ("ioprio_set", 251, 30, DENY),
    ("migrate_pages", 256, 238, DENY),
    ("move_pages", 279, 239, DENY),
    # the machine
    ("reboot", 169, 142, DENY),
    ("kexec_load", 246, 104, DENY),
    ("kexec_file_load", 320, 294, DENY),
    ("init_module", 175, 105, DENY),
    ("finit_module", 313, 273, DENY),
    ("delete_module", 176, 106, DENY),
    ("swapon", 167, 224, DENY),
    ("swapoff", 168, 225, DENY),
    ("acct", 163, 89, DENY),
    ("quotactl", 179, 60, DENY),
    ("quotactl_fd", 443, 443, DENY),
    ("sethostname", 170, 161, DENY),
    ("setdomainname", 171, 162, DENY),
    ("settimeofday", 164, 170, DENY),
    ("clock_settime", 227, 112, DENY),
    ("clock_adjtime", 305, 266, DENY),
    ("adjtimex", 159, 171, DENY),
    ("vhangup", 153, 58, DENY),
)

CLONE_THREAD = 0x00010000
CLONE_NAMESPACES = (
    0x00020000  # CLONE_NEWNS
    | 0x02000000  # CLONE_NEWCGROUP
    | 0x04000000  # CLONE_NEWUTS
    | 0x08000000  # CLONE_NEWIPC
    | 0x10000000  # CLONE_NEWUSER
    | 0x20000000  # CLONE_NEWPID
    | 0x40000000  # CLONE_NEWNET
)
TIOCSTI = 0x5412
TIOCLINUX = 0x541C

# classic BPF, as seccomp runs it on struct seccomp_data {int nr; u32 arch; u64 ip;
# u64 args[6]} (little-endian on both architectures: args[i] low word at 16 + 8 * i)
LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
JSET = 0x45  # BPF_JMP | BPF_JSET | BPF_K
RET = 0x06  # BPF_RET | BPF_K
OFF_NR, OFF_ARCH = 0, 4
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
RET_ALLOW = 0x7FFF0000
EPERM = RET_ERRNO | errno.EPERM

Insn = tuple[int, int, int, int]  # code, jt, jf, k


def _arg_low(index: int) -> int:
    return 16 + 8 * index


def _rule(rule: str, pid: int) -> list[Insn]:
    """The instructions for one row, entered with the call's number in A; each path ends
    in a return. Jump offsets count instructions skipped after the jump."""
    if rule == DENY:
        return [(RET, 0, 0, EPERM)]
    if rule == ENOSYS:
        return [(RET, 0, 0, RET_ERRNO | errno.ENOSYS)]
    if rule == SELF:  # pid_t arguments: the kernel reads the low word only
        return [
            (LD_ABS, 0, 0, _arg_low(0)),
            (JEQ, 1, 0, pid),
            (RET, 0, 0, EPERM),
            (RET, 0, 0, RET_ALLOW),
        ]
    if rule == SELF_OR_0:
        return [
            (LD_ABS, 0, 0, _arg_low(0)),
            (JEQ, 2, 0, pid),
            (JEQ, 1, 0, 0),
            (RET, 0, 0, EPERM),
            (RET, 0, 0, RET_ALLOW),
        ]
    if rule == THREADS:  # the clone flags that matter are all in the low word
        return [
            (LD_ABS, 0, 0, _arg_low(0)),
            (JSET, 1, 0, CLONE_NAMESPACES),
            (JSET, 1, 0, CLONE_THREAD),
            (RET, 0, 0, EPERM),
            (RET, 0, 0, RET_ALLOW),
        ]
    if rule == NO_ADDRESS:  # sendto's dest_addr (args[4]) must be NULL, both words
        return [
            (LD_ABS, 0, 0, _arg_low(4)),
            (JEQ, 0, 2, 0),
            (LD_ABS, 0, 0, _arg_low(4) + 4),
            (JEQ, 1, 0, 0),
            (RET, 0, 0, EPERM),
            (RET, 0, 0, RET_ALLOW),
        ]
    if rule == NO_TTY_INJECTION:  # ioctl's request is an unsigned int
        return [
            (LD_ABS, 0, 0, _arg_low(1)),
            (JEQ, 2, 0, TIOCSTI),
            (JEQ, 1, 0, TIOCLINUX),
            (RET, 0, 0, RET_ALLOW),
            (RET, 0, 0, EPERM),
        ]
    raise ValueError(f"unknown seccomp rule {rule!r}")


def compile_filter(arch: str, pid: int) -> list[Insn]:
    """The seccomp program for ``arch`` ('x86_64' or 'aarch64') in process ``pid``."""
    column = {"x86_64": 1, "aarch64": 2}[arch]
    program: list[Insn] = [
        (LD_ABS, 0, 0, OFF_ARCH),
        (JEQ, 1, 0, AUDIT_ARCH[arch]),
        (RET, 0, 0, RET_KILL_PROCESS),  # i386 via int 0x80, arm32 compat, ...
        (LD_ABS, 0, 0, OFF_NR),
    ]
    if arch == "x86_64":
        program += [(JGE, 0, 1, X32_SYSCALL_BIT), (RET, 0, 0, RET_KILL_PROCESS)]
    for row in FILTER:
        number = row[column]
        if number is None:
            continue
        assert isinstance(number, int)
        body = _rule(row[3], pid)
        program.append((JEQ, 0, len(body), number))
        program += body
    program.append((RET, 0, 0, RET_ALLOW))
    return program


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2


def _prctl(option: int, arg2: object, what: str) -> None:
    zero = ctypes.c_ulong(0)
    if _libc.prctl(ctypes.c_int(option), arg2, zero, zero, zero) != 0:
        raise SandboxUnavailable(f"{what}: {os.strerror(ctypes.get_errno())}")


def install_filter(program: Sequence[Insn]) -> None:
    """Load ``program`` with prctl(PR_SET_SECCOMP) (prctl is in systemd's @system-service;
    the seccomp() call is not in older systemd versions). The worker has one thread."""
    insns = (_SockFilter * len(program))(*(_SockFilter(*insn) for insn in program))
    fprog = _SockFprog(len(program), insns)
    zero = ctypes.c_ulong(0)
    if _libc.prctl(ctypes.c_int(_PR_SET_SECCOMP), ctypes.c_ulong(_SECCOMP_MODE_FILTER),
                   ctypes.byref(fprog), zero, zero) != 0:
        raise SandboxUnavailable(f"seccomp filter refused: {os.strerror(ctypes.get_errno())}")


# --- all together -----------------------------------------------------------------


def enter() -> int:
    """Sandbox this process for good; returns the Landlock ABI in force. Call once, after
    every import the worker needs up front and before any untrusted input is read."""
    arch = os.uname().machine
    if arch not in AUDIT_ARCH:
        raise SandboxUnavailable(f"no seccomp table for {arch}; the worker runs on "
                                 f"{', '.join(AUDIT_ARCH)} only")
    try:  # Landlock and a seccomp filter set without TSYNC bind the calling thread only
        threads = len(os.listdir("/proc/self/task"))
    except OSError:
        threads = 1
    if threads != 1:
        raise SandboxUnavailable(f"the worker has {threads} threads; sandbox it before any start")
    os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    limit_resources()
    abi = landlock_abi()
    roots = import_roots()
    _prctl(_PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), "PR_SET_NO_NEW_PRIVS")
    restrict_filesystem(abi, roots)
    install_filter(compile_filter(arch, os.getpid()))
    sys.dont_write_bytecode = True  # nothing is writable; do not even try
    return abi
