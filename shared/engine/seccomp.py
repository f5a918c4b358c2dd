"""A seccomp filter for the jail (bubblewrap's `--seccomp FD`): the system calls no build or test
needs that would let one jailed run leave state for another.

The kernel's keyrings (`add_key`, `request_key`, `keyctl`) are kept per uid, not per namespace we
create: every jailed run is the same sandbox uid, so a test could store its answer in the
user-session keyring during the correctness run and read it back in the timed runs (or leave it
for another agent's evaluation). They answer ENOSYS in the jail, as in docker's default profile.
On x86-64 the x32 system-call numbers are refused too, and the i386 ones (`int 0x80`) are
checked against their own table.

The program is classic BPF (`struct sock_filter`), assembled here: no libseccomp needed.
"""

from __future__ import annotations

import errno
import os
import platform
import struct

# (AUDIT_ARCH_*, system-call numbers to refuse, also refuse every number at or above this)
_TABLES: dict[str, list[tuple[int, tuple[int, ...], int | None]]] = {
    "x86_64": [(0xC000003E, (248, 249, 250), 0x40000000), (0x40000003, (286, 287, 288), None)],
    "aarch64": [(0xC00000B7, (217, 218, 219), None), (0x40000028, (309, 310, 311), None)],
}
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_ALLOW = 0x7FFF0000
_DENY = 0x00050000 | errno.ENOSYS  # SECCOMP_RET_ERRNO
_NR, _ARCH = 0, 4  # offsets in struct seccomp_data


def program(machine: str | None = None) -> bytes:
    """The filter for `machine` (this one by default); empty when we have no table for it."""
    tables = _TABLES.get(machine or platform.machine())
    if not tables:
        return b""
    # instructions as (code, jump-if-true label, jump-if-false label, k); labels resolved below
    ins: list[tuple[int, str, str, int]] = []
    for i, (arch, nrs, at_least) in enumerate(tables):
        ins.append((_LD_W_ABS, "", "", _ARCH))
        ins.append((_JEQ_K, "", f"next{i}", arch))
        ins.append((_LD_W_ABS, "", "", _NR))
        ins += [(_JEQ_K, "deny", "", nr) for nr in nrs]
        if at_least is not None:
            ins.append((_JGE_K, "deny", "", at_least))
        ins.append((_RET_K, "", "", _ALLOW))
        ins.append((-1, f"next{i}", "", 0))  # a label, not an instruction
    ins.append((_RET_K, "", "", _ALLOW))
    ins.append((-1, "deny", "", 0))
    ins.append((_RET_K, "", "", _DENY))
    labels: dict[str, int] = {}
    real: list[tuple[int, str, str, int]] = []
    for code, a, b, k in ins:
        if code == -1:
            labels[a] = len(real)
        else:
            real.append((code, a, b, k))
    out = bytearray()
    for pc, (code, jt, jf, k) in enumerate(real):
        t = labels[jt] - pc - 1 if jt else 0
        f = labels[jf] - pc - 1 if jf else 0
        out += struct.pack("=HBBI", code, t, f, k)
    return bytes(out)


def filter_fd() -> int | None:
    """A descriptor (not inheritable: the caller passes it on) holding the program, for bwrap's
    `--seccomp`; None where we have no table for this machine."""
    prog = program()
    if not prog:
        return None
    fd = os.memfd_create("cppperf-seccomp", os.MFD_CLOEXEC)
    os.write(fd, prog)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
