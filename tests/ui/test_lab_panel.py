"""The JupyterLab GPU panel and status-bar item in a real Lab, on a simulated DGX H100 whose
56 slices other users hold all but one of: the panel shows the machine; a GPU notebook's
kernel takes the free slice and shows as my lease with its notebook's name; the next one
waits with its position in the status bar and the panel, is cancelled from the panel, and
a third starts once a slice is released; an idle kernel's reclaim warning notifies; a
grant's notice goes when its lease ends."""

from __future__ import annotations

from typing import Any

import pytest
from lab_server import HOLDERS, Lab

pytestmark = pytest.mark.slow  # a real Lab and a browser

WAIT_MS = 60_000


@pytest.fixture
def lab_config() -> dict[str, Any]:
    # Warned after 20 s idle, never reclaimed during the test.
    return {"sample_interval": 1.0, "idle_timeout": 20.0, "grace": 3600.0}


def open_panel(page: Any) -> Any:
    page.locator(".jp-SideBar [data-id='jp-gpubroker-panel']").click()
    panel = page.locator("#jp-gpubroker-panel")
    panel.wait_for(timeout=WAIT_MS)
    return panel


def open_notebook(page: Any, lab: Lab, name: str) -> None:
    lab.notebook(name)
    page.evaluate(f"window.jupyterapp.commands.execute('docmanager:open', {{path: '{name}'}})")


def test_panel_queue_cancel_and_grant(lab: Lab, page: Any) -> None:
    status = page.locator(".jp-GpuBroker-status")
    panel = open_panel(page)
    panel.get_by_text("GPUs (8 GPUs, 56 MIG slices, 1 free)").wait_for(timeout=WAIT_MS)
    assert panel.locator(".jp-GpuBroker-gpu").count() == 8
    assert panel.locator(".jp-GpuBroker-slice").count() == 56
    assert panel.locator(".jp-GpuBroker-slice.jp-mod-free").count() == 1

    open_notebook(page, lab, "first.ipynb")  # takes the free slice
    lease = panel.locator(".jp-GpuBroker-lease", has_text="first.ipynb")
    lease.wait_for(timeout=WAIT_MS)
    assert "1g.10gb · GPU " in lease.inner_text()
    status.get_by_text("GPU 1g.10gb").wait_for(timeout=WAIT_MS)

    open_notebook(page, lab, "second.ipynb")  # the machine is full: it waits
    mine = panel.locator("tr.jp-GpuBroker-mine")
    mine.wait_for(timeout=WAIT_MS)
    assert mine.locator("td").first.inner_text() == "1"
    status.get_by_text("queue 1 of 1").wait_for(timeout=WAIT_MS)
    # where it stands, in the words every front uses (the broker's, wire/text.py)
    page.locator(
        ".Toastify__toast",
        has_text="second.ipynb waits for a GPU (1g.10gb): position 1 of 1, nothing ahead; ",
    ).wait_for(timeout=WAIT_MS)
    # at the sidebar's default width the Cancel button is whole, inside the panel
    button, box = mine.get_by_role("button", name="Cancel").bounding_box(), panel.bounding_box()
    assert button is not None and box is not None and button["width"] > 20
    assert box["x"] <= button["x"] and button["x"] + button["width"] <= box["x"] + box["width"]

    mine.get_by_role("button", name="Cancel").click()
    panel.get_by_text("The GPU queue is empty.").wait_for(timeout=WAIT_MS)
    assert [r for r in lab.api("GET", "requests")["requests"] if r["state"] == "queued"] == []
    # The kernel start ends with the reason, as the user asked.
    dialog = page.locator(".jp-Dialog", has_text="request cancelled")
    dialog.wait_for(timeout=WAIT_MS)
    dialog.get_by_role("button", name="Ok").click()
    page.locator(".jp-Dialog", has_text="Select Kernel").get_by_role(
        "button", name="No Kernel"
    ).click()  # Lab offers another start: not now

    open_notebook(page, lab, "third.ipynb")
    mine.wait_for(timeout=WAIT_MS)
    other = next(x for x in lab.api("GET", "leases")["leases"] if x["user"] == "alice")
    lab.api("DELETE", f"leases/{other['id']}")
    panel.locator(".jp-GpuBroker-lease", has_text="third.ipynb").wait_for(timeout=WAIT_MS)
    assert panel.locator("tr.jp-GpuBroker-mine").count() == 0

    # The idle kernels are warned (idle_timeout 20 s): a notification with "Keep it".
    toast = page.locator(".Toastify__toast", has_text="Your GPU will be reclaimed")
    toast.first.wait_for(timeout=WAIT_MS)
    status.get_by_text("GPU idle: reclaim in").wait_for(timeout=WAIT_MS)
    warned = set(warned_leases(lab))
    toast.first.get_by_role("button", name="Keep it").click()
    for _ in range(100):  # that lease is no longer due
        if len(warned_leases(lab)) < len(warned):
            break
        page.wait_for_timeout(200)
    assert len(warned_leases(lab)) < len(warned)

    # A grant's notice goes with its lease, not left saying "GPU granted" of a GPU gone:
    # Lab's notification list keeps the first notebook's and drops the third's.
    page.locator(".jp-Notification-Status").click()
    granted = page.locator(".jp-Notification-List-Item", has_text="GPU granted")
    granted.nth(1).wait_for(timeout=WAIT_MS)
    assert granted.count() == 2
    mine = [x for x in lab.api("GET", "leases")["leases"] if x["user"] not in HOLDERS]
    lab.api("DELETE", f"leases/{max(mine, key=lambda x: x['granted_at'])['id']}")
    for _ in range(100):
        if granted.count() == 1:
            break
        page.wait_for_timeout(200)
    assert granted.count() == 1


