"""The scratch GPU machine of the confinement tests: NVIDIA device nodes made with mknod
in a scratch directory under the driver's majors, the driver's /proc files beside them,
and processes of user nobody (a server, a kernel and its workers) that open them. There is
no NVIDIA driver here, so a node the cgroup lets through answers ENXIO (no such device)
and one it blocks EPERM, before any driver is asked."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_gpubroker.confine import DeviceConfinement
from jupyter_gpubroker.confine.nodes import DriverNodes, nvml_address
from jupyter_gpubroker.nvml import NvmlBackend, open_backend

NOBODY = 65534
UVM, CAPS = 510, 511
"""Dynamic majors as a driver may get them (free on this machine: no driver)."""
PROBE = """
import errno, json, os, sys

def answer(paths):
    answers = {}
    for path in paths:
        try:
            os.close(os.open(path, os.O_RDWR))
            answers[path] = "opened"
        except OSError as e:
            answers[path] = errno.errorcode[e.errno]
    return answers

workers = []
def fork():
    down, to = os.pipe()
    back, up = os.pipe()
    pid = os.fork()
    if pid == 0:  # a worker, as a data loader starts them: it answers its own pipe
        for _, *ends in workers:
            for end in ends:
                end.close()
        os.close(to), os.close(back)
        asked, tell = os.fdopen(down), os.fdopen(up, "w")
        for line in asked:
            tell.write(json.dumps(answer(json.loads(line))) + "\\n")
            tell.flush()
        os._exit(0)
    os.close(down), os.close(up)
    workers.append((pid, os.fdopen(to, "w"), os.fdopen(back)))
    return pid

for line in sys.stdin:
    if line.strip() == '"fork"':
        print(json.dumps(fork()), flush=True)
        continue
    said = {os.getpid(): answer(json.loads(line))}
    for pid, to, back in workers:
        to.write(line)
        to.flush()
        said[pid] = json.loads(back.readline())
    print(json.dumps(said), flush=True)
"""
"""A process that opens the paths it is given, one JSON list a line, and answers for
itself and the workers it forked (``"fork"``) what each open did."""
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
"""The probe runs as nobody, who may not enter /root (where a pyenv Python lives)."""


@dataclass
class Box:
    """A GPU machine in a scratch directory: its /dev nodes and the driver's /proc files."""

    dev: Path
    backend: NvmlBackend
    confinement: DeviceConfinement

    def gpu(self, index: int) -> str:
        return self.backend.inventory().gpus[index].uuid

    def slices(self, index: int) -> list[str]:
        return [d.uuid for d in self.backend.inventory().devices if d.gpu_index == index]

    def node(self, uuid: str) -> list[str]:
        """The scratch paths of one device's own nodes."""
        a = nvml_address(self.backend.handle(uuid))
        paths = [f"nvidia{a.gpu_minor}"]
        if a.gpu_instance is not None:
            minors = DriverNodes.parse("", self.backend.simulator.mig_minors()).mig_minors
            gi = f"gpu{a.gpu_minor}/gi{a.gpu_instance}"
            for cap in (f"{gi}/access", f"{gi}/ci{a.compute_instance}/access"):
                paths.append(f"nvidia-caps/nvidia-cap{minors[cap]}")
        return [str(self.dev / p) for p in paths]

    @property
    def all_nodes(self) -> list[str]:
        return sorted(str(p) for p in self.dev.rglob("nvidia*") if p.is_char_device())


