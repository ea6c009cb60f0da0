"""A GPU server's time limit end to end: a real hub and proxy, the broker service and the
GPU spawner (``SimpleGPUBrokerSpawner``) on the simulated machine (one H100 in seven
1g.10gb slices). The spawn form's "For N hours" becomes the server's time limit; a server
near its limit is warned on the hub's home page and on "My GPUs", whose Extend gives it an
hour more as its user, and only its user.

The broker warns 3595 s before a limit ends, so a one-hour limit is warned a few seconds
after its grant, and one extended by an hour is not; interactive limits are at most 3 h."""

from __future__ import annotations

import html
from datetime import datetime
from typing import Any

import pytest
import requests
from bs4 import BeautifulSoup
from live_hub import Hub, wait_for
from test_pages import PAGES, error, page, post, xsrf
from test_spawner import GPU_HUB, SLICE, login, ok, spawn

from hub_spawner.environment import LEASE_ENV

pytestmark = pytest.mark.hub
WARNING_S = 3595.0


@pytest.fixture(scope="module")
def hub_options() -> dict[str, Any]:
    return {
        **GPU_HUB,
        "extra_config": "c.SimpleGPUBrokerSpawner.gpu_wait_timeout = 600\n"
        "c.Spawner.poll_interval = 1\n",
        "max_time_limit": {"interactive": "3h"},
        "time_limit_warning": WARNING_S,
    }


def ends_at(lease: dict[str, Any]) -> float:
    return datetime.fromisoformat(lease["ends_at"]).timestamp()


def form_post(hub: Hub, s: requests.Session, hours: str) -> requests.Response:
    choice = {"gpu_kind": "profile", "profile": "1g.10gb", "job_class": "interactive"}
    data = {**choice, "hours": hours, "_xsrf": s.cookies.get("_xsrf", path="/hub/")}
    return s.post(f"{hub.url}/hub/spawn", data=data, timeout=60)


