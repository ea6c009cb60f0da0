"""The admin page's demand forecast in Chromium. On a real hub whose state file holds ten
days of history (ann on one 1g.10gb slice two hours a day, three every other day), the
page draws the band of the hours just past with what they had, and says in words how far
the forecast held the week it was checked on. On a new hub it says there is not a day of
history yet. Screenshot: ``hub-admin-forecast.png`` in ``$GPUBROKER_SCREENSHOTS``
(default: the test's temporary dir)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from live_hub import Hub, history_hub
from test_hub_pages import PAGES, WAIT_MS, log_in

from jupyter_gpubroker.broker.clock import VirtualClock
from jupyter_gpubroker.broker.core import Broker
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.nvml import open_backend
from jupyter_gpubroker.wire.sizes import Size

pytestmark = [pytest.mark.slow, pytest.mark.hub]  # a real hub and a browser

HOUR, DAY = 3600.0, 86400.0
DAYS = 10
BUSY_AGO_H = 6
"""ann's two hours start this many hours before the hour now, each day."""


def seeded(state: Path) -> None:
    """``DAYS`` days of ann holding one slice (even days) or three (odd days, the last
    one among them) for two hours a day, the last ending four hours ago, written by the
    broker's core on a virtual clock."""
    with open_backend("dgx-h100-mig:1") as backend:
        inventory = backend.inventory()
    this_hour = time.time() // HOUR * HOUR
    clock = VirtualClock(this_hour - DAYS * DAY - BUSY_AGO_H * HOUR + DAY)
    broker = Broker(Store(state), inventory, clock=clock)
    for day in range(DAYS):
        held = [broker.submit("ann", Size(profile="1g.10gb")) for _ in range(1 + 2 * (day % 2))]
        clock.advance(2 * HOUR)
        for r in held:
            broker.release(broker.request(r.id).lease_id)  # type: ignore[arg-type]
        clock.advance(DAY - 2 * HOUR)
    broker.store.close()


@pytest.fixture
def hub_with_history(tmp_path: Path, proxy: None) -> Iterator[Hub]:
    with history_hub(tmp_path / "hub", seeded) as running:
        yield running


def test_the_admin_page_draws_the_forecast_band_against_what_happened(
    hub_with_history: Hub, browser: Any, shots: Path
) -> None:
    hub = hub_with_history
    hub.user("admin")
    admin = log_in(browser, hub, "admin")
    admin.goto(f"{hub.url}{PAGES}/admin#forecast")
    section = admin.locator("#forecast")
    section.wait_for(timeout=WAIT_MS)
    chart = section.get_by_role("img", name="Forecast band and demand per hour")
    bands, marks = chart.locator("rect.gpubroker-band"), chart.locator("rect.gpubroker-mark")
    assert bands.count() == marks.count() == 24  # the last 24 hours, one row each
    # The hours ann held three slices (3/7 of a GPU) six and five hours ago: the band of
    # those hours runs from the median of 1/7 and 3/7 to 3/7, the mark at its top; every
    # other hour had and expects none.
    titles = [marks.nth(i).locator("title").text_content() or "" for i in range(24)]
    busy = [i for i, t in enumerate(titles) if "0.43 GPUs asked" in t]
    assert busy == [24 - BUSY_AGO_H, 25 - BUSY_AGO_H], titles
    assert all("forecast 0.29 GPUs to 0.43 GPUs" in titles[i] for i in busy)
    assert sum("forecast none to none, and none asked" in t for t in titles) == 22
    for i in busy:  # the band from two thirds of the scale to its top, the mark on it
        assert float(bands.nth(i).get_attribute("x") or 0) == pytest.approx(
            170 + 340 * 2 / 3, abs=1
        )
        assert float(bands.nth(i).get_attribute("width") or 0) == pytest.approx(340 / 3, abs=1)
        assert float(marks.nth(i).get_attribute("x") or 0) == pytest.approx(509, abs=1)
    trust = section.locator(".gpubroker-trust").inner_text()
    said = re.fullmatch(
        r"Over the last week, each forecast from the weeks before it alone, the p50 was off "
        r"by 0\.\d\d GPUs an hour on average \((\d+)% of the demand\), and demand stayed "
        r"at or under the p90 in (\d+)% of hours\.",
        trust,
    )
    assert said, trust
    # the p50 misses by a slice every busy hour: a share of the demand, never most of it
    assert 10 <= int(said[1]) <= 60 and 90 <= int(said[2]) <= 100
    section.screenshot(path=str(shots / "hub-admin-forecast.png"))


def test_a_new_hubs_admin_page_says_its_forecast_needs_a_day_of_history(
    hub: Hub, browser: Any
) -> None:
    hub.user("admin")
    admin = log_in(browser, hub, "admin")
    admin.goto(f"{hub.url}{PAGES}/admin#forecast")
    section = admin.locator("#forecast")
    section.wait_for(timeout=WAIT_MS)
    assert section.locator("svg").count() == 0
    assert section.locator(".gpubroker-no-forecast").inner_text() == (
        "Not enough history yet: no history, and a forecast needs a day of it."
    )
    assert section.locator(".gpubroker-acting li").all_inner_texts() == [
        "Power limits lowered in a forecast trough: off.",
        "MIG slices cut ahead of the forecast: off.",
    ]