def new_box(top: Path, simulate: str, cgroup: str) -> Box:
    backend = open_backend(simulate)
    sim = backend.simulator
    dev = top / "dev"
    (dev / "nvidia-caps").mkdir(parents=True)
    nodes = {"nvidiactl": (195, 255), "nvidia-modeset": (195, 254)}
    nodes |= {"nvidia-uvm": (UVM, 0), "nvidia-uvm-tools": (UVM, 1)}
    nodes |= {f"nvidia{g.index}": (195, g.index) for g in backend.inventory().gpus}
    minors = DriverNodes.parse("", sim.mig_minors()).mig_minors
    for name, minor in minors.items():  # config, monitor and every instance's
        if name in ("config", "monitor") or name.startswith(("gpu0/gi7", "gpu0/gi8", "gpu1/")):
            nodes[f"nvidia-caps/nvidia-cap{minor}"] = (CAPS, minor)
    for name, (major, minor) in nodes.items():
        os.mknod(dev / name, 0o20666, os.makedev(major, minor))
        (dev / name).chmod(0o666)  # the cgroup, not the mode, stops the user
    proc = top / "proc"
    proc.mkdir()
    real = Path("/proc/devices").read_text()
    chars, block = real.split("\nBlock devices:")
    nvidia = f"195 nvidia-frontend\n{UVM} nvidia-uvm\n{CAPS} nvidia-caps\n"
    (proc / "devices").write_text(f"{chars}\n{nvidia}\nBlock devices:{block}")
    (proc / "mig-minors").write_text(sim.mig_minors())
    confinement = DeviceConfinement(
        resolve=lambda uuid: nvml_address(backend.handle(uuid)),
        cgroup=cgroup,
        proc_devices=str(proc / "devices"),
        mig_minors=str(proc / "mig-minors"),
    )
    return Box(dev, backend, confinement)


def empty(cgroup: Path, within_s: float = 10.0) -> None:
    """Kill what is left in ``cgroup`` and remove it: the kernel empties a cgroup a
    moment after its last process is reaped (EBUSY until then), later under load."""
    deadline = time.monotonic() + within_s
    while True:
        for name in ("cgroup.procs", "tasks"):
            with contextlib.suppress(FileNotFoundError):
                for pid in (cgroup / name).read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
        try:
            cgroup.rmdir()
            return
        except FileNotFoundError:
            return  # the broker removed it meanwhile
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
        time.sleep(0.1)


class Probe:
    """A process of user nobody started in a cgroup as the spawner starts a server: it
    joins between fork and exec, then drops to its user. It may fork workers, as a kernel's
    data loader does: they start in its cgroup, as its user."""

    def __init__(self, join: Callable[[], None]) -> None:
        def preexec() -> None:
            join()
            os.setgid(NOBODY)
            os.setuid(NOBODY)

        self.proc = subprocess.Popen(
            [PYTHON, "-c", PROBE],
            preexec_fn=preexec,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pid = self.proc.pid
        self.workers: list[int] = []

    def _ask(self, line: str) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def open(self, paths: list[str]) -> dict[str, str]:
        """What opening each of ``paths`` did in this process."""
        return self.open_all(paths)[self.pid]

    def open_all(self, paths: list[str]) -> dict[int, dict[str, str]]:
        """pid -> what opening each of ``paths`` did, in this process and each worker."""
        return {int(pid): answers for pid, answers in self._ask(json.dumps(paths)).items()}

    def fork(self) -> int:
        """A new worker's pid."""
        self.workers.append(int(self._ask(json.dumps("fork"))))
        return self.workers[-1]

    def stop(self) -> None:
        for worker in self.workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGKILL)
        self.proc.kill()
        self.proc.wait()


def allowed(box: Box, answers: dict[str, str]) -> set[str]:
    """The nodes the cgroup let through (the driver, absent, then said ENXIO); every
    other one must have been refused by the cgroup."""
    through = {p for p, a in answers.items() if a == "ENXIO"}
    refused = {p for p, a in answers.items() if a == "EPERM"}
    assert through | refused == set(answers), answers
    return through


def always(box: Box) -> set[str]:
    return {str(box.dev / "nvidiactl"), str(box.dev / "nvidia-uvm")}


def root_broker(box: Box, simulate: str, tmp_path: Path, **options: Any) -> Any:
    """A started broker on the box's simulated GPUs, confining kernels as a root one does
    (``options``: more of its ``c.GPUBroker`` settings)."""
    from traitlets.config import Config

    from jupyter_gpubroker.runtime import GPUBroker

    c = Config()
    c.GPUBroker.simulate = simulate
    c.GPUBroker.state_file = str(tmp_path / "state.sqlite")
    c.GPUBroker.identity = "username"
    c.GPUBroker.holder_account = "user"  # as the hub service: each user's kernels their own
    for name, value in options.items():
        setattr(c.GPUBroker, name, value)
    c.DeviceConfinement.cgroup = box.confinement.cgroup
    c.DeviceConfinement.proc_devices = box.confinement.proc_devices
    c.DeviceConfinement.mig_minors = box.confinement.mig_minors
    rt = GPUBroker(config=c)
    rt.start()
    return rt
