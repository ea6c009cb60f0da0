"""A GPU notebook's time limit in a real Lab: the panel shows when it ends; before the end
a notification says so and offers "Extend 1 hour" (not "Keep it"); while a waiting
request was promised the GPU at that end, Extend is refused with the broker's reason and
the warning stays; once nobody needs it, Extend moves the panel's end time an hour on and
the warning goes. A request then waiting for the slice shows its promised start first in
the queue; an admin's drain breaks the promise, and a notification says so."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from lab_server import Lab, scene
from test_lab_panel import WAIT_MS, open_notebook, open_panel

from jupyter_gpubroker.wire.text import clock

pytestmark = pytest.mark.slow  # a real Lab and a browser

LIMIT_S = 130
"""The notebook's time limit (its class's default): warned 10 s after its grant."""


@pytest.fixture
def lab_config() -> dict[str, Any]:
    # Interactive requests (a notebook's kernel) hold for LIMIT_S, warned 120 s before its
    # end and never reclaimed during the test; the other users hold batch work, no limit.
    return {
        "sample_interval": 1.0,
        "default_time_limit": {"interactive": LIMIT_S},
        "time_limit_warning": 120,
        "time_limit_grace": 3600,
    }


@pytest.fixture
def lab(tmp_path: Path, built_extension: Path, lab_config: dict[str, Any]) -> Iterator[Lab]:
    server = Lab(tmp_path, built_extension, lab_config, scene=scene("batch"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def hhmm(iso: str, later_s: float = 0.0) -> str:
    """An API instant (``later_s`` on) as the panel says it: the browser runs on this
    machine's clock."""
    return clock(datetime.fromisoformat(iso).timestamp() + later_s)


def my_lease(lab: Lab) -> dict[str, Any]:
    (lease,) = [x for x in lab.api("GET", "leases")["leases"] if x["limit_s"] is not None]
    return lease


def test_time_limit_warning_extend_refused_then_granted(lab: Lab, page: Any) -> None:
    panel = open_panel(page)
    open_notebook(page, lab, "limited.ipynb")  # takes the free slice, with a time limit
    row = panel.locator(".jp-GpuBroker-lease", has_text="limited.ipynb")
    row.wait_for(timeout=WAIT_MS)
    lease = my_lease(lab)
    assert lease["limit_s"] == LIMIT_S
    ends = hhmm(lease["ends_at"])
    row.get_by_text(f"until {ends}").wait_for(timeout=WAIT_MS)

    # Someone waits for a slice with a time limit: the broker promises it a start at this
    # lease's end (the other slices are held with no limit), so an extension is refused.
    waiting = lab.api("POST", "requests", {"profile": "1g.10gb", "limit_s": 600, "holder": "cli"})
    assert waiting["state"] == "queued"

    toast = page.locator(".Toastify__toast", has_text="Your GPU's time limit ends at")
    toast.wait_for(timeout=WAIT_MS)
    assert f"time limit ends at {ends};" in toast.inner_text()
    assert toast.get_by_role("button", name="Keep it").count() == 0
    page.locator(".jp-GpuBroker-status", has_text="GPU time limit: reclaim in").wait_for(
        timeout=WAIT_MS
    )
    row.get_by_role("button", name="Extend 1 hour").wait_for(timeout=WAIT_MS)

    toast.get_by_role("button", name="Extend 1 hour").click()
    refused = page.locator(".Toastify__toast", has_text="Extend 1 hour: not extended:")
    refused.wait_for(timeout=WAIT_MS)
    assert "a waiting request needs this GPU" in refused.inner_text()
    assert f"when its time limit ends, at {ends}" in refused.inner_text()
    assert my_lease(lab)["ends_at"] == lease["ends_at"]
    assert toast.is_visible()  # the warning stays: the GPU is still to be given back
    assert row.get_by_text(f"until {ends}").is_visible()

    # Nobody waits any more: Extend is granted, the warning goes, the end moves an hour.
    lab.api("DELETE", f"requests/{waiting['id']}")
    toast.get_by_role("button", name="Extend 1 hour").click()
    later = hhmm(lease["ends_at"], 3600)
    row.get_by_text(f"until {later}").wait_for(timeout=WAIT_MS)
    extended = my_lease(lab)
    assert (extended["extensions"], hhmm(extended["ends_at"])) == (1, later)
    toast.wait_for(state="detached", timeout=WAIT_MS)
    # the broker withdraws the warning at its next look: the row's Extend goes with it
    row.get_by_role("button", name="Extend 1 hour").wait_for(state="detached", timeout=WAIT_MS)
    assert my_lease(lab)["reclaim_at"] is None

    # A request waiting for that slice is promised a start, and the queue says so first;
    # an admin drains the slice: the promise cannot be kept, and a notification says why.
    waiting = lab.api("POST", "requests", {"profile": "1g.10gb", "limit_s": 600, "holder": "cli"})
    bound = hhmm(lab.api("GET", f"requests/{waiting['id']}")["eta_bound"])
    queued = panel.locator("tr.jp-GpuBroker-mine")
    queued.get_by_text(f"by {bound} at the latest (likely ").wait_for(timeout=WAIT_MS)
    (device,) = extended["devices"]
    lab.api("POST", f"devices/{device}/drain", {"reason": "a fan"})
    broken = page.locator(".Toastify__toast", has_text=f"The start promised by {bound} cannot")
    broken.wait_for(timeout=WAIT_MS)
    assert "a GPU was taken out of service (drained by " in broken.inner_text()
    assert broken.inner_text().endswith("No start can be promised for now.")
