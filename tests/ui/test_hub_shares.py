"""The hub's pages on a shared machine without MIG, in Debian's Chromium: a hub whose
broker service simulates an L40S lent as shares, with MPS (the simulated control daemons
it runs). The spawn page offers "Part of a shared GPU" and says what holds a share;
both it and My GPUs count a user's share in what they hold; My GPUs shows the share in
the broker's words and the memory its process uses (NVML's, as the simulated one lists
an MPS client); the admin page lists the GPU's shares, what holds them, why, and the
same figure."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from live_hub import Hub
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
    tokens = {name: hub.user(name) for name in ("ann", "admin")}
    share = hub.ok(tokens["ann"], "POST", "requests", {"share_gb": 8, "holder": "train.ipynb"})
    assert share["lease"]["share"]["text"] == "8.0 GB of GPU 0, enforced by MPS"
    lease_id, env = share["lease"]["id"], share["lease"]["share"]["env"]
    holder = subprocess.Popen(["sleep", "600"], env={**os.environ, **env})  # an MPS client
    try:
        hub.ok(tokens["ann"], "POST", f"leases/{lease_id}/renew", {"holder_pid": holder.pid})
        deadline = time.monotonic() + 20
        while hub.ok(tokens["ann"], "GET", f"leases/{lease_id}")["share"]["used_mib"] != 2048:
            assert time.monotonic() < deadline, "the broker never sampled the share's use"
            time.sleep(0.2)
        pages(hub, browser, tokens, tmp_path)
    finally:
        holder.kill()
        holder.wait()


def pages(hub: Hub, browser: Any, tokens: dict[str, str], tmp_path: Path) -> None:

    ann = log_in(browser, hub, "ann")
    ann.goto(f"{hub.url}/hub/spawn")
    form = ann.locator("fieldset.gpubroker-options")
    form.wait_for(timeout=WAIT_MS)
    assert "Part of a shared GPU" in form.inner_text()
    assert "40.3 GB free on a shared GPU now; shares enforced by MPS" in form.inner_text()
    assert "You hold 8 GB of a shared GPU now;" in form.inner_text()
    ann.check("#gpu-share_gb")
    ann.screenshot(path=str(tmp_path / "hub-share-form.png"), full_page=True)
    ann.goto(f"{hub.url}{PAGES}/")
    mine = ann.locator(".gpubroker-share-text")
    mine.wait_for(timeout=WAIT_MS)
    assert mine.inner_text() == "8.0 GB of GPU 0, enforced by MPS"
    assert ann.locator(".gpubroker-share-use").inner_text() == "in use: 2.1 GB / 8.0 GB"
    held = ann.locator("#gpubroker-quota li").first.inner_text()
    assert held == "I hold 8 GB of a shared GPU now; no limit of my own on what I hold at once."
    ann.screenshot(path=str(tmp_path / "hub-my-share.png"), full_page=True)

    admin = log_in(browser, hub, "admin")
    admin.goto(f"{hub.url}{PAGES}/admin")
    shared = admin.locator("tr.gpubroker-shared")
    shared.wait_for(timeout=WAIT_MS)
    assert "shares enforced by MPS: 40.3 GB free" in shared.inner_text()
    assert "the driver is 570.86.15" in shared.inner_text()  # why not the driver
    (row,) = admin.locator("tr.gpubroker-share").all()
    assert row.inner_text().split("\t")[:4] == ["8.0 GB share", "ann", "", "2.1 GB / 8.0 GB"]
    admin.screenshot(path=str(tmp_path / "hub-admin-shares.png"), full_page=True)
