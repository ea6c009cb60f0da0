"""``%gpu``'s widget shows a share's own memory in use and utilization, the figures the
Lab panel and the admin page show (the share's processes' NVML memory and per-process
samples, ``share.used_mib`` and ``share.utilization``): a real kernel holding 8 GB of a
simulated L40S whose process NVML lists with more and more memory, then beside another
share with a load of its own. The GPU's reading carries the GPU's use, all its shares'
together, so the widget reads its request again when that reading changes."""

from __future__ import annotations

import asyncio
import subprocess
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


UTILIZATION = (
    "import time\ndeadline = time.time() + 10\n"
    "while 'utilization {pct}%' not in r.widget.text() and time.time() < deadline:\n"
    "    time.sleep(0.05)\n"
    "print(r.widget.text().splitlines()[2])"
)
"""What the status widget shows of its share once its utilization reads ``{pct}``%."""
SPARKLINE = (
    "import re, time\ndeadline = time.time() + 10\n"
    "def last():\n"
    '    found = re.search(r\'<polyline points="([^"]*)"\', r.widget.children[0].value)\n'
    "    return found and found.group(1).split()[-1].split(',')[1]\n"
    "while last() != '{y}' and time.time() < deadline:\n    time.sleep(0.1)\n"
    "print(last())"
)
"""The height of the widget's sparkline's newest point, once it is ``{y}``."""


async def test_the_widget_shows_its_shares_own_utilization_not_its_gpus(
    kernel, notebook, api, jp_serverapp, wait_until
):
    """Two shares of one GPU, this kernel's at 10% and a neighbour's at 60%: the GPU reads
    70%, the widget its own share's 10% (NVML's per-process samples of its kernel), and
    its sparkline follows that."""
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    sim = runtime.backend.simulator
    kid = await kernel()
    nb = await notebook(kid, "r = %gpu request --share 8GB", "import os; print(os.getpid())")
    pid = int(nb.stdout(1))
    (mine,) = (await api("GET", "leases"))[1]["leases"]
    (device,) = mine["devices"]
    other = (await api("POST", "requests", {"share_gb": 8, "holder": "neighbour"}))[1]["lease"]
    neighbour = subprocess.Popen(["sleep", "120"])

    async def renew() -> None:
        while True:
            await api("POST", f"leases/{other['id']}/renew", {"holder_pid": neighbour.pid})
            await asyncio.sleep(1)

    renewing = asyncio.ensure_future(renew())
    try:
        sim.add_process(device, pid, 1024)
        sim.add_process(device, neighbour.pid, 2048)
        sim.set_process_load(device, pid, 10)
        sim.set_process_load(device, neighbour.pid, 60)

        async def sampled() -> bool:
            await runtime.sample()
            share = (await api("GET", f"leases/{mine['id']}"))[1]["share"]
            return bool(share["utilization"] == 10.0)

        await wait_until(sampled)
        runtime.events.fanout.send_readings()
        nb = await notebook(kid, UTILIZATION.format(pct=10), SPARKLINE.format(y=21.8))
        assert nb.stdout(0).startswith("utilization 10% · memory 1.0 / 8.0 GB · ")
        assert runtime.readings()[device].utilization_gpu == 70.0  # the GPU's, both shares'
        assert nb.stdout(1).strip() == "21.8"  # 10% of the sparkline's 22 px above its foot
    finally:
        renewing.cancel()
        neighbour.kill()
        neighbour.wait()
