"""The system calls a sandboxed process may not make, as a seccomp program bubblewrap loads (`bwrap --seccomp FD`):
`socket(AF_UNIX, ...)` (socketpair is another call), ptrace and process_vm_*, key rings, io_uring, perf events,
chmod/chown (root's sandbox still owns the host's device nodes in /dev). Each refusal is EPERM.
"""

from __future__ import annotations

import contextlib
import errno
import os
import platform
import socket
import struct
from collections.abc import Iterator

_ALLOW, _DENY = 0x7FFF0000, 0x00050000 | errno.EPERM  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
_LOAD, _EQUAL, _AT_LEAST, _RETURN = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
_X32 = 0x40000000  # x86-64's x32 system calls are numbered from here
# per architecture: (AUDIT_ARCH_*, socket, {denied call: number})
_CALLS = {
    "x86_64": (0xC000003E, 41, {
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "keyctl": 250, "add_key": 248,
        "request_key": 249, "io_uring_setup": 425, "perf_event_open": 298, "chmod": 90, "fchmod": 91,
        "fchmodat": 268, "fchmodat2": 452, "chown": 92, "fchown": 93, "lchown": 94, "fchownat": 260,
    }),
    "aarch64": (0xC00000B7, 198, {
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "keyctl": 219, "add_key": 217,
        "request_key": 218, "io_uring_setup": 425, "perf_event_open": 241, "fchmod": 52, "fchmodat": 53,
        "fchmodat2": 452, "fchown": 55, "fchownat": 54,
    }),
}


def supported() -> bool:
    """Whether this machine's architecture has a program here (x86-64, arm64)."""
    return platform.machine() in _CALLS


def rules() -> bytes:
    """The program, as `struct sock_filter` entries: a foreign architecture's calls (i386's socketcall) are all
    refused, and so are the calls above; everything else is allowed."""
    arch, socket_call, denied = _CALLS[platform.machine()]
    numbers = sorted(set(denied.values()))
    # offsets in struct seccomp_data: nr at 0, arch at 4, the first argument's low half at 16
    program = [(_LOAD, 0, 0, 4), (_EQUAL, 1, 0, arch), (_RETURN, 0, 0, _DENY), (_LOAD, 0, 0, 0)]
    if arch == 0xC000003E:
        program.append((_AT_LEAST, len(numbers) + 4, 0, _X32))  # to the last entry: deny
    program += [(_EQUAL, 0, 2, socket_call), (_LOAD, 0, 0, 16),
                (_EQUAL, len(numbers) + 1, len(numbers), socket.AF_UNIX)]  # deny, else allow
    program += [(_EQUAL, left, 0, number) for left, number in zip(range(len(numbers), 0, -1), numbers, strict=True)]
    program += [(_RETURN, 0, 0, _ALLOW), (_RETURN, 0, 0, _DENY)]  # the calls above jump to the last: deny
    return b"".join(struct.pack("=HBBI", *entry) for entry in program)


@contextlib.contextmanager
def program() -> Iterator[int]:
    """A descriptor bwrap reads the program from (`--seccomp FD`), open while the block runs."""
    read, write = os.pipe()
    with os.fdopen(write, "wb") as file:  # a few hundred bytes: the pipe holds them
        file.write(rules())
    try:
        yield read
    finally:
        os.close(read)
