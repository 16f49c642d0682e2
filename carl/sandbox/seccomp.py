"""A seccomp filter for sandboxed commands: the kernel interfaces no test suite needs are denied.

A classic-BPF program (the form bubblewrap's `--seccomp FD` loads) built here in pure Python,
so that no libseccomp binding is needed. It allows every system call except:

- new namespaces: unshare, setns, and clone with any CLONE_NEW* flag (no nested user namespace,
  the usual first step of a kernel exploit); clone3 answers ENOSYS, since its flags sit in
  memory a filter cannot read, and the C library then falls back to clone;
- the kernel keyring (keyctl, add_key, request_key), bpf, perf_event_open, userfaultfd,
  io_uring (ENOSYS), ptrace and process_vm_readv/writev, kcmp, pidfd_getfd;
- mounting and the new mount API, pivot_root, swap, reboot, kexec, kernel modules, acct,
  quotactl, syslog, open_by_handle_at / name_to_handle_at, iopl/ioperm, vhangup, lookup_dcookie;
- any other ABI than the host's own (32-bit x86 via int 0x80, x32), whose numbers differ.

Denied calls fail with EPERM (ENOSYS where a fallback exists); nothing is killed. Supported
architectures: x86_64 and aarch64 (elsewhere `filter_program` returns None and the sandbox runs
without a filter, which docs/sandbox.md says).
"""

from __future__ import annotations

import errno
import platform
import struct

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6];
_NR, _ARCH, _ARG0_LOW = 0, 4, 16
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_X32_BIT = 0x40000000
CLONE_NEW_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x00000080
"""CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME."""

DENIED = (
    "unshare", "setns", "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "mount", "umount2",
    "pivot_root", "fsopen", "fsmount", "fsconfig", "fspick", "move_mount", "open_tree", "mount_setattr",
    "swapon", "swapoff", "reboot", "kexec_load", "kexec_file_load", "init_module", "finit_module",
    "delete_module", "acct", "quotactl", "syslog", "open_by_handle_at", "name_to_handle_at", "iopl",
    "ioperm", "vhangup", "lookup_dcookie",
)  # fmt: skip
"""Calls that fail with EPERM."""
UNSUPPORTED = ("clone3", "io_uring_setup", "io_uring_enter", "io_uring_register")
"""Calls that fail with ENOSYS (callers fall back to clone, or to plain reads and writes)."""

# name -> number per architecture (x86_64: asm/unistd_64.h; aarch64: asm-generic/unistd.h).
SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": {
        "unshare": 272, "setns": 308, "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321,
        "perf_event_open": 298, "userfaultfd": 323, "ptrace": 101, "process_vm_readv": 310,
        "process_vm_writev": 311, "kcmp": 312, "pidfd_getfd": 438, "mount": 165, "umount2": 166,
        "pivot_root": 155, "fsopen": 430, "fsmount": 432, "fsconfig": 431, "fspick": 433, "move_mount": 429,
        "open_tree": 428, "mount_setattr": 442, "swapon": 167, "swapoff": 168, "reboot": 169,
        "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313,
        "delete_module": 176, "acct": 163, "quotactl": 179, "syslog": 103, "open_by_handle_at": 304,
        "name_to_handle_at": 303, "iopl": 172, "ioperm": 173, "vhangup": 153, "lookup_dcookie": 212,
        "clone3": 435, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "clone": 56,
    },
    "aarch64": {
        "unshare": 97, "setns": 268, "keyctl": 219, "add_key": 217, "request_key": 218, "bpf": 280,
        "perf_event_open": 241, "userfaultfd": 282, "ptrace": 117, "process_vm_readv": 270,
        "process_vm_writev": 271, "kcmp": 272, "pidfd_getfd": 438, "mount": 40, "umount2": 39,
        "pivot_root": 41, "fsopen": 430, "fsmount": 432, "fsconfig": 431, "fspick": 433, "move_mount": 429,
        "open_tree": 428, "mount_setattr": 442, "swapon": 224, "swapoff": 225, "reboot": 142,
        "kexec_load": 104, "kexec_file_load": 294, "init_module": 105, "finit_module": 273,
        "delete_module": 106, "acct": 89, "quotactl": 60, "syslog": 116, "open_by_handle_at": 265,
        "name_to_handle_at": 264, "vhangup": 58, "lookup_dcookie": 18,
        "clone3": 435, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "clone": 220,
    },
}  # fmt: skip
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}


def filter_program(machine: str | None = None) -> bytes | None:
    """The filter as bytes of `struct sock_filter` (what `bwrap --seccomp FD` reads), or None on an
    architecture this module has no system call table for."""
    machine = machine or platform.machine()
    if machine not in SYSCALLS:
        return None
    numbers = SYSCALLS[machine]
    deny_eperm = _ERRNO | errno.EPERM
    prog = [
        (_LD_W_ABS, 0, 0, _ARCH),
        (_JEQ_K, 1, 0, AUDIT_ARCH[machine]),
        (_RET_K, 0, 0, deny_eperm),  # another ABI (int 0x80): its numbers mean other calls
        (_LD_W_ABS, 0, 0, _NR),
    ]
    if machine == "x86_64":
        prog += [(_JGE_K, 0, 1, _X32_BIT), (_RET_K, 0, 0, deny_eperm)]
    for names, action in ((DENIED, deny_eperm), (UNSUPPORTED, _ERRNO | errno.ENOSYS)):
        for name in names:
            if name in numbers:  # iopl/ioperm exist on x86 only
                prog += [(_JEQ_K, 0, 1, numbers[name]), (_RET_K, 0, 0, action)]
    prog += [
        (_JEQ_K, 1, 0, numbers["clone"]),
        (_RET_K, 0, 0, _ALLOW),
        (_LD_W_ABS, 0, 0, _ARG0_LOW),  # clone's flags (the low word: every CLONE_NEW* flag is there)
        (_JSET_K, 0, 1, CLONE_NEW_FLAGS),
        (_RET_K, 0, 0, deny_eperm),
        (_RET_K, 0, 0, _ALLOW),
    ]
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)
