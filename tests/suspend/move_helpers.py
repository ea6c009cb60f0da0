"""A started broker on a simulated machine of one's choosing, with kernels as real
processes listed on their GPUs: for the canary's and the moves' tests, without a server."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from traitlets.config import Config

from jupyter_gpubroker.api.rules import BrokerAPI
from jupyter_gpubroker.nvml import NvmlBackend, SimulatedNvml, Topology
from jupyter_gpubroker.nvml.presets import gpu_spec
from jupyter_gpubroker.runtime import GPUBroker, inventory
from jupyter_gpubroker.wire.sizes import Size

GIB = 1024


def machine(*models: str | tuple[str, dict[str, int]]) -> SimulatedNvml:
    """GPUs of these catalog models, in order; a (model, {profile: count}) is cut in MIG."""
    specs = [gpu_spec(m) if isinstance(m, str) else gpu_spec(*m) for m in models]
    return SimulatedNvml(Topology("move", tuple(specs)))


@contextmanager
def broker(
    tmp_path: Path, monkeypatch: Any, sim: SimulatedNvml, **traits: Any
) -> Iterator[GPUBroker]:
    """A started ``GPUBroker`` on ``sim``, configured with ``traits``; stopped after."""
    monkeypatch.setattr(
        inventory, "open_backend", lambda *a, log=None, **k: NvmlBackend(sim, log=log).open()
    )
    c = Config()
    c.GPUBroker.state_file = str(tmp_path / "state.sqlite")
    c.GPUBroker.identity = "username"
    c.GPUBroker.admin_users = {"root"}
    for k, v in traits.items():
        setattr(c.GPUBroker, k, v)
    rt = GPUBroker(config=c)
    rt.start()
    try:
        yield rt
    finally:
        rt.stop()


async def proven(rt: GPUBroker) -> None:
    """A sampling pass, and the canaries it starts run to their end."""
    await rt.sample()
    assert rt.canaries is not None
    if rt.canaries.running is not None:
        await rt.canaries.running


class Kernels:
    """Kernels as the broker sees them: a real process per lease that names it as its
    holder and is listed on its GPUs with ``mib`` each (as CUDA in it would be)."""

    def __init__(self, rt: GPUBroker) -> None:
        self.rt = rt
        assert rt.backend is not None and rt.backend.simulator is not None
        self.sim = rt.backend.simulator
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, user: str = "alice", mib: int = 4 * GIB, gpus: int = 1) -> tuple[str, int]:
        """A kernel holding a lease: (lease id, its pid)."""
        proc = subprocess.Popen(["sleep", "300"])
        self.procs.append(proc)
        request = self.rt.core.submit(user, Size(gpus=gpus), holder=f"kernel-{proc.pid}")
        assert request.lease_id is not None, "no GPU free for the kernel"
        self.rt.report_pid(request.lease_id, proc.pid)
        for uuid in self.rt.core.lease(request.lease_id).devices:
            self.sim.add_process(uuid, proc.pid, mib, follow=True)
        return request.lease_id, proc.pid

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


async def settled(rt: GPUBroker) -> None:
    """A sampling pass (readings the moves and the suspends read), then every move run."""
    await rt.sample()
    assert rt.mover is not None
    while running := [t for t in rt.mover._tasks if not t.done()]:  # a done one may linger
        await asyncio.gather(*running)  # in the set a moment, until its callback has run


def api(rt: GPUBroker) -> BrokerAPI:
    return BrokerAPI(rt)
