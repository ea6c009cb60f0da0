"""The running broker reads time from the core's clock only (DESIGN rule 3): with a
virtual clock, what it records and says follows that clock, not the machine's.

The engine here is a plugin's, named by class (``c.GPUBroker.inventory_class``): it
reports a simulated machine's GPUs as one node's until it is told to stop answering."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import pytest
from runtime_helpers import make

from jupyter_gpubroker.broker.clock import VirtualClock
from jupyter_gpubroker.broker.core import Broker
from jupyter_gpubroker.broker.models import Inventory
from jupyter_gpubroker.broker.reclaim import KernelState
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.engines import ClusterView, EngineUnavailable, InventorySource
from jupyter_gpubroker.events import EventBus
from jupyter_gpubroker.nvml import open_backend
from jupyter_gpubroker.wire.sizes import Size

DAY_ONE = 86400.0
"""1970-01-02: no wall clock of today's machines reads it."""


def one_node(machine: str) -> Inventory:
    backend = open_backend(machine)
    try:
        inventory = backend.inventory()
    finally:
        backend.close()
    return Inventory(
        tuple(replace(g, node="n1") for g in inventory.gpus),
        tuple(replace(d, node="n1") for d in inventory.devices),
    )


class SiteEngine(InventorySource):
    """A plugin's engine: answers with one node of two GPUs until ``down`` is set."""

    name = "site"
    work = "job"
    down: ClassVar[str] = ""

    async def read(self) -> ClusterView:
        if SiteEngine.down:
            raise EngineUnavailable(SiteEngine.down)
        return ClusterView(one_node("dgx-h100:2"), holders={})


def test_an_engine_down_since_reads_the_brokers_clock(tmp_path: Path) -> None:
    rt = make(tmp_path, inventory_class=SiteEngine)
    rt.start()
    try:
        assert rt.engine is not None and rt.engine.name == "site"
        assert len(rt.core.inventory.gpus) == 2
        rt.core.clock = VirtualClock(DAY_ONE)
        SiteEngine.down = "the site's scheduler does not answer"
        asyncio.run(rt.poll_engine())
        assert rt.engine_state() == {
            "name": "site",
            "source": None,
            "reachable": False,
            "since": DAY_ONE,
            "error": "the site's scheduler does not answer",
        }
        SiteEngine.down = ""
        asyncio.run(rt.poll_engine())
        assert rt.engine_state()["reachable"] is True  # type: ignore[index]
    finally:
        SiteEngine.down = ""
        rt.stop()


def test_event_ids_count_from_the_brokers_clock() -> None:
    """Ids start at the start time in microseconds (an id from an earlier run is older)."""
    core = Broker(Store(), one_node("dgx-h100:1"), clock=VirtualClock(DAY_ONE))
    bus = EventBus(core, 10)
    assert bus.last_event_id == int(DAY_ONE * 1e6)


def test_a_warnings_log_line_says_when_by_the_brokers_clock(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rt = make(tmp_path, simulate="dgx-h100:1", identity="username", idle_timeout=600, grace=120)
    rt.start()
    rt.log.propagate = True
    try:
        rt.core.clock = clock = VirtualClock(time.time())
        lease = rt.core.submit("erin", Size(gpus=1), holder="k1").lease_id
        assert lease is not None
        rt.report_kernel(lease, KernelState("idle", clock.now()))
        clock.advance(605)
        rt.core.renew(lease)
        with caplog.at_level(logging.WARNING):
            (warned,) = asyncio.run(rt.sample())
        assert warned.action == "warn"
        (line,) = [r.getMessage() for r in caplog.records if f"lease {lease}" in r.getMessage()]
        assert ", in 2 min): idle for 10 min" in line
    finally:
        rt.stop()
