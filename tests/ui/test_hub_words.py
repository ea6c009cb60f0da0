"""What a hub user reads, in Chromium on a real hub (one H100 in seven 1g.10gb slices):
a member of a group whose quota is full sees the group's share and cap on the spawn form,
which says a slice waits for the group, not that it "starts at once"; the spawn page says
why the server waits, naming the group; My GPUs says
the same and shows the group's quota; an admin's cancel reads "cancelled by admin", said
once. A hub whose broker cannot run shows GPU admin's reason as a page, not a bare
"Forbidden".

Screenshots go to ``$GPUBROKER_SCREENSHOTS`` (default: the test's temporary dir)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from live_hub import Hub
from test_hub_pages import PAGES, SLICE, WAIT_MS, log_in

pytestmark = [pytest.mark.slow, pytest.mark.hub]  # a real hub and a browser

GROUP = "ML Team"
HELD_BACK = (
    "group ML Team's quota allows one 1g.10gb slice at a time and its members hold one "
    "1g.10gb slice: it starts once they give one back"
)


def test_a_groups_quota_is_shown_to_its_member_and_named_as_why_her_server_waits(
    hub: Hub, browser: Any, shots: Path
) -> None:
    tokens = {name: hub.user(name) for name in ("ann", "filler", "admin")}
    hub.hub_api("POST", f"groups/{quote(GROUP)}", expect=None)
    hub.hub_api("POST", f"groups/{quote(GROUP)}/users", {"users": ["ann"]})
    hub.ok(tokens["admin"], "PUT", f"quotas/group/{quote(GROUP)}", {"max_gpus": 1 / 7, "share": 2})
    hub.ok(
        tokens["ann"], "POST", "requests", {**SLICE, "holder": "notebook.ipynb"}
    )  # the group's one

    ann = log_in(browser, hub, "ann")
    ann.goto(f"{hub.url}/hub/spawn")
    form = ann.locator("fieldset.gpubroker-options")
    form.wait_for(timeout=WAIT_MS)
    said, slices = form.inner_text(), form.locator("select[name=profile]").inner_text()
    assert "starts at once" not in slices
    assert (
        "waits: group ML Team's members hold what its quota allows (one 1g.10gb slice at a time)"
    ) in slices
    assert (
        "your group ML Team: share 2; its quota allows one 1g.10gb slice at a time and its "
        "members hold one 1g.10gb slice now"
    ) in said
    ann.check("#gpu-profile")
    ann.screenshot(path=str(shots / "hub-form-group-quota.png"), full_page=True)
    ann.get_by_role("button", name="Start").click()
    message = ann.locator("#progress-message")
    message.get_by_text(HELD_BACK, exact=False).wait_for(timeout=WAIT_MS)
    assert "every 1g.10gb is in use" not in message.inner_text()

    ann.locator("#progress-details summary").click()  # JupyterHub's event log
    log = [x for x in ann.locator("#progress-log .progress-log-event").all_inner_texts() if x]
    assert [x for x in log if x.startswith("Waiting for")] == [message.inner_text()]
    ann.screenshot(path=str(shots / "hub-spawn-group-quota.png"), full_page=True)

    mine = log_in(browser, hub, "ann")
    mine.goto(f"{hub.url}{PAGES}/")
    cells = mine.locator("tr.gpubroker-request td")
    assert cells.nth(4).inner_text() == HELD_BACK  # why it waits
    assert cells.nth(3).inner_text() == "when the quota allows it"  # not "any moment (by ..)"
    quota = mine.locator("#gpubroker-quota").inner_text()
    assert "My share: the default (1)." in quota  # her own; the group's below
    group = mine.locator(".gpubroker-group-quota").inner_text()
    assert group == (
        "Your group ML Team: share 2; its quota allows one 1g.10gb slice at a time and its "
        "members hold one 1g.10gb slice now."
    )
    mine.screenshot(path=str(shots / "hub-my-gpus-group-quota.png"), full_page=True)

    # An admin cancels it: the spawn page says so once, not "cancelled: cancelled by".
    server = next(
        r
        for r in hub.ok(tokens["admin"], "GET", "requests")["requests"]
        if r["holder"] == "server:ann"
    )
    hub.ok(tokens["admin"], "DELETE", f"requests/{server['id']}", {"reason": "maintenance"})
    ended = ann.get_by_text("request cancelled by admin: maintenance", exact=False)
    ended.first.wait_for(timeout=WAIT_MS)
    assert "cancelled: cancelled" not in ann.content()
    ann.screenshot(path=str(shots / "hub-spawn-cancelled.png"), full_page=True)


def test_gpu_admin_of_a_broker_that_cannot_run_shows_why_not_forbidden(
    tmp_path: Path, proxy: None, browser: Any, shots: Path
) -> None:
    """It answered a bare {"error": "http_403", "message": "Forbidden"}."""
    with Hub(tmp_path, simulate="dgx-h100-migg").running(broker_runs=False) as broken:
        broken.user("admin")
        admin = log_in(browser, broken, "admin")
        admin.goto(f"{broken.url}{PAGES}/admin")
        error = admin.locator("#gpubroker-error")
        error.wait_for(timeout=WAIT_MS)
        assert error.inner_text().startswith(
            "The GPU broker cannot run now: unknown simulated topology 'dgx-h100-migg'"
        )
        assert "http_403" not in admin.content()
        admin.screenshot(path=str(shots / "hub-admin-broker-cannot-run.png"), full_page=True)
