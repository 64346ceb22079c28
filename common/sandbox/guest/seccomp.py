"""The seccomp filter the guest puts on itself before it reads model-written code.

An allowlist: the kernel answers every system call not named below with ENOSYS ("this
kernel has no such call", which libraries meet with their fallbacks), and the calls in
``REFUSED`` with EPERM, so that a refusal reads as one ("Operation not permitted").

What stays allowed is what image code needs: reading and writing files in what the
sandbox shows, memory, threads, clocks, signals to itself. Some calls are allowed only
with safe arguments:

- ``clone``: threads only (``CLONE_THREAD``, no namespace flag); ``clone3`` answers
  ENOSYS so that the C library falls back to ``clone``;
- ``prlimit64``: reading this process's limits, never setting them;
- ``ioctl``: what Python asks of a descriptor (is it a terminal, its size, bytes
  waiting, blocking, close-on-exec): no typing into a terminal, nothing of the
  filesystem under a file;
- ``preadv2``, ``pwritev2``: no flags (``RWF_NOWAIT`` tells which pages are cached);
- ``madvise``: advice on its own memory, without KSM merging or paging out file pages;
- ``prctl``: reading only (``PR_GET_*``): the harness arms the parent-death signal, and
  the code may not rename itself (a name shows in the host's ``/proc``);
- ``fcntl``: descriptors and their flags, no locks on files the host shares, no
  leases or notifications, no larger pipe buffers;
- ``kill``, ``tgkill``: to this process only (its init is the only other process it
  could reach, and gVisor would deliver a signal a kernel drops for a PID 1), standard
  signals only (real-time ones queue, and the queue is counted per uid across
  sandboxes); ``tkill`` (which names no process) is refused;
- ``renameat2``: no whiteout (a device node);
- ``chmod`` and kin, ``open`` and kin: never a set-user-ID or set-group-ID mode.

Where the sandbox's device nodes are the host's own (a worker that is not root cannot
make nodes of its own), setting file times (``utime`` and kin) is refused too: anyone
who may write a file may set its times to now, and ``/dev/null`` is everyone's to write
(``install(refuse_times=True)``).

Some are answered "done" without running (``PRETENDED``): flushing files to disk (the
code's files are in a tmpfs; a flush would reach the host's disk) and file advice (it
could evict the host's page cache).

Refused among others: new processes (fork, vfork, clone without a thread), exec,
ptrace and other processes' memory, sockets, io_uring, memfd, links and device nodes,
mounts and namespaces, BPF, perf events, userfaultfd, keyrings, personality, changing
ids or limits. A call through a foreign ABI (32-bit ``int 0x80`` on x86_64) kills the
process; x32 numbers are refused.

The filter is classic BPF over ``struct seccomp_data`` (nr at 0, arch at 4, args from
16, each argument 8 bytes, low word first on these little-endian machines), built for
x86_64 and aarch64; anywhere else ``install`` refuses.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

try:  # the host imports this module (tests); the guest imports it by bare name
    from . import syscalls
except ImportError:
    import syscalls  # type: ignore[no-redef]

# -- the policy ---------------------------------------------------------------------
ALLOWED = """
    read write readv writev pread64 pwrite64 preadv pwritev lseek close
    close_range fstat stat lstat newfstatat statx statfs fstatfs access faccessat
    faccessat2 getdents64 getdents readlink readlinkat mkdir mkdirat rmdir unlink
    unlinkat rename renameat truncate ftruncate fallocate umask dup dup2 dup3 pipe
    pipe2 sendfile copy_file_range poll ppoll select pselect6 epoll_create epoll_create1
    epoll_ctl epoll_wait epoll_pwait epoll_pwait2 eventfd eventfd2
    mmap munmap mprotect mremap brk mbind get_mempolicy set_mempolicy msync
    futex set_robust_list get_robust_list set_tid_address rseq gettid
    sched_yield sched_getaffinity sched_setaffinity sched_getparam sched_getscheduler
    sched_get_priority_max sched_get_priority_min getpriority nanosleep clock_nanosleep
    clock_gettime clock_getres gettimeofday time times getrusage exit exit_group
    rt_sigaction rt_sigprocmask rt_sigreturn rt_sigpending rt_sigtimedwait
    rt_sigsuspend sigaltstack restart_syscall pause alarm getitimer setitimer
    timerfd_create timerfd_settime timerfd_gettime getpid getppid getuid geteuid getgid
    getegid getgroups getresuid getresgid getpgrp getpgid getsid getcwd chdir fchdir
    uname sysinfo getrlimit getrandom getcpu arch_prctl
