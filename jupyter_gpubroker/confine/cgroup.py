"""Device cgroups, one per confined server or kernel, under ``<mount>/gpubroker``.

The kernel checks a cgroup's device rules when a device node is opened (a node already
open stays open). They are hierarchical, a child never getting more than its parent, so a
kernel given more than its server gets a cgroup beside the server's, not under it.

:class:`DevicesV1` is the cgroup v1 ``devices`` controller: a confined cgroup denies
everything (``a`` in ``devices.deny``), then allows every block device, every character
major but the NVIDIA ones, and the NVIDIA nodes of its grant one by one (the controller
cannot cut single minors out of an allowed major, so the holes are made the other way
round). cgroup v2 has no such files: ``bpf.DevicesV2`` attaches a device program instead.
"""

from __future__ import annotations

import errno
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from pathlib import Path

from .nodes import ConfinementError, Node

CHAR_MAJORS = range(512)
"""Every character major the kernel can register (``CHRDEV_MAJOR_MAX``)."""
BROKER_DIR = "gpubroker"


class Cgroups(ABC):
    """What both cgroup versions share: the broker's cgroups, joining, moving, removing."""

    version = ""

    def __init__(self, mount: str) -> None:
        self.mount = Path(mount)
        self.root = self.mount / BROKER_DIR

    @abstractmethod
    def why_not(self) -> str:
        """Why it cannot confine here ("" when it can)."""

    def create(self, name: str, nodes: Iterable[Node], nvidia_majors: frozenset[int]) -> Path:
        """A new cgroup ``name`` that allows ``nodes`` and no other NVIDIA node."""
        self.root.mkdir(mode=0o755, exist_ok=True)
        path = self.root / name
        try:
            path.mkdir(mode=0o755)
        except FileExistsError:
            raise ConfinementError(f"the device cgroup {path} exists already") from None
        try:
            self._set(path, set(nodes), nvidia_majors)
        except ConfinementError:
            self.remove(path)
            raise
        except OSError as e:
            self.remove(path)
            raise ConfinementError(f"cannot set the device cgroup {path}: {e.strerror}") from e
        return path

    @abstractmethod
    def _set(self, path: Path, nodes: set[Node], nvidia_majors: frozenset[int]) -> None:
        """Let the new cgroup ``path`` open ``nodes`` and no other NVIDIA node."""

    @abstractmethod
    def allowed(self, path: Path, nvidia_majors: frozenset[int]) -> set[Node]:
        """The NVIDIA nodes ``path`` allows."""

    @abstractmethod
    def close(self, path: Path, nvidia_majors: frozenset[int]) -> None:
        """From now on ``path`` allows no NVIDIA node."""

    def joiner(self, path: Path) -> Callable[[], None]:
        """A ``preexec_fn`` step: the forked child moves itself into ``path`` (as root,
        before it drops privileges and runs anything)."""
        procs = str(path / "cgroup.procs")

        def join() -> None:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)

        return join

    def move(self, pid: int, path: Path) -> None:
        """Move the process ``pid`` (all its threads) into ``path``."""
        _write(path / "cgroup.procs", [str(pid)])

    def processes(self, path: Path) -> list[int]:
        try:
            return [int(p) for p in (path / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return []

    def of(self, pid: int) -> Path | None:
        """The broker's cgroup the process ``pid`` is in, if any."""
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except FileNotFoundError:
            raise ConfinementError(f"no process {pid}") from None
        for line in lines:
            hierarchy, controllers, where = line.split(":", 2)
            if self._mine(hierarchy, controllers.split(",")):
                path = self.mount / where.lstrip("/")
                return path if path.parent == self.root else None
        return None

    @abstractmethod
    def _mine(self, hierarchy: str, controllers: list[str]) -> bool:
        """Is this /proc/<pid>/cgroup line of this version's hierarchy?"""

    def remove(self, path: Path) -> bool:
        """Remove ``path`` if no process is left in it (True: gone)."""
        try:
            path.rmdir()
        except FileNotFoundError:
            return True
        except OSError as e:
            if e.errno == errno.EBUSY:
                return False
            raise
        return True


class DevicesV1(Cgroups):
    """The cgroup v1 devices controller (see the module's docstring)."""

    version = "cgroup v1 devices controller"

    def why_not(self) -> str:
        if not (self.mount / "devices.allow").exists():
            return f"no cgroup v1 devices controller is mounted at {self.mount}"
        return ""

    def _set(self, path: Path, nodes: set[Node], nvidia_majors: frozenset[int]) -> None:
        _write(path / "devices.deny", ["a"])
        others = [f"c {m}:* rwm" for m in CHAR_MAJORS if m not in nvidia_majors]
        _write(path / "devices.allow", ["b *:* rwm", *others, *(n.rule for n in sorted(nodes))])

    def allowed(self, path: Path, nvidia_majors: frozenset[int]) -> set[Node]:
        found = set()
        for line in (path / "devices.list").read_text().splitlines():
            kind, number, _ = line.split(" ")
            major, _, minor = number.partition(":")
            if kind == "c" and minor != "*" and major.isdigit() and int(major) in nvidia_majors:
                found.add(Node(int(major), int(minor)))
        return found

    def close(self, path: Path, nvidia_majors: frozenset[int]) -> None:
        _write(path / "devices.deny", [n.rule for n in self.allowed(path, nvidia_majors)])

    def _mine(self, hierarchy: str, controllers: list[str]) -> bool:
        return "devices" in controllers


def _write(path: Path, rules: list[str]) -> None:
    """One rule per write: the controller parses one per call."""
    fd = os.open(path, os.O_WRONLY)
    try:
        for rule in rules:
            os.write(fd, rule.encode())
    finally:
        os.close(fd)
