"""The Lab panel of a hub user's GPU server, in Debian's Chromium through a real hub and
its proxy: the server runs no broker of its own and relays the panel's calls and event
stream to the hub's broker service. Within seconds the panel shows the user's slice and
the queue; another user's request that waits arrives live, as an event."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from live_hub import Hub
from test_hub_pages import SLICE, WAIT_MS, log_in

pytestmark = [pytest.mark.slow, pytest.mark.hub]  # a real hub and a browser

SECONDS_MS = 15_000
"""How soon the panel shows what the broker holds, once it is open: "within seconds"
(the broker answers in milliseconds; this leaves room for a loaded test machine)."""
LIVE_MS = 5_000
"""How soon an event shows: well under the streams' 15 s keepalive, so a relay that passed
events on only with its next write would fail."""


def test_the_panel_of_a_hub_users_gpu_server_shows_its_slice_and_the_queue_live(
    hub: Hub, browser: Any, built_extension: Path
) -> None:
    tokens = {name: hub.user(name) for name in ("ann", "filler", "bob")}
    ann = log_in(browser, hub, "ann")
    ann.goto(f"{hub.url}/hub/spawn")
    ann.locator("fieldset.gpubroker-options").wait_for(timeout=WAIT_MS)
    ann.check("#gpu-profile")
    ann.get_by_role("button", name="Start").click()
    ann.wait_for_url("**/user/ann/**", timeout=WAIT_MS)  # granted: in her server's Lab
    tab = ann.locator(".jp-SideBar [data-id='jp-gpubroker-panel']")
    tab.wait_for(timeout=WAIT_MS)  # Lab has loaded
    tab.click()
    panel = ann.locator("#jp-gpubroker-panel")

    lease = panel.locator(".jp-GpuBroker-lease")
    lease.wait_for(timeout=SECONDS_MS)
    assert "1g.10gb · GPU " in lease.inner_text()
    panel.get_by_text("The GPU queue is empty.").wait_for(timeout=SECONDS_MS)
    panel.get_by_text("GPUs (1 GPUs, 7 MIG slices, 6 free)").wait_for(timeout=SECONDS_MS)
    ann.locator(".jp-GpuBroker-status").get_by_text("GPU 1g.10gb").wait_for(timeout=SECONDS_MS)

    # The machine fills up and Bob waits: each arrives live, with no reload.
    for _ in range(6):
        hub.ok(tokens["filler"], "POST", "requests", SLICE)
    panel.get_by_text("GPUs (1 GPUs, 7 MIG slices, 0 free)").wait_for(timeout=LIVE_MS)
    hub.ok(tokens["bob"], "POST", "requests", SLICE)
    waiting = panel.locator("table.jp-GpuBroker-queue tbody tr", has_text="bob")
    waiting.wait_for(timeout=LIVE_MS)
    assert waiting.locator("td").first.inner_text() == "1"
    assert panel.get_by_text("The GPU queue is empty.").count() == 0
    hub.stop_server("ann")
