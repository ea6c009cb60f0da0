"""Servers and kernels confined to their grant's GPU device nodes, for real: device cgroups
of this machine's cgroup v1 devices controller and of its cgroup v2 hierarchy (a BPF
device program), NVIDIA device nodes made with mknod in a scratch directory under the
driver's majors, and a process of another user that opens them. There is no NVIDIA
driver here, so a node the cgroup lets through answers ENXIO (no such device) and one it
blocks EPERM, before any driver is asked."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cgroup_versions import require
from traitlets import TraitError

from jupyter_gpubroker.confine import ConfinementError, DeviceConfinement
from jupyter_gpubroker.confine.nodes import DriverNodes, nvml_address
from jupyter_gpubroker.nvml import NvmlBackend, open_backend

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
NOBODY = 65534
UVM, CAPS = 510, 511
"""Dynamic majors as a driver may get them (free on this machine: no driver)."""
PROBE = """
import errno, json, os, sys
for line in sys.stdin:
    answers = {}
    for path in json.loads(line):
        try:
            os.close(os.open(path, os.O_RDWR))
            answers[path] = "opened"
        except OSError as e:
            answers[path] = errno.errorcode[e.errno]
    print(json.dumps(answers), flush=True)
"""
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


def _make_box(top: Path, simulate: str, cgroup: str) -> Box:
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


@pytest.fixture
def scratch() -> Iterator[Path]:
    top = Path(tempfile.mkdtemp(prefix="gpubroker-confine-"))
    top.chmod(0o755)  # nobody looks in
    try:
        yield top
    finally:
        shutil.rmtree(top)


@pytest.fixture(params=["v1", "v2"])
def make_box(request: pytest.FixtureRequest, scratch: Path) -> Iterator[Callable[[str], Box]]:
    """Boxes confining with cgroup v1 or v2, and at the end (their probes stopped first)
    no cgroup left of the test's."""
    made: list[Box] = []
    require(request.param)
    root = DeviceConfinement(cgroup=request.param).cgroups
    before = {p for p in root.root.glob("*") if p.is_dir()}

    def make(simulate: str) -> Box:
        made.append(_make_box(scratch, simulate, request.param))
        return made[-1]

    yield make
    for box in made:
        box.backend.close()
    for left in {p for p in root.root.glob("*") if p.is_dir()} - before:
        empty(left)


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
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
        time.sleep(0.1)


class Probe:
    """A process of user nobody started in a cgroup as the spawner starts a server: it
    joins between fork and exec, then drops to its user."""

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

    def open(self, paths: list[str]) -> dict[str, str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(paths) + "\n")
        self.proc.stdin.flush()
        return dict(json.loads(self.proc.stdout.readline()))

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def probes() -> Iterator[Callable[[Callable[[], None]], Probe]]:
    started: list[Probe] = []

    def start(join: Callable[[], None]) -> Probe:
        started.append(Probe(join))
        return started[-1]

    yield start
    for probe in started:
        probe.stop()


def allowed(box: Box, answers: dict[str, str]) -> set[str]:
    """The nodes the cgroup let through (the driver, absent, then said ENXIO); every
    other one must have been refused by the cgroup."""
    through = {p for p, a in answers.items() if a == "ENXIO"}
    refused = {p for p, a in answers.items() if a == "EPERM"}
    assert through | refused == set(answers), answers
    return through


def always(box: Box) -> set[str]:
    return {str(box.dev / "nvidiactl"), str(box.dev / "nvidia-uvm")}


def test_a_server_opens_its_whole_gpu_and_no_other_nvidia_node(
    make_box: Callable[[str], Box], probes: Callable[[Callable[[], None]], Probe]
) -> None:
    box = make_box("dgx-h100:4")
    path = box.confinement.server("alice", "", [box.gpu(2)])
    assert path is not None
    server = probes(box.confinement.joiner(path))
    answers = server.open(box.all_nodes)
    assert allowed(box, answers) == always(box) | {str(box.dev / "nvidia2")}
    for denied in ("nvidia0", "nvidia1", "nvidia3", "nvidia-uvm-tools", "nvidia-modeset"):
        assert answers[str(box.dev / denied)] == "EPERM"
    assert server.open(["/dev/null"]) == {"/dev/null": "opened"}  # the rest of /dev as before


def test_a_server_on_a_mig_slice_opens_its_gpu_and_its_instances_caps_only(
    make_box: Callable[[str], Box], probes: Callable[[Callable[[], None]], Probe]
) -> None:
    box = make_box("dgx-h100-mig:2")
    mine, neighbour = box.slices(0)[:2]
    path = box.confinement.server("bob", "train", [mine])
    assert path is not None
    answers = probes(box.confinement.joiner(path)).open(box.all_nodes)
    own = box.node(mine)
    assert own[0].endswith("/nvidia0") and len(own) == 3  # the GPU, its GI's and CI's caps
    assert allowed(box, answers) == always(box) | set(own)
    for cap in box.node(neighbour)[1:]:  # the slice next to it on the same GPU
        assert answers[cap] == "EPERM"
    for cap in ("nvidia-cap1", "nvidia-cap2"):  # mig config and monitor
        assert answers[str(box.dev / "nvidia-caps" / cap)] == "EPERM"


