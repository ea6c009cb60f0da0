"""The hub's pages on a shared machine without MIG, in Debian's Chromium: a hub whose
broker service simulates an L40S lent as shares, with MPS (the simulated control daemons
it runs). The spawn page offers "Part of a shared GPU" and says what holds a share;
both it and My GPUs count a user's share in what they hold; My GPUs shows the share in
the broker's words, the memory its process uses and its utilization (NVML's per-process
figures, as the simulated one lists an MPS client with the load its environment states);
the admin page lists the GPU's shares, what holds them, why, and the same figures: two
users' shares at 60% and 10% of a GPU that reads 70%."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from live_hub import Hub
from loaded_process import loaded_process
from test_hub_pages import PAGES, WAIT_MS, log_in

pytestmark = [pytest.mark.slow, pytest.mark.hub]  # a real hub and a browser


@pytest.fixture
def hub(tmp_path: Path, proxy: None) -> Iterator[Hub]:
    with tempfile.TemporaryDirectory(prefix="mps", dir="/tmp") as mps:  # sockets: 108 bytes
        running = Hub(
            tmp_path / "hub",
            spawner="hub_spawner.spawner.SimpleGPUBrokerSpawner",
            simulate="l40s-4:1",
            sharing="shared",
            mps_dir=mps,
            lease_ttl=900,
            holder_account="broker",  # the test's own process may hold ann's share
            simulate_kernel_memory=2048,  # NVML lists a share's holder with 2 GiB
            sample_interval=0.5,
        )
        running.home.mkdir()
        with running.running():
            yield running


def test_the_spawn_page_my_gpus_and_the_admin_page_say_what_holds_a_share(
    hub: Hub, browser: Any, tmp_path: Path
) -> None:
    tokens = {name: hub.user(name) for name in ("ann", "bob", "admin")}
    holders = []
    try:
        for user, load in (("ann", 60), ("bob", 10)):  # the GPU reads 70%
            share = hub.ok(tokens[user], "POST", "requests", {"share_gb": 8, "holder": "t.ipynb"})
            assert share["lease"]["share"]["text"] == "8.0 GB of GPU 0, enforced by MPS"
            lease_id, env = share["lease"]["id"], share["lease"]["share"]["env"]
            holders.append(loaded_process(load, env))  # an MPS client, with its own load
            hub.ok(
                tokens[user], "POST", f"leases/{lease_id}/renew", {"holder_pid": holders[-1].pid}
            )
            wait_for_sample(hub, tokens[user], lease_id, load)
        pages(hub, browser, tokens, tmp_path)
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()


def wait_for_sample(hub: Hub, token: str, lease_id: str, load: int) -> None:
    """Until the broker has sampled the share's process: its memory and its own load."""
    deadline = time.monotonic() + 20
    share = hub.ok(token, "GET", f"leases/{lease_id}")["share"]
    while share["used_mib"] != 2048 or share["utilization"] != load:
        assert time.monotonic() < deadline, f"the broker never sampled the share: {share}"
        time.sleep(0.2)
        share = hub.ok(token, "GET", f"leases/{lease_id}")["share"]


def pages(hub: Hub, browser: Any, tokens: dict[str, str], tmp_path: Path) -> None:

    ann = log_in(browser, hub, "ann")
    ann.goto(f"{hub.url}/hub/spawn")
    form = ann.locator("fieldset.gpubroker-options")
    form.wait_for(timeout=WAIT_MS)
    assert "Part of a shared GPU" in form.inner_text()
    assert "32.3 GB free on a shared GPU now; shares enforced by MPS" in form.inner_text()
    assert "You hold 8 GB of a shared GPU now;" in form.inner_text()
    ann.check("#gpu-share_gb")
    ann.screenshot(path=str(tmp_path / "hub-share-form.png"), full_page=True)
    ann.goto(f"{hub.url}{PAGES}/")
    mine = ann.locator(".gpubroker-share-text")
    mine.wait_for(timeout=WAIT_MS)
    assert mine.inner_text() == "8.0 GB of GPU 0, enforced by MPS"
    in_use = ann.locator(".gpubroker-share-use").inner_text()
    assert in_use == "in use: 2.1 GB / 8.0 GB · utilization 60%"  # hers, not the GPU's 70%
    held = ann.locator("#gpubroker-quota li").first.inner_text()
    assert held == "I hold 8 GB of a shared GPU now; no limit of my own on what I hold at once."
    ann.screenshot(path=str(tmp_path / "hub-my-share.png"), full_page=True)

    admin = log_in(browser, hub, "admin")
    admin.goto(f"{hub.url}{PAGES}/admin")
    shared = admin.locator("tr.gpubroker-shared")
    shared.wait_for(timeout=WAIT_MS)
    assert "shares enforced by MPS: 32.3 GB free" in shared.inner_text()
    assert "the driver is 570.86.15" in shared.inner_text()  # why not the driver
    gpu = admin.locator("tr.gpubroker-gpu").inner_text().split("\t")
    assert gpu[2] == "70.0 %"  # the GPU's load: both shares' together
    rows = [r.inner_text().split("\t")[:4] for r in admin.locator("tr.gpubroker-share").all()]
    assert sorted(rows) == [
        ["8.0 GB share", "ann", "60%", "2.1 GB / 8.0 GB"],
        ["8.0 GB share", "bob", "10%", "2.1 GB / 8.0 GB"],
    ]
    admin.screenshot(path=str(tmp_path / "hub-admin-shares.png"), full_page=True)
