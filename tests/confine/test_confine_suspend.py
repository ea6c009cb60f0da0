"""Suspended and moved kernels under device confinement, for real: device cgroups of this
machine (``confine_boxes``), a root broker on simulated GPUs with the simulated checkpoint
driver, and a kernel of user nobody with two workers it forked once it had its GPU, as a
data loader forks them, each holding GPU memory there. A restore runs in each process it
restores, and a suspension takes their GPU away from them: every process of the kernel
must open the new GPU before it is restored there, and the old one no more after."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from confine_boxes import Box, Probe, allowed, always, root_broker

from jupyter_gpubroker.api.rules import BrokerAPI
from jupyter_gpubroker.broker.reclaim import Decision
from jupyter_gpubroker.confine.nodes import nvml_address
from jupyter_gpubroker.suspend.host import KernelKey
from jupyter_gpubroker.suspend.move import HEALTH
from jupyter_gpubroker.wire.sizes import Size

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
KERNEL = KernelKey("nobody", "kernel-1")


class Confined:
    """A root broker on two simulated H100s and a kernel of nobody in a CPU-only server."""

    def __init__(self, box: Box, probes: Callable[[Callable[[], None]], Probe], tmp: Path):
        self.box = box
        self.rt = root_broker(box, "dgx-h100:2", tmp, reclaim_action="suspend")
        server = box.confinement.server("nobody", "", [])
        assert server is not None
        self.server = server
        self.kernel = probes(box.confinement.joiner(server))
        self.restoring: list[dict[int, set[str]]] = []
        """What each process could open as each restore started."""
        restore = self.rt.suspender.suspender.resume

        def resume(*args: Any) -> Any:
            self.restoring.append(self.opened())
            return restore(*args)

        self.rt.suspender.suspender.resume = resume

    def node(self, uuid: str) -> str:
        return str(self.box.dev / f"nvidia{nvml_address(self.rt.backend.handle(uuid)).gpu_minor}")

    def opened(self) -> dict[int, set[str]]:
        """pid -> the NVIDIA nodes the kernel's process and each worker may open now."""
        answers = self.kernel.open_all(self.box.all_nodes)
        return {pid: allowed(self.box, said) for pid, said in answers.items()}

    def on(self, uuid: str) -> dict[int, set[str]]:
        """Every process of the kernel may open ``uuid``'s node and no other GPU's."""
        return {pid: always(self.box) | {self.node(uuid)} for pid in self.processes}

    @property
    def processes(self) -> list[int]:
        return [self.kernel.pid, *self.kernel.workers]

    async def start(self) -> tuple[str, str]:
        """The kernel granted a GPU, then two workers forked, all three using that GPU:
        (its lease id, the GPU)."""
        rt = self.rt
        api = BrokerAPI(rt)
        held = rt.core.submit("nobody", Size(gpus=1), holder=KERNEL.kernel_id).lease_id
        assert held is not None
        api.renew(api.identify("nobody"), held, {"holder_pid": self.kernel.pid})
        self.kernel.fork(), self.kernel.fork()
        (gpu,) = rt.core.lease(held).devices
        for pid in self.processes:
            rt.backend.simulator.add_process(gpu, pid, 1024, follow=True)
        await rt.sample()
        assert self.opened() == self.on(gpu)
        return held, gpu

    def listed(self) -> dict[int, list[str]]:
        """pid -> the GPUs NVML lists each process of the kernel on."""
        sim = self.rt.backend.simulator
        return {pid: sorted(sim.process_memory(pid)) for pid in self.processes}


@contextmanager
def confined(
    make_box: Callable[[str], Box], probes: Callable[[Callable[[], None]], Probe], tmp: Path
) -> Iterator[Confined]:
    box = make_box("dgx-h100:2")
    setup = Confined(box, probes, tmp)
    try:
        yield setup
    finally:
        setup.rt.stop()
        box.confinement.release(setup.server)


def test_a_suspended_kernels_workers_open_its_new_gpu_before_it_is_restored_there(
    make_box: Callable[[str], Box],
    probes: Callable[[Callable[[], None]], Probe],
    tmp_path: Path,
) -> None:
    """Its GPU drained while it was suspended, the kernel's next grant is the other GPU:
    the kernel and both workers may open it as the restore starts, the old one no more,
    and the restore puts all three there."""

    async def suspend_and_resume(setup: Confined) -> tuple[str, str]:
        rt = setup.rt
        held, old = await setup.start()
        idle = Decision("suspend", held, KERNEL.kernel_id, "idle", "idle for 25 min", {})
        assert await rt.suspender.suspend(idle) is None
        assert setup.opened() == {pid: always(setup.box) for pid in setup.processes}
        rt.core.drain(old, "fan replacement")
        granted = rt.core.submit("nobody", Size(gpus=1), holder=KERNEL.kernel_id).lease_id
        assert granted is not None
        for _ in range(200):
            if KERNEL not in rt.suspender.suspended:
                break
            await asyncio.sleep(0.05)
        assert rt.core.lease(granted).state.value == "active", "the restore failed"
        assert rt.core.store.suspension_end(held).startswith("resumed")
        (new,) = rt.core.lease(granted).devices
        return old, new

    with confined(make_box, probes, tmp_path) as setup:
        old, new = asyncio.run(suspend_and_resume(setup))
        assert new != old
        assert setup.restoring == [setup.on(new)]
        assert setup.opened() == setup.on(new)
        assert setup.listed() == {pid: [new] for pid in setup.processes}


def test_a_moved_kernels_workers_open_its_new_gpu_and_not_its_old_one(
    make_box: Callable[[str], Box],
    probes: Callable[[Callable[[], None]], Probe],
    tmp_path: Path,
) -> None:
    """A drain moves the kernel: while it is restored, its processes may open both GPUs
    (a failed restore goes back to the old one); once it moved, the new one alone."""

    async def move(setup: Confined) -> tuple[str, str, str]:
        rt = setup.rt
        held, old = await setup.start()
        rt.core.drain(old, "too hot")
        text = await rt.mover.move(held, "GPU 0 is too hot", HEALTH)
        (new,) = rt.core.lease(held).devices
        return text, old, new

    with confined(make_box, probes, tmp_path) as setup:
        text, old, new = asyncio.run(move(setup))
        assert text.startswith("moved from") and new != old, text
        both = {pid: nodes | {setup.node(old)} for pid, nodes in setup.on(new).items()}
        assert setup.restoring == [both]
        assert setup.opened() == setup.on(new)
        assert setup.listed() == {pid: [new] for pid in setup.processes}
