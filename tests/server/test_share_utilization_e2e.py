"""Each share's own utilization, not its GPU's: a real jupyter-server on a simulated L40S
lent in shares, two shares held by real processes whose environment gives each its own
load in the simulated driver (60% and 10%; NVML's per-process samples). The GPU reads
70%; the API, ``/metrics`` and ``jupyter gpubroker status`` say 60% and 10%."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from loaded_process import loaded_process
from prometheus_client.parser import text_string_to_metric_families


@pytest.fixture
def broker_config(broker_config: dict[str, Any]) -> dict[str, Any]:
    return {
        **broker_config,
        "simulate": "l40s-4:1",
        "sharing": "shared",
        "mps_control": "",  # watched shares: no daemon to start
        "simulate_kernel_memory": 2048,  # NVML lists each holder with 2 GiB
        "sample_interval": 0.25,
        "lease_ttl": 60.0,
    }


@contextlib.asynccontextmanager
async def two_shares(api: Any) -> AsyncIterator[dict[str, str]]:
    """Shares of 20 and 8 GB, each held by a process that states its load: lease id by load."""
    held, procs = {}, []
    try:
        for gb, load in ((20, 60), (8, 10)):
            lease = (await api("POST", "requests", {"share_gb": gb, "holder": f"k{load}"}))[1][
                "lease"
            ]
            proc = loaded_process(load)
            procs.append(proc)
            await api("POST", f"leases/{lease['id']}/renew", {"holder_pid": proc.pid})
            held[str(load)] = lease["id"]
        yield held
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


async def share_of(api: Any, lease_id: str) -> dict[str, Any]:
    return dict((await api("GET", f"leases/{lease_id}"))[1]["share"])


async def test_each_share_shows_its_own_utilization_on_every_front(api, jp_fetch, cli):
    async with two_shares(api) as held:
        await fronts(api, jp_fetch, cli, held["60"], held["10"])


async def fronts(api: Any, jp_fetch: Any, cli: Any, busy: str, light: str) -> None:
    deadline = asyncio.get_running_loop().time() + 20
    while (await share_of(api, busy))["utilization"] != 60.0:
        assert asyncio.get_running_loop().time() < deadline, await share_of(api, busy)
        await asyncio.sleep(0.2)
    while (await share_of(api, light))["utilization"] != 10.0:
        assert asyncio.get_running_loop().time() < deadline, await share_of(api, light)
        await asyncio.sleep(0.2)
    assert (await share_of(api, light))["used_mib"] == 2048

    (gpu,) = (await api("GET", "devices"))[1]["gpus"]
    assert gpu["utilization_gpu"] == 70.0  # the GPU's: both shares' together
    shares = {x["lease_id"]: x for x in gpu["sharing"]["shares"]}
    assert {k: (x["utilization"], x["used_mib"]) for k, x in shares.items()} == {
        busy: (60.0, 2048),
        light: (10.0, 2048),
    }

    scraped = (await jp_fetch("metrics")).body.decode()
    util = {
        x.labels["lease_id"]: x.value
        for family in text_string_to_metric_families(scraped)
        for x in family.samples
        if x.name == "gpubroker_share_utilization_percent"
    }
    assert util == {busy: 60.0, light: 10.0}

    code, text, _ = await cli("status", json_out=False)
    assert code == 0
    rows = [line.split() for line in str(text).splitlines() if line.startswith("  share")]
    # "share", its use ("2.1 GB used"), its memory, its utilization, its holder
    assert sorted((r[4], r[6], r[8]) for r in rows) == [
        ("20.0", "60%", f"({busy})"),
        ("8.0", "10%", f"({light})"),
    ]
    assert "; held: two shares of shared GPUs, 28 GB in all (" in str(text)
