"""The guest's seccomp filter as data: its numbers are the kernel's, every call has one
answer, and the program is well formed for both machines it supports."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from common.sandbox.guest import seccomp, syscalls

X86_HEADER = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")
GENERIC_HEADER = Path("/usr/include/asm-generic/unistd.h")


def _x86_64_numbers() -> dict[str, int]:
    text = X86_HEADER.read_text()
    return {m[1]: int(m[2]) for m in re.finditer(r"#define __NR_(\w+)\s+(\d+)", text)}


def _aarch64_numbers() -> dict[str, int]:
    """asm-generic's table, with the 64-bit names of its ``__NR3264_`` calls."""
    text = GENERIC_HEADER.read_text()
    numbers = {m[1]: int(m[2]) for m in re.finditer(r"#define __NR_(\w+)\s+(\d+)", text)}
    both = {m[1]: int(m[2]) for m in re.finditer(r"#define __NR3264_(\w+)\s+(\d+)", text)}
    for alias, name in re.findall(r"#define __NR_(\w+)\s+__NR3264_(\w+)", text):
        if name in both and not (alias.endswith("64") and alias != "fadvise64"):
            numbers[alias] = both[name]
    return numbers


@pytest.mark.parametrize(
    ("table", "header", "read"),
    [
        (syscalls.X86_64, X86_HEADER, _x86_64_numbers),
        (syscalls.AARCH64, GENERIC_HEADER, _aarch64_numbers),
    ],
    ids=["x86_64", "aarch64"],
)
def test_the_numbers_are_the_kernels(table, header, read):
    if not header.is_file():
        pytest.skip(f"no {header} here (Debian's linux-libc-dev)")
    kernel = read()
    assert {name: kernel.get(name) for name in table} == table


def test_every_named_call_has_one_answer():
    allowed, refused = set(seccomp.ALLOWED), set(seccomp.REFUSED) | set(seccomp.PRETENDED)
    conditional = {"clone", "prlimit64", *seccomp._ARGUMENT_RULES, *seccomp.TIMES}
    assert not allowed & refused and not conditional & (allowed | refused)
    # what the issue names as the least to deny
    assert {
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "userfaultfd",
        "bpf",
        "perf_event_open",
        "keyctl",
        "mount",
        "unshare",
        "setns",
        "personality",
        "ptrace",
        "socket",
        "execve",
        "fork",
        "memfd_create",
    } <= refused
    assert "clone3" not in allowed  # answered ENOSYS: the C library falls back to clone
    assert all(name in syscalls.X86_64 for name in allowed | refused | conditional)


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_program_is_well_formed(machine):
    program = seccomp.program(machine)
    records = [struct.unpack("HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    assert 0 < len(records) <= 4096
    returns = {0x06}
    for index, (code, true, false, _) in enumerate(records):
        if code in returns:
            continue
        # every jump lands inside the program, and the last record returns
        assert index + 1 + max(true, false) < len(records)
    assert records[-1] == (0x06, 0, 0, 0x00050000 | 38)  # ENOSYS for anything unnamed
    assert records[0][3] == 4 and records[2] == (0x06, 0, 0, 0x80000000)  # foreign ABI: kill


def test_another_machine_is_refused():
    with pytest.raises(OSError, match="no seccomp filter for riscv64"):
        seccomp.program("riscv64")


def _answer(program: bytes, name: str, *args: int, machine: str = "x86_64") -> str:
    """What the filter answers a call (run as the kernel runs classic BPF): allow, EPERM,
    ENOSYS, a pretended success or kill."""
    arch = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}[machine]
    number = (syscalls.X86_64 if machine == "x86_64" else syscalls.AARCH64)[name]
    words = [number, arch, 0, 0]
    for value in [*args, *[0] * (6 - len(args))]:
        words += [value & 0xFFFFFFFF, (value >> 32) & 0xFFFFFFFF]
    data = struct.pack(f"<{len(words)}I", *words)
    records = [struct.unpack("HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    accumulator, at = 0, 0
    while True:
        code, true, false, k = records[at]
        if code == 0x20:  # load a word
            accumulator = struct.unpack_from("<I", data, k)[0]
        elif code == 0x06:  # return
            return {
                0x7FFF0000: "allow",
                0x00050000 | 1: "EPERM",
                0x00050000 | 38: "ENOSYS",
                0x00050000: "pretended",
                0x80000000: "kill",
            }[k]
        elif code in (0x15, 0x35, 0x45):
            holds = {
                0x15: accumulator == k,
                0x35: accumulator >= k,
                0x45: bool(accumulator & k),
            }[code]
            at += true if holds else false
        else:
            raise AssertionError(f"an instruction the filter does not use: {code:#x}")
        at += 1


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_filter_answers_each_call_as_its_rules_say(machine):
    program = seccomp.program(machine, own_pid=2)
    answer = lambda name, *args: _answer(program, name, *args, machine=machine)  # noqa: E731
    # signals: to itself only, standard ones only; tkill names no process
    assert answer("kill", 2, 9) == "allow" and answer("tgkill", 2, 2, 15) == "allow"
    assert answer("kill", 1, 9) == answer("kill", 0, 9) == "EPERM"  # its init; its group
    assert answer("kill", 2**32 - 1, 9) == "EPERM"  # -1: every process it may signal
    assert answer("tgkill", 1, 1, 19) == answer("kill", 2, 34) == "EPERM"
    assert answer("tkill", 2, 9) == "EPERM"
    # one condition, each kind: in, below, without
    assert answer("ioctl", 0, 0x5401) == "allow" and answer("ioctl", 0, 0x5412) == "EPERM"
    assert answer("openat", 0, 0, 0, 0o644) == "allow"
    assert answer("openat", 0, 0, 0, 0o4755) == "EPERM"
    assert answer("clone", 0x00010000) == "allow" and answer("clone", 0) == "EPERM"
    assert answer("utimensat") == "allow"
    times_refused = seccomp.program(machine, own_pid=2, refuse_times=True)
    assert _answer(times_refused, "utimensat", machine=machine) == "EPERM"
    assert (
        answer("fsync") == "pretended"
        and answer("fork" if machine == "x86_64" else "execve") == "EPERM"
    )
