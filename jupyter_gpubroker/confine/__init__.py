"""Confine processes to the GPU device nodes of their grant.

``CUDA_VISIBLE_DEVICES`` is advice: a user can unset it and open every GPU on the box.
Where the broker's side runs as root on the GPU machine (a hub with the local spawner),
:class:`DeviceConfinement` puts each single-user server in a device cgroup that lets it
open the NVIDIA nodes of its grant (``nodes``) and no other, as Slurm's
``ConstrainDevices`` does for jobs. A server joins its cgroup between fork and exec, so it
never runs unconfined; a kernel granted a GPU later inside a CPU-only server gets its own
cgroup with the kernel's devices added (:meth:`DeviceConfinement.allow`, given the
kernel's pid: the processes it started, a data loader's workers, go with it), and loses
them again with its lease (:meth:`DeviceConfinement.withdraw`).

Backends: the cgroup v1 ``devices`` controller where it is mounted (``cgroup``), else
cgroup v2 with a BPF device program (``bpf``). Not done: systemd's ``DeviceAllow=`` for
SystemdSpawner (its ``unit_extra_properties`` cannot repeat a property).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from traitlets import CaselessStrEnum, TraitError, Unicode, default, validate
from traitlets.config import LoggingConfigurable

from ..procstat import proc_stat
from .bpf import DevicesV2
from .cgroup import Cgroups, DevicesV1
from .nodes import (
    CTL_MINOR,
    NVIDIA_MAJOR,
    Address,
    ConfinementError,
    DriverNodes,
    Node,
    nvml_address,
)

__all__ = ["Address", "ConfinementError", "DeviceConfinement", "DriverNodes", "Node"]

_said: set[str] = set()
"""Why confinement is off, said once per process and reason."""
_nvml: list[Any] = []
"""The process's NVML backend, opened at the first device looked up (one per process:
NVML is a process-wide library)."""
KERNEL_SUFFIX = ".kernel-"


class DeviceConfinement(LoggingConfigurable):
    """Device cgroups for servers and kernels (see the module's docstring)."""

    mode = CaselessStrEnum(
        ["auto", "require", "off"],
        default_value="auto",
        help="auto: confine each server to its grant's GPU device nodes where this machine "
        "can (it runs as root, with device cgroups of v1 or v2 and an NVIDIA driver "
        "loaded), and say once in the log why not elsewhere. require: a server that "
        "cannot be confined does not start. off: never confine.",
    ).tag(config=True)
    cgroup = CaselessStrEnum(
        ["auto", "v1", "v2"],
        default_value="auto",
        help="Which cgroups confine: v1 (the devices controller at cgroup_devices), v2 (a "
        "BPF device program in the cgroup v2 hierarchy at cgroup2), or auto: v1 where its "
        "devices controller is mounted, else v2.",
    ).tag(config=True)
    cgroup_devices = Unicode(
        "/sys/fs/cgroup/devices", help="Where the cgroup v1 devices controller is mounted."
    ).tag(config=True)
    cgroup2 = Unicode(
        help="Where the cgroup v2 hierarchy is mounted (default: as /proc/self/mounts says)."
    ).tag(config=True)

    @default("cgroup2")
    def _cgroup2_mount(self) -> str:
        for line in Path("/proc/self/mounts").read_text().splitlines():
            _, where, kind, *_ = line.split()
            if kind == "cgroup2":
                return where
        return "/sys/fs/cgroup"

    proc_devices = Unicode(
        "/proc/devices", help="The kernel's list of device majors (the NVIDIA ones)."
    ).tag(config=True)
    mig_minors = Unicode(
        "/proc/driver/nvidia-caps/mig-minors",
        help="The NVIDIA driver's table of MIG capability minors (absent without MIG).",
    ).tag(config=True)

    @validate("cgroup_devices", "cgroup2", "proc_devices", "mig_minors")
    def _absolute(self, proposal: dict[str, Any]) -> str:
        value = str(proposal["value"])
        if not os.path.isabs(value):
            raise TraitError(f"{proposal['trait'].name} must be an absolute path, not {value!r}")
        return value

    def __init__(self, resolve: Callable[[str], Address] | None = None, **kwargs: Any) -> None:
        """``resolve`` finds a device by UUID (default: through NVML on this machine)."""
        super().__init__(**kwargs)
        self._resolve = resolve

    @property
    def cgroups(self) -> Cgroups:
        v1 = DevicesV1(self.cgroup_devices)
        if self.cgroup == "v1" or (self.cgroup == "auto" and not v1.why_not()):
            return v1
        return DevicesV2(self.cgroup2)

    def why_not(self) -> str:
        """Why this process cannot confine anything ("" when it can)."""
        if self.mode == "off":
            return "confinement is off (DeviceConfinement.mode)"
        if os.geteuid() != 0:
            return "this process does not run as root"
        why = self.cgroups.why_not()
        if why:
            return why
        if not self._driver().majors:
            return f"no NVIDIA driver is loaded ({self.proc_devices} lists no nvidia device)"
        return ""

    def active(self, what: str = "GPU servers") -> bool:
        """Whether it confines; says once why not, and refuses in ``require`` mode."""
        why = self.why_not()
        if not why:
            return True
        if self.mode == "require":
            raise ConfinementError(f"{what} must be confined to their devices, but {why}")
        if why not in _said and self.mode != "off":
            _said.add(why)
            self.log.warning("%s are not confined to their GPU devices: %s.", what, why)
        return False

    # -- servers

    def server(self, user: str, server: str, devices: Iterable[str]) -> Path | None:
        """A new cgroup for ``user``'s server holding ``devices`` (GPU or MIG UUIDs; none:
        a CPU-only server, which may open no GPU). None where it does not confine."""
        if not self.active():
            return None
        driver = self._driver()
        nodes = self._nodes(driver, devices)
        key = f"{user}/{server}"
        readable = re.sub(r"[^A-Za-z0-9_.-]", "_", key.replace("/", "-"))[:40].strip("-.")
        name = f"server-{readable}-{_tag(user)}.{secrets.token_hex(3)}"
        path = self.cgroups.create(name, nodes, driver.nvidia_majors)
        self.log.info(
            "%s's server%s may open %s and no other NVIDIA device (%s, %s)",
            user,
            f" {server}" if server else "",
            _names(driver, nodes),
            self.cgroups.version,
            path,
        )
        return path

    def joiner(self, path: Path) -> Callable[[], None]:
        """What the server's forked child runs first: join ``path``."""
        return self.cgroups.joiner(path)

    def release(self, path: Path) -> None:
        """A server stopped: its cgroup, and those of its kernels, keep no NVIDIA node and
        go once empty (a process left behind stays, confined to no GPU)."""
        majors = self._driver().nvidia_majors
        for cgroup in [*path.parent.glob(path.name + KERNEL_SUFFIX + "*"), path]:
            if not cgroup.is_dir():
                continue
            self.cgroups.close(cgroup, majors)
            if not self.cgroups.remove(cgroup):
                left = self.cgroups.processes(cgroup)
                self.log.warning(
                    "Processes %s outlived their server: they stay in %s, with no GPU",
                    ", ".join(map(str, left)),
                    cgroup,
                )

    # -- kernels granted later

    def allow(
        self, pid: int, devices: Iterable[str], user: str, *, only: bool = False
    ) -> Path | None:
        """Let the process ``pid`` (a kernel granted ``devices`` in a confined server of
        ``user``) open their nodes as well as what it may open now (``only``: as well as
        what its server may open, its other devices no more: a kernel moved): it moves,
        with every process it started that shares its cgroup (a data loader's workers), to
        a new cgroup of its own, beside its server's. None where ``pid`` is not confined
        (nothing to add); refused when ``pid`` is in a server of someone else (a pid
        reported wrong, or reused meanwhile)."""
        if not self.active("GPU kernels"):
            return None
        cgroups, driver = self.cgroups, self._driver()
        current = cgroups.of(pid)
        if current is None:
            return None
        if f"-{_tag(user)}." not in current.name:
            raise ConfinementError(f"process {pid} is not in a server of {user}")
        born = _started(pid)
        majors = driver.nvidia_majors
        server = current.name.split(KERNEL_SUFFIX)[0]
        base = cgroups.root / server if only and current.name != server else current
        nodes = cgroups.allowed(base, majors) | self._nodes(driver, devices)
        path = cgroups.create(f"{server}{KERNEL_SUFFIX}{pid}.{secrets.token_hex(3)}", nodes, majors)
        if current.name == server:  # a first grant, or a resume: its processes left behind
            self._move_kernel(pid, current, path)
        else:  # granted more: the kernel and what it started move on together
            self._move_all(current, path)
            self.release(current)
        if _started(pid) != born:  # it exited, and its pid went to another process
            self.release(path)
            raise ConfinementError(f"process {pid} exited before it got its devices")
        self.log.info("Kernel %d may open %s (%s)", pid, _names(driver, nodes), path)
        return path

    def withdraw(self, pid: int) -> None:
        """The kernel ``pid``'s grant ended: it and what it started go back to their
        server's cgroup (or, that gone, keep no NVIDIA node)."""
        if not self.active("GPU kernels"):
            return
        root = self.cgroups.root
        for path in [p for p in root.glob(f"*{KERNEL_SUFFIX}{pid}.*") if p.is_dir()]:
            server = root / path.name.split(KERNEL_SUFFIX)[0]
            if server.is_dir():
                self._move_all(path, server)
            self.release(path)

    def _move_kernel(self, pid: int, server: Path, target: Path) -> None:
        """Move the kernel ``pid`` out of its server's cgroup, and every process there that
        it started (its children and theirs): the workers it forked before its grant, or
        those that went back to the server's cgroup with it when it was suspended. The
        kernel moves first, so a child it forks meanwhile starts in ``target``; a pass
        that finds no more of them ends it (one that could not move is not tried twice)."""
        self.cgroups.move(pid, target)
        moved = {pid}
        while True:
            left = set(self.cgroups.processes(server))
            parents = {p: stat.ppid for p in left if (stat := proc_stat(p)) is not None}
            started = [p for p in left - moved if _descends(p, moved, parents)]
            if not started:
                return
            for process in started:
                with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                    self.cgroups.move(process, target)
            moved.update(started)

    def _move_all(self, source: Path, target: Path) -> None:
        for process in self.cgroups.processes(source):
            with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                self.cgroups.move(process, target)

    # -- the driver and the devices

    def _driver(self) -> DriverNodes:
        try:
            devices = Path(self.proc_devices).read_text()
        except OSError as e:
            raise ConfinementError(f"cannot read {self.proc_devices}: {e.strerror}") from e
        try:
            minors = Path(self.mig_minors).read_text()
        except FileNotFoundError:
            minors = ""  # no MIG on this driver
        return DriverNodes.parse(devices, minors)

    def _nodes(self, driver: DriverNodes, devices: Iterable[str]) -> set[Node]:
        nodes = driver.always()
        for uuid in devices:
            nodes |= driver.nodes(self._address(uuid))
        return nodes

    def _address(self, uuid: str) -> Address:
        if self._resolve is not None:
            return self._resolve(uuid)
        import pynvml

        from ..nvml import NvmlUnavailable, open_backend

        try:
            if not _nvml:
                _nvml.append(open_backend(log=self.log))
            return nvml_address(_nvml[0].handle(uuid))
        except (NvmlUnavailable, pynvml.NVMLError) as e:
            raise ConfinementError(f"NVML cannot find {uuid}: {e}") from e


def _started(pid: int) -> str:
    """When the process ``pid`` started (``/proc/<pid>/stat``'s field 22): a pid reused
    by a new process starts later."""
    stat = proc_stat(pid)
    return "" if stat is None else str(stat.start_ticks)


def _descends(pid: int, ancestors: set[int], parents: dict[int, int]) -> bool:
    """Whether ``pid`` descends from one of ``ancestors`` through ``parents`` (pid -> its
    parent's, for the processes looked at)."""
    seen = set()
    while pid in parents and pid not in seen:
        seen.add(pid)
        pid = parents[pid]
        if pid in ancestors:
            return True
    return False


def _tag(user: str) -> str:
    """The user's mark in the names of their cgroups (user names may hold any character)."""
    return hashlib.sha256(user.encode()).hexdigest()[:10]


def _names(driver: DriverNodes, nodes: Iterable[Node]) -> str:
    """The nodes as /dev paths, for the log."""
    by_major = {major: name for name, major in driver.majors.items()}
    names = []
    for node in sorted(nodes):
        if node.major == NVIDIA_MAJOR:
            ctl = node.minor == CTL_MINOR
            names.append("/dev/nvidiactl" if ctl else f"/dev/nvidia{node.minor}")
        elif by_major.get(node.major) == "nvidia-caps":
            names.append(f"/dev/nvidia-caps/nvidia-cap{node.minor}")
        else:
            names.append(f"/dev/{by_major.get(node.major, node.major)}")
    return ", ".join(names)