def test_the_forms_hours_become_the_servers_limit_its_warning_and_extend_on_the_hubs_pages(
    hub: Hub,
) -> None:
    fay, bob = hub.user("fay"), hub.user("bob")
    browser = login(hub, "fay")
    try:
        form = browser.get(f"{hub.url}/hub/spawn", timeout=60).text
        assert "hours (you can extend it)" in form and "interactive: at most 3 h 00 min" in form
        # bad hours and a limit above the maximum: one sentence on the form, nothing starts
        refused = html.unescape(form_post(hub, browser, "soon").text)
        assert "Cannot start the server: For how many hours: give a number of hours" in refused
        refused = html.unescape(form_post(hub, browser, "4").text)
        assert (
            "the time limit of 4 h 00 min is longer than the 3 h 00 min allowed for "
            "interactive requests" in refused
        )
        assert hub.hub_api("GET", "users/fay")["servers"] == {}
        assert not ok(hub, fay, "GET", "requests")["requests"]

        assert form_post(hub, browser, "1").ok
        env = hub.ready_server_env("fay")
        lease_id = env[LEASE_ENV]
        lease = ok(hub, fay, "GET", f"leases/{lease_id}")
        assert lease["limit_s"] == 3600
        assert ok(hub, fay, "GET", f"requests/{lease['request_id']}")["limit_s"] == 3600

        # warned: the home page says when its time ends, and its Extend opens My GPUs there
        home = wait_for(
            "the time-limit warning on the home page",
            lambda: "ends at" in (t := browser.get(f"{hub.url}/hub/home").text) and t,
            log=hub.log,
        )
        shown = BeautifulSoup(home, "html.parser").select_one(".announcement")
        assert shown is not None
        assert f"Your GPU server's time on {lease['devices'][0]} ends at" in shown.get_text()
        extend = shown.select_one("a.gpubroker-extend")
        assert extend is not None and extend.get_text() == "Extend"
        assert extend["href"] == f"{PAGES}/?extend={lease_id}#lease-{lease_id}"
        mine = page(hub, browser, str(extend["href"]).removeprefix(f"{PAGES}/"))
        alert = mine.find(id=f"lease-{lease_id}")
        assert alert is not None and "unless you extend it" in alert.get_text()

        # another user cannot extend it, through the page or the API
        other = hub.login("bob")
        ok(hub, bob, "POST", "requests", {**SLICE, "holder": "hold"})  # his page's forms
        theirs = page(hub, other)
        r = post(hub, other, "my/extend", {"lease_id": lease_id}, xsrf(theirs))
        assert r.status_code == 403
        assert error(r) == f"lease {lease_id!r} belongs to another user"
        status, body = hub.api(bob, "POST", f"leases/{lease_id}/extend", {"seconds": 3600})
        assert status == 403 and body["message"] == error(r)
        assert ends_at(ok(hub, fay, "GET", f"leases/{lease_id}")) == ends_at(lease)

        # fay's Extend: an hour more, the warning gone from the hub's pages
        r = post(hub, browser, "my/extend", {"lease_id": lease_id}, xsrf(mine))
        assert r.status_code == 200 and "Extended: your time on" in r.text
        longer = ok(hub, fay, "GET", f"leases/{lease_id}")
        assert ends_at(longer) == pytest.approx(ends_at(lease) + 3600)
        wait_for(
            "the warning withdrawn",
            lambda: "ends at" not in browser.get(f"{hub.url}/hub/home").text,
            log=hub.log,
        )
        # past the class's 3 hours: refused with the broker's sentence, nothing changed
        mine = page(hub, browser)
        assert post(hub, browser, "my/extend", {"lease_id": lease_id}, xsrf(mine)).ok
        mine = page(hub, browser)
        r = post(hub, browser, "my/extend", {"lease_id": lease_id}, xsrf(mine))
        assert r.status_code == 409
        assert error(r) == (
            "4 h 00 min in all would be longer than the 3 h 00 min allowed for interactive requests"
        )
        assert ends_at(ok(hub, fay, "GET", f"leases/{lease_id}")) == pytest.approx(
            ends_at(lease) + 7200
        )
    finally:
        hub.stop_server("fay")


def test_a_limit_given_as_a_server_option_through_the_rest_api_is_checked(hub: Hub) -> None:
    ann = hub.user("ann")
    r = spawn(hub, ann, "ann", {**SLICE, "limit_s": "2h"})
    assert r.status_code == 400 and "limit_s (the time limit) must be seconds" in r.text
    r = spawn(hub, ann, "ann", {**SLICE, "limit_s": 5 * 3600})
    assert r.status_code == 400
    assert "the time limit of 5 h 00 min is longer than the 3 h 00 min" in r.json()["message"]
    assert hub.hub_api("GET", "users/ann")["servers"] == {}


def test_an_extension_by_a_number_no_hold_has_is_a_400_through_the_hub(hub: Hub) -> None:
    """A 400-digit integer was a 500 through the hub as embedded, and 1e308 a refusal
    counting 300-digit hours: both are the same 400 sentence, and the lease is as it was."""
    gil = hub.user("gil")
    lease = ok(hub, gil, "POST", "requests", {**SLICE, "holder": "nb", "limit_s": 3600})["lease"]
    for seconds, shown in ((10**400, "1e+400"), (1e308, "1e+308"), (5e-324, "5e-324")):
        status, body = hub.api(gil, "POST", f"leases/{lease['id']}/extend", {"seconds": seconds})
        assert (status, body["error"]) == (400, "invalid_request"), body
        assert body["message"] == (
            f"an extension must be seconds, at least 0.001 and at most a year, not {shown}"
        )
    assert ok(hub, gil, "GET", f"leases/{lease['id']}")["ends_at"] == lease["ends_at"]
    ok(hub, gil, "DELETE", f"leases/{lease['id']}")