def test_a_cpu_only_server_opens_no_gpu_until_its_kernel_is_granted_one(
    make_box: Callable[[str], Box], probes: Callable[[Callable[[], None]], Probe]
) -> None:
    box = make_box("dgx-h100-mig:2")
    c = box.confinement
    path = c.server("carol", "", [])
    assert path is not None
    kernel = probes(c.joiner(path))  # a process of the server: a kernel it started
    assert allowed(box, kernel.open(box.all_nodes)) == always(box)
    granted = box.slices(1)[3]
    with pytest.raises(ConfinementError, match="not in a server of mallory"):
        c.allow(kernel.pid, [granted], "mallory")  # a pid reported by, or for, someone else
    moved = c.allow(kernel.pid, [granted], "carol")
    assert moved is not None and moved != path
    assert allowed(box, kernel.open(box.all_nodes)) == always(box) | set(box.node(granted))
    more = box.slices(0)[0]  # a second grant to the same kernel
    again = c.allow(kernel.pid, [more], "carol")
    assert again is not None and not moved.exists()
    both = set(box.node(granted)) | set(box.node(more))
    assert allowed(box, kernel.open(box.all_nodes)) == always(box) | both
    c.withdraw(kernel.pid)  # its lease ended
    assert allowed(box, kernel.open(box.all_nodes)) == always(box)
    assert not again.exists()
    assert f"{kernel.pid}" in (path / "cgroup.procs").read_text().split()


def test_a_stopped_servers_cgroups_go_and_a_process_left_behind_keeps_no_gpu(
    make_box: Callable[[str], Box], probes: Callable[[Callable[[], None]], Probe]
) -> None:
    box = make_box("dgx-h100:2")
    c = box.confinement
    path = c.server("dave", "", [box.gpu(0)])
    assert path is not None
    stray = probes(c.joiner(path))
    c.allow(stray.pid, [box.gpu(1)], "dave")
    c.release(path)  # the server stopped; this process outlived it
    assert path.exists() is False
    kernel_cgroups = list(path.parent.glob(path.name + "*"))
    assert len(kernel_cgroups) == 1  # the stray's own, kept while it lives
    assert allowed(box, stray.open(box.all_nodes)) == set()
    stray.stop()
    c.release(path)
    assert not list(path.parent.glob(path.name + "*"))


def test_a_process_not_confined_gets_nothing_added(
    make_box: Callable[[str], Box], probes: Callable[[Callable[[], None]], Probe]
) -> None:
    box = make_box("dgx-h100:2")
    free = probes(lambda: None)
    assert box.confinement.allow(free.pid, [box.gpu(0)], "nobody") is None


def test_a_grant_the_driver_cannot_place_refuses_to_confine(
    make_box: Callable[[str], Box], scratch: Path
) -> None:
    box = make_box("dgx-h100-mig:1")
    (scratch / "proc" / "mig-minors").unlink()  # a driver without the MIG caps table
    with pytest.raises(ConfinementError, match="nvidia-caps"):
        box.confinement.server("erin", "", [box.slices(0)[0]])
    assert not list(box.confinement.cgroups.root.glob("server-erin*"))


def test_where_it_cannot_confine_it_says_why_and_require_refuses(
    make_box: Callable[[str], Box], scratch: Path, caplog: pytest.LogCaptureFixture
) -> None:
    box = make_box("dgx-h100:1")
    c = box.confinement
    c.cgroup_devices = c.cgroup2 = str(scratch)  # no cgroups there
    c.cgroup = "v1"
    assert "no cgroup v1 devices controller" in c.why_not()
    c.cgroup = "auto"  # no v1 controller: v2
    assert "no cgroup v2 hierarchy" in c.why_not()
    assert c.server("frank", "", [box.gpu(0)]) is None
    assert "GPU servers are not confined to their GPU devices" in caplog.text
    c.mode = "require"
    with pytest.raises(ConfinementError, match="must be confined"):
        c.server("frank", "", [box.gpu(0)])
    c.mode = "off"
    assert c.server("frank", "", [box.gpu(0)]) is None
    with pytest.raises(TraitError, match="absolute path"):
        c.proc_devices = "proc/devices"
    with pytest.raises(TraitError):
        c.mode = "sometimes"


def root_broker(box: Box, simulate: str, tmp_path: Path) -> Any:
    """A started broker on the box's simulated GPUs, confining kernels as a root one does."""
    from traitlets.config import Config

    from jupyter_gpubroker.runtime import GPUBroker

    c = Config()
    c.GPUBroker.simulate = simulate
    c.GPUBroker.state_file = str(tmp_path / "state.sqlite")
    c.GPUBroker.identity = "username"
    c.GPUBroker.holder_account = "user"  # as the hub service: each user's kernels their own
    c.DeviceConfinement.cgroup = box.confinement.cgroup
    c.DeviceConfinement.proc_devices = box.confinement.proc_devices
    c.DeviceConfinement.mig_minors = box.confinement.mig_minors
    rt = GPUBroker(config=c)
    rt.start()
    return rt


