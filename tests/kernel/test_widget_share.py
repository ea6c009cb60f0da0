"""``%gpu``'s widget shows a share's own memory in use, the figure the Lab panel and the
admin page show (the share's processes' NVML memory, ``share.used_mib``): a real kernel
holding 8 GB of a simulated L40S whose process NVML lists with more and more memory. The
GPU's reading carries the GPU's use, all its shares' together, so the widget reads its
request again when that reading changes."""

from __future__ import annotations

from typing import Any

import pytest
from test_widget_calls import SHOWN


@pytest.fixture
def broker_config(broker_config: dict[str, Any]) -> dict[str, Any]:
    return {**broker_config, "simulate": "l40s-4:1", "sharing": "shared", "mps_control": ""}


async def test_the_widget_shows_what_its_share_uses_as_it_grows(
    kernel, notebook, api, jp_serverapp, wait_until
):
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    kid = await kernel()
    nb = await notebook(kid, "r = %gpu request --share 8GB", "import os; print(os.getpid())")
    pid = int(nb.stdout(1))
    (lease,) = (await api("GET", "leases"))[1]["leases"]
    (device,) = lease["devices"]
    for mib, shown in ((1024, "1.0"), (2048, "2.1"), (4096, "4.2")):  # of 8 GB
        runtime.backend.simulator.add_process(device, pid, mib)  # the kernel, as NVML lists it
        await runtime.sample()
        runtime.events.fanout.send_readings()  # what the stream's timer does every 5 s
        nb = await notebook(kid, SHOWN.format(mib=mib))
        assert f" · memory {shown} / 8.0 GB · " in nb.stdout(0)
