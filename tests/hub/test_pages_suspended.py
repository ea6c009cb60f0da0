"""The user's My GPUs page shows a kernel the hub service's broker suspended, in the
broker's words, from the service's overview. A real hub cannot reach into the service's
simulated NVML, so this renders the page's template from the view the page uses, on a
real broker (the simulated checkpoint driver) that suspends a kernel of this test's user:
this test's own process, listed on its GPU."""

from __future__ import annotations

import getpass
import os
from pathlib import Path
from types import SimpleNamespace

from bs4 import BeautifulSoup
from hub_pages import render
from traitlets.config import Config

from hub_spawner.pages import PageHandler
from jupyter_gpubroker.api.rules import BrokerAPI
from jupyter_gpubroker.broker.reclaim import Decision
from jupyter_gpubroker.runtime import GPUBroker
from jupyter_gpubroker.wire.sizes import Size


async def test_my_gpus_shows_a_suspended_kernel_and_its_memory_on_the_host(
    tmp_path: Path,
) -> None:
    c = Config()
    c.GPUBroker.simulate = "dgx-h100:1"
    c.GPUBroker.reclaim_action = "suspend"
    c.GPUBroker.state_file = str(tmp_path / "state.sqlite")
    rt = GPUBroker(config=c)
    rt.start()
    user = getpass.getuser()  # the kernel's process is this user's: the service suspends it
    try:
        lease_id = rt.core.submit(user, Size(gpus=1), holder="kernel-1").lease_id
        assert lease_id is not None and rt.suspender is not None
        (gpu,) = rt.core.lease(lease_id).devices
        rt.report_pid(lease_id, os.getpid())
        rt.backend.simulator.add_process(gpu, os.getpid(), 4096)  # type: ignore[union-attr]
        await rt.sample()
        idle = Decision("suspend", lease_id, "kernel-1", "idle", "idle for 25 min", {})
        assert await rt.suspender.suspend(idle) is None  # suspended
        api = BrokerAPI(rt)
        pages = {
            who: render(
                "my.html", PageHandler.my_context(SimpleNamespace(api=api, who=api.identify(who)))
            )
            for who in (user, "bob")
        }
    finally:
        rt.stop()
    (shown,) = BeautifulSoup(pages[user], "html.parser").select(".gpubroker-suspended")
    assert shown["data-lease"] == lease_id
    assert shown.get_text(" ", strip=True) == (
        f"A kernel that held {gpu}: suspended, its 4.2 GB of GPU memory on the host: "
        "its next cell resumes it."
    )
    assert BeautifulSoup(pages["bob"], "html.parser").select(".gpubroker-suspended") == []
