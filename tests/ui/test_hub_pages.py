"""The hub in a real browser (Debian's Chromium through Playwright): a user logs in through
the hub, asks for a MIG slice on the spawn page's options form and, the machine being
full, sees the queue position on the spawn progress page; the admin raises that user's
quota on the admin page and the server is granted its slice.

The screenshots of the docs' hub page come from this test: set
``GPUBROKER_SCREENSHOTS=docs`` to write them there (default: the test's temporary dir)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from live_hub import Hub

pytestmark = [pytest.mark.slow, pytest.mark.hub]  # a real hub and a browser

WAIT_MS = 120_000
SLICE = {"profile": "1g.10gb"}
PAGES = "/services/gpubroker"


def log_in(browser: Any, hub: Hub, name: str) -> Any:
    """A browser page of ``name`` logged in through the hub's login form."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", name)
    page.fill("#password_input", "any")
    page.click("#login_submit")
    page.wait_for_load_state()
    return page


def test_a_queued_spawn_shows_its_position_and_the_admins_quota_lets_it_start(
    hub: Hub, browser: Any, shots: Path
) -> None:
    tokens = {name: hub.user(name) for name in ("ann", "filler", "admin")}
    hub.ok(tokens["admin"], "PUT", "quotas/user/ann", {"max_gpus": 0.15, "share": 1})
    hub.ok(tokens["ann"], "POST", "requests", {**SLICE, "holder": "notebook.ipynb"})
    fill = [hub.ok(tokens["filler"], "POST", "requests", SLICE) for _ in range(6)]

    ann = log_in(browser, hub, "ann")
    ann.goto(f"{hub.url}/hub/spawn")
    form = ann.locator("fieldset.gpubroker-options")
    form.wait_for(timeout=WAIT_MS)
    assert "0 of 7 free" in form.inner_text()
    ann.check("#gpu-profile")
    ann.screenshot(path=str(shots / "hub-options-form.png"), full_page=True)
    ann.get_by_role("button", name="Start").click()
    message = ann.locator("#progress-message")
    message.get_by_text("position 1 of 1").wait_for(timeout=WAIT_MS)
    assert "Waiting for 1g.10gb (interactive)" in message.inner_text()
    ann.screenshot(path=str(shots / "hub-spawn-queued.png"), full_page=True)

    # A slice frees, but ann's quota (0.15 GPU-equivalents at once) keeps her waiting.
    hub.ok(tokens["filler"], "DELETE", f"leases/{fill[0]['lease']['id']}")
    waiting = hub.ok(tokens["ann"], "GET", "requests")["requests"]
    assert [r["state"] for r in waiting if r["holder"] == "server:ann"] == ["queued"]

    admin = log_in(browser, hub, "admin")
    admin.goto(f"{hub.url}{PAGES}/admin")
    row = admin.locator('tr[data-quota="user:ann"]')
    row.get_by_label("most GPU-equivalents of ann").fill("1")
    row.get_by_role("button", name="Save").click()
    admin.get_by_text("The quota of user ann is set.").wait_for(timeout=WAIT_MS)
    assert row.get_by_label("most GPU-equivalents of ann").input_value() == "1"
    granted = ann.locator("#progress-log").get_by_text("Granted 1g.10gb", exact=False)
    granted.wait_for(state="attached", timeout=WAIT_MS)
    ann.wait_for_url("**/user/ann/**", timeout=WAIT_MS)  # the server started: in its Lab
    ann.close()

    # The machine is full again: another of ann's requests waits; her page says so.
    hub.ok(tokens["ann"], "POST", "requests", {**SLICE, "holder": "train.ipynb"})
    admin.goto(f"{hub.url}{PAGES}/admin")
    admin.locator("tr.gpubroker-queued").first.wait_for(timeout=WAIT_MS)
    admin.screenshot(path=str(shots / "hub-admin.png"), full_page=True)
    mine = log_in(browser, hub, "ann")
    mine.goto(f"{hub.url}{PAGES}/")
    assert mine.locator("tr.gpubroker-lease").count() == 2
    assert mine.locator(".gpubroker-position").inner_text() == "1 of 1"
    mine.emulate_media(color_scheme="dark")  # the hub's dark look, as its pages pick it
    mine.reload()
    assert mine.evaluate("document.documentElement.dataset.bsTheme") == "dark"
    mine.screenshot(path=str(shots / "hub-my-gpus.png"), full_page=True)
    hub.stop_server("ann")


def test_the_admin_sets_a_time_limit_on_the_admin_page_and_the_next_request_gets_it(
    hub: Hub, browser: Any
) -> None:
    tokens = {name: hub.user(name) for name in ("ann", "admin")}
    admin = log_in(browser, hub, "admin")
    admin.goto(f"{hub.url}{PAGES}/admin")
    new = admin.locator("tr.gpubroker-limit-new")
    new.get_by_label("class, profile or group", exact=True).select_option("class")
    new.get_by_label("class, profile or group name").fill("interactive")
    new.get_by_label("new default time limit").fill("30min")
    new.get_by_label("new maximum time limit").fill("1h")
    new.get_by_role("button", name="Add").click()
    admin.get_by_text("The time limits of class interactive are set.").wait_for(timeout=WAIT_MS)
    row = admin.locator('tr[data-limit="class:interactive"]')
    assert row.get_by_label("maximum time limit of interactive").input_value() == "1h"

    slice_for = {**SLICE, "holder": "notebook.ipynb"}
    assert hub.ok(tokens["ann"], "POST", "requests", slice_for)["limit_s"] == 1800
    status, refused = hub.api(tokens["ann"], "POST", "requests", {**slice_for, "limit_s": 7200})
    assert status == 400
    assert refused["message"].endswith(
        "longer than the 1 h 00 min allowed for interactive requests"
    )

    # A typo is refused next to its field; then the admin raises the maximum.
    row.get_by_label("maximum time limit of interactive").fill("3 hours")
    row.get_by_role("button", name="Save").click()
    feedback = admin.locator('tr[data-limit="class:interactive"] .invalid-feedback')
    feedback.wait_for(timeout=WAIT_MS)
    assert feedback.inner_text().startswith("the maximum time limit must be a number of seconds")
    row.get_by_label("maximum time limit of interactive").fill("3h")
    row.get_by_role("button", name="Save").click()
    admin.get_by_text("The time limits of class interactive are set.").wait_for(timeout=WAIT_MS)
    assert (
        hub.ok(tokens["ann"], "POST", "requests", {**slice_for, "limit_s": 7200})["limit_s"] == 7200
    )
    audit = admin.locator("tr.gpubroker-audit")
    assert "default 30 min, maximum 3 h 00 min" in audit.last.inner_text()
