"""A GPU server's time limit in a real browser (Debian's Chromium through Playwright) on a
real hub with its proxy: the user asks for a MIG slice "For 1 hours" on the spawn form;
near its end (the broker warns 3595 s before, so at once) the hub's home page says when
the GPU's time ends, with Extend; Extend opens "My GPUs" at that lease, whose "Extend by 1
hour" gives the server an hour more, and the warning goes."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from live_hub import Hub
from test_hub_pages import WAIT_MS, log_in

pytestmark = [pytest.mark.slow, pytest.mark.hub]  # a real hub and a browser


@pytest.fixture
def hub(tmp_path: Path, proxy: None) -> Iterator[Hub]:
    running = Hub(
        tmp_path / "hub",
        spawner="hub_spawner.spawner.SimpleGPUBrokerSpawner",
        extra_config="c.SimpleGPUBrokerSpawner.gpu_wait_timeout = 600\n"
        "c.Spawner.poll_interval = 1\n",
        time_limit_warning=3595,
    )
    running.home.mkdir()
    with running.running():
        yield running


def test_the_spawn_forms_hours_are_a_limit_warned_on_the_home_page_and_extended(
    hub: Hub, browser: Any
) -> None:
    token = hub.user("ann")
    ann = log_in(browser, hub, "ann")
    ann.goto(f"{hub.url}/hub/spawn")
    ann.locator("fieldset.gpubroker-options").wait_for(timeout=WAIT_MS)
    ann.check("#gpu-profile")
    ann.get_by_label("hours").fill("1")
    assert "hours (you can extend it)" in ann.locator("fieldset.gpubroker-options").inner_text()
    ann.get_by_role("button", name="Start").click()
    ann.wait_for_url("**/user/ann/**", timeout=WAIT_MS)  # the server started: in its Lab
    lease = hub.ok(token, "GET", "leases")["leases"][0]
    assert lease["limit_s"] == 3600

    ann.goto(f"{hub.url}/hub/home")
    _reload_until(ann, warned=True)
    notice = ann.locator(".announcement")
    assert f"Your GPU server's time on {lease['devices'][0]} ends at" in notice.inner_text()
    notice.get_by_role("link", name="Extend").click()
    alert = ann.locator(f"#lease-{lease['id']}")
    alert.wait_for(timeout=WAIT_MS)
    assert "unless you extend it" in alert.inner_text()
    alert.get_by_role("button", name="Extend by 1 hour").click()
    ann.get_by_text("Extended: your time on").wait_for(timeout=WAIT_MS)
    ends = datetime.fromisoformat(hub.ok(token, "GET", f"leases/{lease['id']}")["ends_at"])
    assert ends.timestamp() == pytest.approx(
        datetime.fromisoformat(lease["ends_at"]).timestamp() + 3600
    )
    assert ann.locator(".gpubroker-time-up").count() == 0  # no longer warned

    ann.goto(f"{hub.url}/hub/home")  # the warning is gone from the hub's page too
    _reload_until(ann, warned=False)
    hub.stop_server("ann")


def _reload_until(page: Any, warned: bool) -> None:
    """The hub's page as it is once the home page warns (or no longer warns) of the time
    limit: the hub's notice changes at its next poll of the server (each second here)."""
    for _ in range(60):
        if ("ends at" in page.locator("body").inner_text()) == warned:
            return
        page.wait_for_timeout(1000)
        page.reload()
    raise AssertionError(f"the hub's home page {'never' if warned else 'still'} warns")
