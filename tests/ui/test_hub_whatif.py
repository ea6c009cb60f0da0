"""The admin page's "What if" in Chromium. On a real hub whose state file holds a morning
when ten people asked for a slice of a GPU cut in seven and three waited an hour, the
admin asks what one GPU more and first-come-first-served would have done: the page says
it replays, then sets the figures beside what really happened (no wait at all) and says
so in sentences; a what-if the machine cannot take says why. Screenshot:
``hub-admin-whatif.png`` in ``$GPUBROKER_SCREENSHOTS`` (default: the test's own dir)."""

from __future__ import annotations

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

HOUR = 3600.0
ASKED = 10
"""Slices asked for at once, a day ago, on a GPU of seven: three wait an hour."""


def seeded(state: Path) -> None:
    """The morning: ``ASKED`` slices asked for at once, each held an hour, written by the
    broker's core on a virtual clock."""
    with open_backend("dgx-h100-mig:1") as backend:
        inventory = backend.inventory()
    clock = VirtualClock(time.time() - 24 * HOUR)
    broker = Broker(Store(state), inventory, clock=clock)
    for i in range(ASKED):
        broker.submit(f"user{i % 4}", Size(profile="1g.10gb"))
    for _ in range(2):  # the first seven hold an hour, then the three that waited
        clock.advance(HOUR)
        held = [x.id for x in broker.leases()]  # before a release grants the next ones
        for lease_id in held:
            broker.release(lease_id)
    broker.store.close()


@pytest.fixture
def hub_with_history(tmp_path: Path, proxy: None) -> Iterator[Hub]:
    with history_hub(tmp_path / "hub", seeded) as running:
        yield running


def test_the_admin_asks_what_one_more_gpu_would_have_done_and_reads_it_beside_what_happened(
    hub_with_history: Hub, browser: Any, shots: Path
) -> None:
    hub = hub_with_history
    hub.user("admin")
    admin = log_in(browser, hub, "admin")
    errors: list[str] = []
    admin.on("pageerror", lambda e: errors.append(str(e)))
    admin.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    admin.goto(f"{hub.url}{PAGES}/admin#whatif")
    section = admin.locator("#whatif")
    section.wait_for(timeout=WAIT_MS)
    assert section.locator("table").count() == 0  # nothing replayed yet

    section.get_by_label("GPUs added").fill("1")
    section.get_by_label("Ordering policy").select_option("fcfs")
    section.get_by_role("button", name="Run").click()
    admin.wait_for_load_state()
    progress = admin.locator(".gpubroker-whatif-progress")
    if progress.count():  # still running: it says what it replays, and looks again
        assert progress.inner_text().strip() in (
            "Reading the recorded requests…",
            f"Replaying {ASKED} recorded requests…",
        )
    table = admin.locator("#whatif table.gpubroker-whatif")
    table.wait_for(timeout=WAIT_MS)
    head = table.locator("thead th").all_inner_texts()
    assert head == ["", "What really happened", "Replayed as it was", "Replayed with the change"]
    rows = {
        r.locator("th").inner_text(): r.locator("td").all_inner_texts()
        for r in table.locator("tbody tr").all()
    }
    assert rows["Requests granted"] == ["10", "10", "10"]
    assert rows["Mean wait"] == ["18 min", "18 min", "0 s"]  # three of ten waited an hour
    assert rows["Wait that 95 in 100 stayed under"] == ["1 h 00 min", "1 h 00 min", "0 s"]
    assert rows["GPU-hours held"] == ["1.4 h", "1.4 h", "1.4 h"]
    assert rows["Kernels lost (reclaimed)"][0] == "0"
    said = admin.locator("#whatif .gpubroker-whatif-said").all_inner_texts()
    assert said[0] == (
        "With 1 more GPU and the fcfs policy, the mean wait would have been 0 s instead of "
        "18 min, and no request would have waited at all."
    )
    assert said[1].startswith("Replayed as it was, the 10 recorded requests waited 18 min")
    section = admin.locator("#whatif")
    charts = section.locator(".gpubroker-whatif-plot svg")
    assert charts.count() == 2  # each day's mean wait and GPU-hours held
    day = charts.first.locator("rect.gpubroker-bar title").first.text_content() or ""
    assert day.endswith(": 0 s with the change, 18 min in fact")  # the day they asked
    assert section.get_by_label("GPUs added").input_value() == "1"  # what was asked
    assert section.get_by_label("Ordering policy").input_value() == "fcfs"
    section.screenshot(path=str(shots / "hub-admin-whatif.png"))

    section.get_by_label("GPUs added").fill("-1")  # the one GPU it has: refused, said why
    section.get_by_role("button", name="Run").click()
    error = admin.locator("#whatif .gpubroker-whatif-error")
    error.wait_for(timeout=WAIT_MS)
    assert error.inner_text() == (
        "The last what-if could not run: the machine has 1 GPU: it cannot lose 1."
    )
    # this history was written by a broker that watched no kernel: no idle time to vary
    section = admin.locator("#whatif")
    section.get_by_label("GPUs added").fill("0")
    section.get_by_label("Idle timeout").fill("10")
    section.get_by_label("An idle kernel is").select_option("suspend")
    section.get_by_role("button", name="Run").click()
    error = admin.locator("#whatif .gpubroker-whatif-error")
    error.wait_for(timeout=WAIT_MS)
    assert "records no busy periods of any kernel" in error.inner_text()
    assert admin.locator("#whatif").get_by_label("Idle timeout").input_value() == "10"
    assert errors == []
