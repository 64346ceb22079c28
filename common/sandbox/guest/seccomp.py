"""A seccomp filter the guest installs on itself before it runs model-written code.

After it, the process can still compute, read and write files in what it can see, and
start threads, but the kernel refuses with EPERM: new processes (fork, vfork, clone
without CLONE_THREAD; clone3 answers ENOSYS so that threads fall back to clone), exec,
ptrace and reading or writing other processes' memory, sockets, changing resource
limits, mounts and namespaces, keyrings, BPF, perf events, userfaultfd, personality.

The filter is classic BPF over ``struct seccomp_data`` (nr at 0, arch at 4, args from
16), built for x86_64 and aarch64; on any other machine ``install`` refuses.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

# BPF opcodes
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06

_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_KILL_PROCESS = 0x80000000

_CLONE_THREAD = 0x00010000
_X32_BIT = 0x40000000

# arch: (AUDIT_ARCH value, {name: syscall number})
_ARCHES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (
        0xC000003E,
        {
            "clone": 56,
            "fork": 57,
            "vfork": 58,
            "execve": 59,
            "execveat": 322,
            "clone3": 435,
            "ptrace": 101,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "socket": 41,
            "socketpair": 53,
            "setrlimit": 160,
            "prlimit64": 302,
            "mount": 165,
            "umount2": 166,
            "unshare": 272,
            "setns": 308,
            "chroot": 161,
            "pivot_root": 155,
            "bpf": 321,
            "keyctl": 250,
            "add_key": 248,
            "request_key": 249,
            "perf_event_open": 298,
            "userfaultfd": 323,
            "personality": 135,
            "kexec_load": 246,
            "init_module": 175,
            "finit_module": 313,
            "reboot": 169,
            "syslog": 103,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "clone": 220,
            "execve": 221,
            "execveat": 281,
            "clone3": 435,
            "ptrace": 117,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "socket": 198,
            "socketpair": 199,
            "setrlimit": 164,
            "prlimit64": 261,
            "mount": 40,
            "umount2": 39,
            "unshare": 97,
            "setns": 268,
            "chroot": 51,
            "pivot_root": 41,
            "bpf": 280,
            "keyctl": 219,
            "add_key": 217,
            "request_key": 218,
            "perf_event_open": 241,
            "userfaultfd": 282,
            "personality": 92,
            "kexec_load": 104,
            "init_module": 105,
            "finit_module": 273,
            "reboot": 142,
            "syslog": 116,
        },
    ),
}


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes:
    """The filter for ``machine`` (default: this one) as packed ``sock_filter`` records."""
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        raise OSError(f"no seccomp filter for {machine}")
    arch, numbers = _ARCHES[machine]
    deny = _ERRNO | errno.EPERM
    ops = [
        _op(_LD_W_ABS, 4),
        _op(_JEQ_K, arch, jt=1),
        _op(_RET_K, _KILL_PROCESS),  # a foreign syscall ABI
        _op(_LD_W_ABS, 0),
    ]
    if machine == "x86_64":  # the x32 ABI's numbers carry bit 30
        ops += [_op(_JGE_K, _X32_BIT, jf=1), _op(_RET_K, deny)]
    # clone: threads only
    ops += [
        _op(_JEQ_K, numbers["clone"], jf=4),
        _op(_LD_W_ABS, 16),  # the low word of the flags argument
        _op(_JSET_K, _CLONE_THREAD, jf=1),
        _op(_RET_K, _ALLOW),
        _op(_RET_K, deny),
    ]
    ops += [_op(_JEQ_K, numbers["clone3"], jf=1), _op(_RET_K, _ERRNO | errno.ENOSYS)]
    for name, number in numbers.items():
        if name not in ("clone", "clone3"):
            ops += [_op(_JEQ_K, number, jf=1), _op(_RET_K, deny)]
    ops.append(_op(_RET_K, _ALLOW))
    return b"".join(ops)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2


def install() -> None:
    """Load the filter into this process (and every thread it starts later)."""
    code = program()
    buffer = ctypes.create_string_buffer(code, len(code))
    fprog = _SockFprog(len(code) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")
