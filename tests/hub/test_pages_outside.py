"""The admin page shows use outside the broker on the device's row, in words, and the
user's My GPUs page tells them, rendered from a real broker on whose simulated GPU a real
process of another OS user runs (a real hub cannot reach into the service's simulated
NVML, so this renders the pages' templates from the same views the pages use)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from bs4 import BeautifulSoup
from hub_pages import render
from traitlets.config import Config

from hub_spawner.pages import PageHandler, admin_view
from jupyter_gpubroker.api.rules import BrokerAPI
from jupyter_gpubroker.broker.clock import VirtualClock
from jupyter_gpubroker.runtime import GPUBroker


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as another user")
def test_the_admin_page_names_the_device_user_pid_and_how_long(tmp_path: Path) -> None:
    c = Config()
    c.GPUBroker.simulate = "workstation-a100"
    c.GPUBroker.state_file = str(tmp_path / "state.sqlite")
    rt = GPUBroker(config=c)
    rt.start()
    stray = subprocess.Popen(["sleep", "600"], user=65534)
    try:
        rt.core.clock = VirtualClock(time.time())
        gpu = rt.core.inventory.gpus[1].uuid
        rt.backend.simulator.add_process(gpu, stray.pid, follow=True)  # type: ignore[union-attr]
        rt.sampler.sample()  # type: ignore[union-attr]
        rt.core.clock.advance(12 * 60 + 5)
        api = BrokerAPI(rt)
        view = admin_view(api, api.identify(rt.owner), 30, "1970-01-01T00:00:00Z", None)
        html = render("admin.html", view)
        pages = {
            user: render(
                "my.html", PageHandler.my_context(SimpleNamespace(api=api, who=api.identify(user)))
            )
            for user in ("nobody", "alice")
        }
    finally:
        stray.kill()
        stray.wait()
        rt.stop()
    doc = BeautifulSoup(html, "html.parser")
    row = doc.select_one(f'tr.gpubroker-device[data-uuid="{gpu}"]')
    assert row.select_one(".gpubroker-outside").get_text(strip=True) == (
        f"GPU 1: in use outside the broker by nobody, pid {stray.pid}, for 12 min"
    )
    (alert,) = doc.find(id="alerts").select("tr.gpubroker-alert")
    assert alert["data-kind"] == "outside" and f"pid {stray.pid}" in alert.get_text()
    mine = BeautifulSoup(pages["nobody"], "html.parser").select(".gpubroker-outside")
    assert [m.get_text(strip=True) for m in mine] == [
        f"GPU 1: in use outside the broker by nobody, pid {stray.pid}, for 12 min. No lease of "
        "yours holds it: ask for a GPU here, so the broker can share the machine fairly."
    ]
    assert not BeautifulSoup(pages["alice"], "html.parser").select(".gpubroker-outside")