""".split()  # noqa: SIM905 -- read as a list of words

REFUSED = """
    fork vfork execve execveat ptrace process_vm_readv process_vm_writev socket
    socketpair setrlimit mount umount2 fsopen fsconfig fsmount fspick move_mount
    open_tree mount_setattr unshare setns chroot pivot_root bpf keyctl add_key
    request_key perf_event_open userfaultfd personality io_uring_setup io_uring_enter
    io_uring_register memfd_create memfd_secret link linkat symlink symlinkat mknod
    mknodat kexec_load kexec_file_load init_module finit_module delete_module reboot
    syslog setuid setgid setreuid setregid setresuid setresgid setgroups
    setfsuid setfsgid capset chown fchown lchown fchownat pidfd_open pidfd_getfd
    pidfd_send_signal kcmp name_to_handle_at open_by_handle_at swapon swapoff acct
    settimeofday clock_settime clock_adjtime adjtimex shmget msgget semget mq_open
    process_madvise flock timer_create tkill
""".split()  # noqa: SIM905

TIMES = ["utime", "utimes", "utimensat", "futimesat"]  # allowed, or refused (install)

# answered "done" without running: what they would do reaches past the sandbox (a flush
# of the host's disk, advice that evicts the host's page cache), and the code's own
# files are in a tmpfs, where they change nothing anyway
PRETENDED = ["fsync", "fdatasync", "sync_file_range", "sync", "syncfs", "fadvise64"]

_CLONE_THREAD = 0x00010000
_CLONE_NAMESPACES = (
    0x7E020080  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME
)
_SIGRTMIN = 32
_SET_ID_BITS = 0o6000  # S_ISUID | S_ISGID
_RENAME_WHITEOUT = 4
# calls allowed when one argument (by index) is one of some values, below a bound, or
# without some bits: {name: (argument, test, values)}; (``kill`` and ``tgkill``: ``program``
# adds that the target is this process)
Condition = tuple[int, str, tuple[int, ...]]
_ARGUMENT_RULES: dict[str, Condition] = {
    # TCGETS, TIOCGWINSZ, FIONREAD, FIONBIO, FIONCLEX, FIOCLEX: what Python asks of a
    # descriptor (no typing into a terminal, nothing of the filesystem under a file)
    "ioctl": (1, "in", (0x5401, 0x5413, 0x541B, 0x5421, 0x5450, 0x5451)),
    # PR_GET_PDEATHSIG, _DUMPABLE, _NAME, _SECCOMP, PR_CAPBSET_READ, PR_GET_TIMERSLACK,
    # _NO_NEW_PRIVS, _THP_DISABLE
    "prctl": (0, "in", (2, 3, 16, 21, 23, 30, 39, 42)),
    # F_DUPFD, F_GETFD, F_SETFD, F_GETFL, F_SETFL, F_GETLK, F_DUPFD_CLOEXEC, F_GETPIPE_SZ
    "fcntl": (1, "in", (0, 1, 2, 3, 4, 5, 1030, 1032)),
    "kill": (1, "below", (_SIGRTMIN,)),
    "tgkill": (2, "below", (_SIGRTMIN,)),
    "renameat2": (4, "without", (_RENAME_WHITEOUT,)),
    # no RWF_NOWAIT: it tells which pages of a (host) file are cached
    "preadv2": (5, "in", (0,)),
    "pwritev2": (5, "in", (0,)),
    # the advice a program gives its own memory; no KSM merging, no paging out or
    # cooling of (host) file pages
    "madvise": (2, "in", (0, 1, 2, 3, 4, 8, 10, 11, 14, 15, 16, 17, 18, 19, 22, 23)),
    "chmod": (1, "without", (_SET_ID_BITS,)),
    "fchmod": (1, "without", (_SET_ID_BITS,)),
    "fchmodat": (2, "without", (_SET_ID_BITS,)),
    "open": (2, "without", (_SET_ID_BITS,)),
    "openat": (3, "without", (_SET_ID_BITS,)),
    "creat": (1, "without", (_SET_ID_BITS,)),
}

# -- classic BPF ----------------------------------------------------------------------
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06

_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_KILL_PROCESS = 0x80000000
_PERMISSION = _ERRNO | errno.EPERM
_NO_SUCH_CALL = _ERRNO | errno.ENOSYS

_X32_BIT = 0x40000000
_ARCHES = {"x86_64": (0xC000003E, syscalls.X86_64), "aarch64": (0xC00000B7, syscalls.AARCH64)}

Op = tuple[int, int, int, int]  # code, jump if true, jump if false, k


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> Op:
    return code, jt, jf, k


def _low_word(argument: int) -> Op:
    return _op(_LD_W_ABS, 16 + 8 * argument)


def _high_word(argument: int) -> Op:
    return _op(_LD_W_ABS, 16 + 8 * argument + 4)


def _rule(name: str) -> list[Op]:
    """What follows a match of ``name``'s number: every path ends in a return."""
    if name == "clone":  # threads only
        return [
            _low_word(0),
            _op(_JSET_K, _CLONE_NAMESPACES, jt=2),
            _op(_JSET_K, _CLONE_THREAD, jf=1),
            _op(_RET_K, _ALLOW),
            _op(_RET_K, _PERMISSION),
        ]
    if name == "prlimit64":  # prlimit64(0, resource, NULL, old): a read of its own
        return [
            _low_word(0),
            _op(_JEQ_K, 0, jf=7),
            _high_word(0),
            _op(_JEQ_K, 0, jf=5),
            _low_word(2),
            _op(_JEQ_K, 0, jf=3),
            _high_word(2),
            _op(_JEQ_K, 0, jf=1),
            _op(_RET_K, _ALLOW),
            _op(_RET_K, _PERMISSION),
        ]
    return _all_of([_ARGUMENT_RULES[name]])


