"""The admin page's alerts section, rendered from a real broker whose simulated GPU
overheats and then runs power-capped (a real hub cannot reach into the service's
simulated NVML, so this renders the page's template from the same view the page uses)."""

from __future__ import annotations

from pathlib import Path

from bs4 import BeautifulSoup
from hub_pages import render
from traitlets.config import Config

from hub_spawner.pages import admin_view
from jupyter_gpubroker.api.rules import BrokerAPI
from jupyter_gpubroker.runtime import GPUBroker


def test_the_admin_page_lists_active_alerts_and_their_history(tmp_path: Path) -> None:
    c = Config()
    c.GPUBroker.simulate = "workstation-a100"
    c.GPUBroker.state_file = str(tmp_path / "state.sqlite")
    c.GPUBroker.alert_clear_after = 0.0
    rt = GPUBroker(config=c)
    rt.start()
    try:
        sim = rt.backend.simulator  # type: ignore[union-attr]
        gpu = rt.core.inventory.gpus[0].uuid
        assert rt.sampler is not None
        sim.inject_overheat(gpu, 95)
        rt.sampler.sample()
        sim.clear_faults(gpu)
        rt.sampler.sample()
        sim.inject_power_cap(gpu)
        rt.sampler.sample()
        api = BrokerAPI(rt)
        view = admin_view(api, api.identify(rt.owner), 30, "1970-01-01T00:00:00Z", None)
        html = render("admin.html", view)
    finally:
        rt.stop()
    section = BeautifulSoup(html, "html.parser").find(id="alerts")
    active = section.select("tr.gpubroker-alert")
    assert [(r["data-kind"], r["data-uuid"]) for r in active] == [("power_cap", gpu)]
    assert "power" in active[0].get_text().lower()
    ended = section.select("tr.gpubroker-alert-ended")
    assert len(ended) == 1 and "shutdown temperature" in ended[0].get_text()
    assert section.select_one(".gpubroker-no-alerts") is None
