"""How the server reads its kernels' activity for idle reclaim (``ServerKernels``), on a
real kernel of a real jupyter-server."""

from __future__ import annotations

import asyncio
import logging

from kernel_cells import execute

from jupyter_gpubroker.broker.clock import SystemClock
from jupyter_gpubroker.server.reclaimer import ServerKernels


async def reaches(km, state: str) -> None:  # type: ignore[no-untyped-def]
    """Wait (up to 5 s) until jupyter-server's own watch has the kernel in ``state``."""
    for _ in range(100):
        if km.execution_state == state:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the kernel never became {state}")


async def test_a_kernel_watched_from_inside_a_cell_is_idle_once_the_cell_ends(jp_serverapp):
    # A GPU server whose kernel looked busy for good was never culled (seen in CI: its
    # activity watch began while a cell ran, and missed the cell's end).
    mkm = jp_serverapp.kernel_manager
    kid = await mkm.start_kernel(kernel_name="python3")
    km = mkm.get_kernel(kid)
    client = km.client()
    client.start_channels()
    kernels = ServerKernels(mkm, SystemClock(), logging.getLogger("test"))
    try:
        await client.wait_for_ready(timeout=60)
        running = asyncio.ensure_future(
            execute(client, "import time; time.sleep(1)", lambda msg: None)
        )
        await reaches(km, "busy")
        assert kernels.state(kid).execution_state == "busy"
        # the watch's subscription misses the end of the cell, as a slow joiner does
        kernels._watches[kid].stream.stop_on_recv()
        await running
        await reaches(km, "idle")
        ended = SystemClock().now()
        seen = kernels.state(kid)
        assert seen.execution_state == "idle"
        assert seen.last_activity >= ended - 1.0  # idle from about the cell's end
    finally:
        kernels.close()
        client.stop_channels()
        await mkm.shutdown_kernel(kid)