def test_the_root_broker_gives_a_reported_kernel_its_lease_and_takes_it_back_at_the_end(
    make_box: Callable[[str], Box],
    probes: Callable[[Callable[[], None]], Probe],
    tmp_path: Path,
) -> None:
    """The wiring a GPU kernel in a CPU-only server goes through: its renewal names its
    pid (``holder_pid``), the root broker moves it to its lease's devices; the lease's
    end takes them back; a server's own lease is left to the spawner."""
    from jupyter_gpubroker.api.rules import BrokerAPI
    from jupyter_gpubroker.wire.sizes import Size

    box = make_box("dgx-h100-mig:2")
    rt = root_broker(box, "dgx-h100-mig:2", tmp_path)
    try:
        api = BrokerAPI(rt)
        server = box.confinement.server("nobody", "", [])
        assert server is not None
        kernel = probes(box.confinement.joiner(server))
        lease = rt.core.lease(rt.core.submit("nobody", Size(profile="1g.10gb")).lease_id)
        a = nvml_address(rt.backend.handle(lease.devices[0]))
        mine = {str(box.dev / f"nvidia{a.gpu_minor}")}
        assert allowed(box, kernel.open(box.all_nodes)) == always(box)
        api.renew(api.identify("nobody"), lease.id, {"holder_pid": kernel.pid})
        assert mine < allowed(box, kernel.open(box.all_nodes))
        held = rt.core.submit("nobody", Size(profile="1g.10gb"), holder="server:nobody")
        api.renew(api.identify("nobody"), held.lease_id, {"holder_pid": kernel.pid})
        assert f"{kernel.pid}" not in (server / "cgroup.procs").read_text().split()
        rt.core.release(lease.id)
        assert allowed(box, kernel.open(box.all_nodes)) == always(box)
        assert f"{kernel.pid}" in (server / "cgroup.procs").read_text().split()
    finally:
        rt.stop()
        box.confinement.release(server)


def test_a_suspended_kernel_opens_its_new_gpu_before_it_is_restored_there(
    make_box: Callable[[str], Box],
    probes: Callable[[Callable[[], None]], Probe],
    tmp_path: Path,
) -> None:
    """A restore runs in the kernel's own process, and the suspension took its old GPU
    away from it: the root broker lets it open the new grant's GPU before restoring."""
    import asyncio

    from jupyter_gpubroker.api.rules import BrokerAPI
    from jupyter_gpubroker.broker.reclaim import Decision
    from jupyter_gpubroker.suspend.host import KernelKey, simulate_kernel_use
    from jupyter_gpubroker.wire.sizes import Size

    box = make_box("dgx-h100:2")
    rt = root_broker(box, "dgx-h100:2", tmp_path)
    server = box.confinement.server("nobody", "", [])
    assert server is not None and rt.suspender is not None
    kernel = probes(box.confinement.joiner(server))

    def node(lease_id: str) -> str:
        a = nvml_address(rt.backend.handle(rt.core.lease(lease_id).devices[0]))
        return str(box.dev / f"nvidia{a.gpu_minor}")

    async def suspend_and_resume() -> tuple[str, set[str]]:
        assert rt.suspender is not None
        api = BrokerAPI(rt)
        held = rt.core.submit("nobody", Size(gpus=1), holder="kernel-1").lease_id
        assert held is not None
        api.renew(api.identify("nobody"), held, {"holder_pid": kernel.pid})
        simulate_kernel_use(rt.backend.simulator, rt.core.lease(held), kernel.pid, 1024)
        await rt.sample()
        assert node(held) in allowed(box, kernel.open(box.all_nodes))
        idle = Decision("suspend", held, "kernel-1", "idle", "idle for 25 min", {})
        assert await rt.suspender.suspend(idle) is None
        assert allowed(box, kernel.open(box.all_nodes)) == always(box)
        seen: set[str] = set()
        restore = rt.suspender.suspender.resume

        def resume(*args: object) -> object:
            seen.update(allowed(box, kernel.open(box.all_nodes)))
            return restore(*args)  # type: ignore[arg-type]

        rt.suspender.suspender.resume = resume  # type: ignore[method-assign]
        granted = rt.core.submit("nobody", Size(gpus=1), holder="kernel-1").lease_id
        assert granted is not None
        for _ in range(200):
            if KernelKey("nobody", "kernel-1") not in rt.suspender.suspended:
                break
            await asyncio.sleep(0.05)
        assert rt.core.lease(granted).state.value == "active", "the restore failed"
        return node(granted), seen

    try:
        new, opened = asyncio.run(suspend_and_resume())
        assert new in opened
        assert new in allowed(box, kernel.open(box.all_nodes))
    finally:
        rt.stop()
        box.confinement.release(server)