def _all_of(conditions: list[Condition]) -> list[Op]:
    """Allow when every condition holds (the argument's low word: the kernel reads these
    as 32-bit values), else EPERM; every path ends in a return."""
    ops: list[Op] = [_op(_RET_K, _ALLOW), _op(_RET_K, _PERMISSION)]
    for argument, test, values in reversed(conditions):
        if test == "in":  # a match goes on past the block; none, to the deny
            block = [_op(_JEQ_K, value) for value in values]
        elif test == "below":
            block = [_op(_JGE_K, values[0])]  # (true: to the deny)
        else:  # without
            block = [_op(_JSET_K, values[0])]
        block = [_low_word(argument), *block]
        deny = len(block) + len(ops) - 1  # the deny's index, from the block's start
        linked = []
        for index, (code, _, _, k) in enumerate(block):
            if index == 0:
                linked.append(block[0])
                continue
            to_deny, past = deny - index - 1, len(block) - index - 1
            if test == "in":
                last = index == len(block) - 1
                linked.append(_op(code, k, jt=past, jf=to_deny if last else 0))
            else:
                linked.append(_op(code, k, jt=to_deny, jf=0))
        ops = linked + ops
    return ops


def program(
    machine: str | None = None, *, refuse_times: bool = False, own_pid: int | None = None
) -> bytes:
    """The filter for ``machine`` (default: this one) as packed ``sock_filter`` records;
    ``refuse_times``: setting file times is refused (the device nodes are the host's);
    ``own_pid``: signals only to this process (default: the caller's), so that the code
    cannot signal its init (gVisor delivers what a kernel would drop for a PID 1)."""
    own_pid = os.getpid() if own_pid is None else own_pid
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        raise OSError(f"no seccomp filter for {machine}")
    arch, numbers = _ARCHES[machine]
    ops = [
        _op(_LD_W_ABS, 4),
        _op(_JEQ_K, arch, jt=1),
        _op(_RET_K, _KILL_PROCESS),  # a foreign system call ABI
        _op(_LD_W_ABS, 0),
    ]
    if machine == "x86_64":  # the x32 ABI's numbers carry bit 30
        ops += [_op(_JGE_K, _X32_BIT, jf=1), _op(_RET_K, _PERMISSION)]
    times = _PERMISSION if refuse_times else _ALLOW
    for name, answer in [(name, _ALLOW) for name in ALLOWED] + [(n, times) for n in TIMES]:
        if name in numbers:
            ops += [_op(_JEQ_K, numbers[name], jf=1), _op(_RET_K, answer)]
    to_itself = {"kill": (0, "in", (own_pid,)), "tgkill": (0, "in", (own_pid,))}
    for name in ("clone", "prlimit64", *_ARGUMENT_RULES):
        if name in numbers:
            rule = (
                _rule(name)
                if name not in to_itself
                else _all_of([to_itself[name], _ARGUMENT_RULES[name]])
            )
            ops += [_op(_JEQ_K, numbers[name], jf=len(rule)), *rule]
    for name in REFUSED:
        if name in numbers:
            ops += [_op(_JEQ_K, numbers[name], jf=1), _op(_RET_K, _PERMISSION)]
    for name in PRETENDED:
        if name in numbers:
            ops += [_op(_JEQ_K, numbers[name], jf=1), _op(_RET_K, _ERRNO | 0)]
    ops.append(_op(_RET_K, _NO_SUCH_CALL))  # clone3 among them
    return b"".join(struct.pack("HBBI", code, jt, jf, k) for code, jt, jf, k in ops)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1
_SECCOMP_SYSCALL = {"x86_64": 317, "aarch64": 277}


def install(*, refuse_times: bool = False) -> None:
    """Load the filter into every thread of this process (and all it starts later)."""
    code = program(refuse_times=refuse_times, own_pid=os.getpid())
    buffer = ctypes.create_string_buffer(code, len(code))
    fprog = _SockFprog(len(code) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    number = _SECCOMP_SYSCALL[platform.machine()]
    flags = _SECCOMP_FILTER_FLAG_TSYNC
    if libc.syscall(number, _SECCOMP_SET_MODE_FILTER, flags, ctypes.byref(fprog)) != 0:
        raise OSError(ctypes.get_errno(), "seccomp(SECCOMP_SET_MODE_FILTER) failed")