def warned_leases(lab: Lab) -> list[str]:
    mine = [x for x in lab.api("GET", "leases")["leases"] if x["user"] not in HOLDERS]
    return [x["id"] for x in mine if x["reclaim_at"]]


def test_panel_updates_in_place_opens_by_command_and_stays_open(lab: Lab, page: Any) -> None:
    panel = open_panel(page)
    open_notebook(page, lab, "first.ipynb")  # takes the free slice: a lease with Release
    release = panel.locator(".jp-GpuBroker-lease", has_text="first.ipynb").get_by_role(
        "button", name="Release"
    )
    release.wait_for(timeout=WAIT_MS)
    # The pointer rests on Release and the keyboard's focus is on it over two ticks: it
    # is still the same element (it keeps what we set on it) and still has the focus.
    release.hover()
    release.focus()
    release.evaluate("b => { b.marked = 'kept' }")
    page.wait_for_timeout(2500)
    assert release.evaluate("b => b.marked") == "kept"
    assert release.evaluate("b => document.activeElement === b")
    assert release.evaluate("b => b.matches(':hover')")

    # The panel opens from the command palette once its sidebar is closed.
    page.locator(".jp-SideBar [data-id='jp-gpubroker-panel']").click()  # closes it
    page.locator("#jp-gpubroker-panel").wait_for(state="hidden", timeout=WAIT_MS)
    page.keyboard.press("Control+Shift+C")
    page.locator(".lm-CommandPalette-input").fill("Open the GPU Panel")
    page.locator(".lm-CommandPalette-item", has_text="Open the GPU Panel").click()
    panel.wait_for(timeout=WAIT_MS)

    # Open when the page is reloaded, as the Lab's own sidebars are.
    page.wait_for_timeout(2000)  # the Lab saves its layout to the workspace
    page.goto(f"{lab.url}/lab/tree/first.ipynb")
    page.locator(".jp-SideBar [data-id='jp-gpubroker-panel']").wait_for(timeout=WAIT_MS)
    panel.get_by_text("My GPUs (1)").wait_for(timeout=WAIT_MS)
    assert panel.is_visible()
