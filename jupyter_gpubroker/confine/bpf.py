"""cgroup v2 device cgroups: a BPF device program on each confined cgroup.

cgroup v2 has no ``devices.allow``: the kernel asks the ``BPF_CGROUP_DEVICE`` programs
attached to a process's cgroup and its ancestors at each device open, and every one must
allow it (the same programs systemd's ``DeviceAllow=`` and runc install). The program here
is a few instructions assembled in place, no compiler or library: allow a character
device unless its major is an NVIDIA one and it is not one of the grant's nodes.

A program cannot be read back, so the grant's nodes are also kept in the cgroup's
``trusted.gpubroker.nodes`` extended attribute, which only root may write. Closing a
cgroup attaches a second program that allows no NVIDIA node.
"""

from __future__ import annotations

import ctypes
import os
import struct
from pathlib import Path

from .cgroup import Cgroups
from .nodes import ConfinementError, Node

NODES_XATTR = "trusted.gpubroker.nodes"
_SYS_BPF = {"x86_64": 321, "aarch64": 280}.get(os.uname().machine)
_PROG_LOAD, _PROG_ATTACH = 5, 8
_PROG_TYPE_CGROUP_DEVICE, _CGROUP_DEVICE, _F_ALLOW_MULTI = 15, 6, 2
_DEVCG_DEV_CHAR = 2
_LDX_W, _AND_K, _JEQ_K, _JNE_K, _MOV_K, _EXIT = 0x61, 0x57, 0x15, 0x55, 0xB7, 0x95
"""eBPF opcodes: load a 32-bit word, 64-bit and/mov with a constant, jumps on a constant."""


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, src << 4 | dst, off, imm)


def program(nodes: set[Node], nvidia_majors: frozenset[int]) -> bytes:
    """The device program: ``ctx`` (r1) is ``struct bpf_cgroup_dev_ctx`` {access_type
    (access << 16 | type), major, minor}; it answers 1 (allow) or 0 (deny)."""
    checks: list[tuple[int, int, int, str]] = []  # (opcode, register, constant, target)
    for node in sorted(nodes):  # r3 == major and r4 == minor: allow
        checks += [(_JNE_K, 3, node.major, "next"), (_JEQ_K, 4, node.minor, "allow")]
    checks += [(_JEQ_K, 3, major, "deny") for major in sorted(nvidia_majors)]
    head = [
        _insn(_LDX_W, 2, 1, 0),  # r2 = access_type
        _insn(_AND_K, 2, 0, 0, 0xFFFF),  # r2 = device type
        _insn(_LDX_W, 3, 1, 4),  # r3 = major
        _insn(_LDX_W, 4, 1, 8),  # r4 = minor
    ]
    allow_at = len(head) + 1 + len(checks)
    targets = {"allow": allow_at, "deny": allow_at + 2}
    code = [*head, _insn(_JNE_K, 2, 0, allow_at - len(head) - 1, _DEVCG_DEV_CHAR)]
    for opcode, register, constant, target in checks:
        here = len(code)
        off = 1 if target == "next" else targets[target] - here - 1
        code.append(_insn(opcode, register, 0, off, constant))
    code += [_insn(_MOV_K, 0, 0, 0, 1), _insn(_EXIT), _insn(_MOV_K, 0, 0, 0, 0), _insn(_EXIT)]
    return b"".join(code)


def _bpf(command: int, attr: bytes) -> int:
    if _SYS_BPF is None:
        raise ConfinementError(f"no bpf system call known on {os.uname().machine}")
    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(attr, 128)  # the rest of union bpf_attr: zero
    result = int(libc.syscall(_SYS_BPF, command, buffer, len(buffer)))
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return result


def attach(path: Path, code: bytes) -> None:
    """Load ``code`` as a device program and attach it to the cgroup ``path`` (it stays
    attached, as long as the cgroup lives, once its file descriptor is closed)."""
    insns = ctypes.create_string_buffer(code, len(code))
    license = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(4096)
    load = struct.pack(
        "<IIQQIIQ",
        _PROG_TYPE_CGROUP_DEVICE,
        len(code) // 8,
        ctypes.addressof(insns),
        ctypes.addressof(license),
        1,  # the verifier says why it refuses a program
        len(log),
        ctypes.addressof(log),
    )
    try:
        prog = _bpf(_PROG_LOAD, load)
    except OSError as e:
        why = log.value.decode(errors="replace").strip().splitlines()[-1:] or [e.strerror or str(e)]
        raise ConfinementError(f"the kernel refused the device program: {why[0]}") from e
    try:
        cgroup = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            _bpf(_PROG_ATTACH, struct.pack("<IIII", cgroup, prog, _CGROUP_DEVICE, _F_ALLOW_MULTI))
        finally:
            os.close(cgroup)
    finally:
        os.close(prog)


class DevicesV2(Cgroups):
    """cgroup v2 with a device program per confined cgroup (see the module's docstring)."""

    version = "cgroup v2 device program"

    def why_not(self) -> str:
        if not (self.mount / "cgroup.procs").exists() or (self.mount / "tasks").exists():
            return f"no cgroup v2 hierarchy is mounted at {self.mount}"
        if _SYS_BPF is None:
            return f"device programs are not supported on {os.uname().machine}"
        return ""

    def _set(self, path: Path, nodes: set[Node], nvidia_majors: frozenset[int]) -> None:
        os.setxattr(
            path, NODES_XATTR, " ".join(f"{n.major}:{n.minor}" for n in sorted(nodes)).encode()
        )
        attach(path, program(nodes, nvidia_majors))

    def allowed(self, path: Path, nvidia_majors: frozenset[int]) -> set[Node]:
        try:
            text = os.getxattr(path, NODES_XATTR).decode()
        except OSError as e:
            raise ConfinementError(f"{path} is not a device cgroup of the broker") from e
        found = set()
        for pair in text.split():
            major, _, minor = pair.partition(":")
            found.add(Node(int(major), int(minor)))
        return found

    def close(self, path: Path, nvidia_majors: frozenset[int]) -> None:
        os.setxattr(path, NODES_XATTR, b"")
        attach(path, program(set(), nvidia_majors))

    def _mine(self, hierarchy: str, controllers: list[str]) -> bool:
        return hierarchy == "0"
