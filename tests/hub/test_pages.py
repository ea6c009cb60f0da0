"""The hub pages end to end: a real hub and proxy, the broker service and the GPU spawner
(``SimpleGPUBrokerSpawner``) on the simulated machine (one H100 in seven 1g.10gb slices),
driven as a browser drives them: logged in through the hub, real form posts with the
XSRF token the page carries."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
import requests
from bs4 import BeautifulSoup
from live_hub import Hub, wait_for

from hub_spawner.pages import usage_csv

pytestmark = pytest.mark.hub
SLICE = {"profile": "1g.10gb"}
PAGES = "/services/gpubroker"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory, proxy: None) -> Iterator[Hub]:
    running = Hub(
        tmp_path_factory.mktemp("hub"),
        spawner="hub_spawner.spawner.SimpleGPUBrokerSpawner",
        extra_config="c.SimpleGPUBrokerSpawner.gpu_wait_timeout = 600",
        lease_ttl=900,  # the holders' leases, never renewed, outlive the module
    )
    with running.running():
        yield running


def page(hub: Hub, s: requests.Session, path: str = "", status: int = 200) -> BeautifulSoup:
    r = s.get(f"{hub.url}{PAGES}/{path}", timeout=60)
    assert r.status_code == status, r.text
    return BeautifulSoup(r.text, "html.parser")


def xsrf(doc: BeautifulSoup) -> str:
    """The XSRF token the page's forms carry."""
    return str(doc.find("input", attrs={"name": "_xsrf"})["value"])


def post(
    hub: Hub, s: requests.Session, action: str, form: dict[str, str], token: str | None
) -> requests.Response:
    """A form post as the page's forms send it (``token``: its ``_xsrf``; None: none)."""
    data = dict(form) if token is None else {**form, "_xsrf": token}
    return s.post(f"{hub.url}{PAGES}/{action}", data=data, timeout=60, allow_redirects=True)


def error(r: requests.Response) -> str:
    return BeautifulSoup(r.text, "html.parser").find(id="gpubroker-error").get_text(" ", strip=True)


def waiting(hub: Hub, token: str) -> dict[str, int]:
    """A user's queued requests: id -> position."""
    mine = hub.ok(token, "GET", "requests")["requests"]
    return {r["id"]: r["position"] for r in mine if r["state"] == "queued"}


def spawn(hub: Hub, token: str, name: str) -> None:
    r = requests.post(
        f"{hub.url}/hub/api/users/{name}/server",
        json=SLICE,
        headers={"Authorization": f"token {token}"},
        timeout=60,
    )
    assert r.status_code in (201, 202), r.text


def quota(hub: Hub, admin: str, name: str) -> dict[str, Any] | None:
    quotas = hub.ok(admin, "GET", "quotas")["quotas"]
    return next((q for q in quotas if (q["kind"], q["name"]) == ("user", name)), None)


@pytest.fixture(scope="module")
def full(hub: Hub) -> Iterator[dict[str, str]]:
    """The machine full: bob, then alice, hold a slice each (so both have used GPUs), a
    filler the other five; then alice's and bob's GPU servers wait in the queue."""
    tokens = {name: hub.user(name) for name in ("alice", "bob", "filler", "admin")}
    for name in ("bob", "alice"):
        hub.ok(tokens[name], "POST", "requests", {**SLICE, "holder": "hold"})
    for _ in range(5):
        hub.ok(tokens["filler"], "POST", "requests", {**SLICE, "holder": "fill"})
    for name in ("alice", "bob"):
        spawn(hub, tokens[name], name)
        wait_for(f"{name}'s server to wait", lambda n=name: waiting(hub, tokens[n]), log=hub.log)
    try:
        yield tokens
    finally:
        for name in ("alice", "bob"):
            hub.stop_server(name)


def test_the_admin_lowers_a_share_on_the_admin_page_and_the_queue_reorders(
    hub: Hub, full: dict[str, str]
) -> None:
    positions = {name: next(iter(waiting(hub, full[name]).values())) for name in ("alice", "bob")}
    assert sorted(positions.values()) == [1, 2]
    first = min(positions, key=positions.__getitem__)
    second = next(n for n in positions if n != first)

    admin = hub.login("admin")
    doc = page(hub, admin, "admin")
    queued = [tr["data-user"] for tr in doc.select("tr.gpubroker-queued")]
    assert queued == [first, second]
    form = {"form_id": "quota-new", "kind": "user", "name": first, "share": "0.01"}
    r = post(hub, admin, "admin/quota", form, xsrf(doc))
    assert r.status_code == 200 and r.url.endswith(f"{PAGES}/admin"), r.text
    assert f"The quota of user {first} is set." in r.text

    def swapped() -> bool:
        now = {name: next(iter(waiting(hub, full[name]).values())) for name in positions}
        return now == {first: 2, second: 1}

    wait_for("the queue to reorder", swapped, log=hub.log)
    doc = page(hub, admin, "admin")
    assert [tr["data-user"] for tr in doc.select("tr.gpubroker-queued")] == [second, first]
    row = doc.select_one(f'tr[data-quota="user:{first}"]')
    assert row.find("input", attrs={"name": "share"})["value"] == "0.01"
    audit = [tr.get_text(" ", strip=True) for tr in doc.select("tr.gpubroker-audit")]
    assert any("admin set quota user:" + first in a and "share 0.01" in a for a in audit)

    # Each user's page shows their own requests, at their new positions, and no one else's.
    for name, position in ((first, 2), (second, 1)):
        mine = page(hub, hub.login(name))
        rows = mine.select("tr.gpubroker-request")
        assert {tr["data-request"] for tr in rows} == set(waiting(hub, full[name]))
        assert rows[0].select_one(".gpubroker-position").get_text(strip=True) == f"{position} of 2"
        assert "every 1g.10gb is in use" in rows[0].get_text(" ")
        assert f"{name}'s server" in rows[0].get_text(" ")  # who holds it, in words
        held = mine.select("tr.gpubroker-lease")
        assert len(held) == 1  # the slice each holds, not the filler's


def test_a_form_without_xsrf_or_with_bad_values_changes_nothing(
    hub: Hub, full: dict[str, str]
) -> None:
    admin = hub.login("admin")
    hub.ok(full["admin"], "PUT", "quotas/user/carol", {"share": 2.0})
    before = quota(hub, full["admin"], "carol")
    form = {"form_id": "quota-user-carol", "kind": "user", "name": "carol"}

    r = post(hub, admin, "admin/quota", {**form, "share": "5"}, None)
    assert r.status_code == 403 and "XSRF" in error(r)

    bad = {**form, "share": "lots", "max_gpus": "-1", "gpu_hours": "10", "period_s": ""}
    r = post(hub, admin, "admin/quota", bad, xsrf(page(hub, admin, "admin")))
    assert r.status_code == 400
    row = BeautifulSoup(r.text, "html.parser").select_one('tr[data-quota="user:carol"]')
    messages = {
        td.select_one("input, select")["name"]: td.select_one(".invalid-feedback").get_text()
        for td in row.find_all("td")
        if td.select_one(".invalid-feedback")
    }
    # named as the page names its columns, not by the API's field names
    assert messages["share"] == "Share must be a weight such as 1 or 2.5, not 'lots'"
    assert messages["max_gpus"] == (
        "Most at once must be GPU-equivalents such as 2, 0.5 or 1/7 (a 1g.10gb slice), or 0, "
        "not '-1'"
    )
    assert row.find("input", attrs={"name": "share"})["value"] == "lots"  # kept to fix
    assert quota(hub, full["admin"], "carol") == before

    budget = {**form, "share": "2", "gpu_hours": "10", "period_s": ""}
    r = post(hub, admin, "admin/quota", budget, xsrf(page(hub, admin, "admin")))
    assert r.status_code == 400
    assert error(r) == "A budget needs a period: choose one, or empty its GPU-hours"
    assert quota(hub, full["admin"], "carol") == before

    budget["period_s"] = "86400"
    r = post(hub, admin, "admin/quota", budget, xsrf(page(hub, admin, "admin")))
    assert r.status_code == 200
    assert quota(hub, full["admin"], "carol") == {
        **before,
        "gpu_hours": 10.0,
        "period_s": 86400.0,
        "spent_gpu_hours": 0.0,
    }

    # the help's own example: a 1g.10gb slice is 1/7, typed so and shown so
    r = post(
        hub, admin, "admin/quota", {**budget, "max_gpus": "1/7"}, xsrf(page(hub, admin, "admin"))
    )
    assert r.status_code == 200, error(r)
    assert quota(hub, full["admin"], "carol")["max_gpus"] == pytest.approx(1 / 7)
    row = page(hub, admin, "admin").select_one('tr[data-quota="user:carol"]')
    assert row.find("input", attrs={"name": "max_gpus"})["value"] == "1/7"


def test_a_non_admin_is_refused_the_admin_page_its_forms_and_its_api(
    hub: Hub, full: dict[str, str]
) -> None:
    bob = hub.login("bob")
    r = bob.get(f"{hub.url}{PAGES}/admin", timeout=60)
    assert r.status_code == 403 and "custom:gpubroker:admin" in error(r)
    assert bob.get(f"{hub.url}{PAGES}/admin/usage.csv", timeout=60).status_code == 403
    token = xsrf(page(hub, bob))  # his own page's token: valid, but he is no admin
    form = {"form_id": "quota-new", "kind": "user", "name": "bob", "share": "100"}
    r = post(hub, bob, "admin/quota", form, token)
    assert r.status_code == 403 and "custom:gpubroker:admin" in error(r)
    status, data = hub.api(full["bob"], "PUT", "quotas/user/bob", {"share": 100})
    assert status == 403 and "only admins change quotas" in data["message"]
    assert quota(hub, full["admin"], "bob") is None

    # Nor can he cancel someone else's request from his page.
    theirs = next(iter(waiting(hub, full["alice"])))
    r = post(hub, bob, "my/cancel", {"request_id": theirs}, token)
    assert r.status_code == 403 and "belongs to another user" in error(r)
    assert theirs in waiting(hub, full["alice"])


def test_the_admin_page_shows_devices_usage_and_acts_on_queue_and_devices(
    hub: Hub, full: dict[str, str]
) -> None:
    admin = hub.login("admin")
    doc = page(hub, admin, "admin")
    slices = doc.select("tr.gpubroker-device")
    assert len(slices) == 7
    holders = sorted(tr.find_all("td")[1].get_text(strip=True) for tr in slices)
    assert holders == ["alice", "bob", *["filler"] * 5]
    said = {tr.select_one(".gpubroker-idle-reclaim").get_text(strip=True) for tr in slices}
    assert said == {
        "Idle kernels here are shut down: a MIG slice cannot be suspended: NVIDIA's "
        "checkpoint does not support MIG."
    }
    for by in ("user", "group", "profile", "day"):
        assert doc.select_one(f"#usage-{by} svg[role=img]") is not None
    assert "filler" in doc.select_one("#usage-user svg").get_text(" ")
    assert doc.select_one("#alerts") is not None

    r = admin.get(f"{hub.url}{PAGES}/admin?days=many", timeout=60)
    assert r.status_code == 400 and "'days' must be an integer from 1 to 3660" in error(r)

    csv = admin.get(f"{hub.url}{PAGES}/admin/usage.csv", timeout=60)
    assert csv.headers["Content-Type"].startswith("text/csv")
    lines = csv.text.splitlines()
    assert lines[0] == "by,key,gpu_hours"
    assert any(line.startswith("user,filler,") for line in lines)
    assert any(line.startswith("profile,1g.10gb,") for line in lines)

    alices = next(iter(waiting(hub, full["alice"])))
    r = post(hub, admin, "admin/class", {"request_id": alices, "job_class": "batch"}, xsrf(doc))
    assert r.status_code == 200 and "is now batch" in r.text
    assert hub.ok(full["alice"], "GET", f"requests/{alices}")["job_class"] == "batch"

    uuid = slices[0]["data-uuid"]
    r = post(hub, admin, "admin/drain", {"uuid": uuid, "reason": "fan noise"}, xsrf(doc))
    assert r.status_code == 200 and "takes no new grants" in r.text
    row = BeautifulSoup(r.text, "html.parser").select_one(f'tr[data-uuid="{uuid}"]')
    assert "drained" in row.get_text(" ") and "fan noise" in row.get_text(" ")
    r = post(hub, admin, "admin/undrain", {"uuid": uuid}, xsrf(doc))
    assert r.status_code == 200 and "takes grants again" in r.text
    audit = [
        tr.get_text(" ", strip=True)
        for tr in page(hub, admin, "admin").select("tr.gpubroker-audit")
    ]
    assert any(
        "set class" in a and "alice's request; was interactive; now batch" in a for a in audit
    )
    assert any(a.endswith("drain " + uuid + " reason: fan noise") for a in audit), audit
    assert not any("{" in a for a in audit), audit  # words, not the stored JSON

    # A user cancels their own waiting server's request from their page.
    bob = hub.login("bob")
    bobs = next(iter(waiting(hub, full["bob"])))
    r = post(hub, bob, "my/cancel", {"request_id": bobs}, xsrf(page(hub, bob)))
    assert r.status_code == 200 and "cancelled" in r.text
    assert bobs not in waiting(hub, full["bob"])


HUB_GROUPS = ("ML Team", "/staff", "org:team", "<script>alert(1)</script>")
"""Group names as identity providers sync them (Keycloak paths, ``org:team``), and one
that would run as HTML if a page showed it unescaped."""


def test_a_user_in_groups_with_any_hub_name_uses_the_broker_and_pages_show_them_as_text(
    hub: Hub, full: dict[str, str]
) -> None:
    name = "🦊 <img src=x onerror=alert(1)>"  # any name the hub takes: no '/', lowercase
    token = hub.user(name)
    hub.hub_api("POST", "groups", {"groups": list(HUB_GROUPS)}, expect=None)
    for group in HUB_GROUPS:
        hub.hub_api("POST", f"groups/{quote(group, safe='')}/users", {"users": [name]})
    admin = hub.login("admin")
    try:
        # the service copies her hub groups into the request; the first is charged
        mine = hub.ok(token, "POST", "requests", {**SLICE, "holder": "nb"})
        assert (mine["user"], mine["groups"][0]) == (name, HUB_GROUPS[0])
        assert set(mine["groups"]) == set(HUB_GROUPS)
        kernel = hub.ok(token, "POST", "tokens", {"kernel_id": "k-fox"})
        assert kernel["user"] == name
        assert hub.api(kernel["token"], "GET", "me", kernel=True)[1]["user"] == name
        hub.ok(token, "DELETE", "tokens/k-fox")
        # and her GPU server's start, from the spawn API, waits in the queue as hers
        spawn(hub, token, quote(name, safe=""))
        wait_for("her server's request", lambda: len(waiting(hub, token)) == 2, log=hub.log)

        # an admin gives a group with a '/' a quota, on the page and through the API
        doc = page(hub, admin, "admin")
        form = {"form_id": "quota-new", "kind": "group", "name": "/staff", "max_gpus": "0.5"}
        r = post(hub, admin, "admin/quota", form, xsrf(doc))
        assert r.status_code == 200 and "The quota of group /staff is set." in r.text, r.text
        path = f"quotas/group/{quote('/staff', safe='')}"
        assert hub.ok(full["admin"], "PUT", path, {"max_gpus": 1})["name"] == "/staff"
        group = f"quotas/group/{quote(HUB_GROUPS[3], safe='')}"
        hub.ok(full["admin"], "PUT", group, {"share": 2})

        # the admin page shows every name as text: no tag of theirs reaches the page
        r = admin.get(f"{hub.url}{PAGES}/admin", timeout=60)
        assert "<script>alert(1)</script>" not in r.text and "<img src=x" not in r.text
        doc = BeautifulSoup(r.text, "html.parser")
        assert name in [tr["data-user"] for tr in doc.select("tr.gpubroker-queued")]
        shown = {tr["data-quota"] for tr in doc.select("tr.gpubroker-quota")}
        assert {"group:/staff", f"group:{HUB_GROUPS[3]}"} <= shown
        staff = doc.select_one('tr[data-quota="group:/staff"]')
        assert staff.find("input", attrs={"name": "max_gpus"})["value"] == "1"
    finally:
        hub.stop_server(quote(name, safe=""))
        for r in hub.ok(token, "GET", "requests")["requests"]:
            hub.api(token, "DELETE", f"requests/{r['id']}")
        for group in ("/staff", HUB_GROUPS[3]):
            hub.api(full["admin"], "DELETE", f"quotas/group/{quote(group, safe='')}")


def test_the_usage_csv_shows_a_name_a_spreadsheet_would_run_as_text() -> None:
    usage = {"user": {'=HYPERLINK("http://x")': 1.5, "alice": 2.0}, "group": {"@staff": 1}}
    assert usage_csv(usage).splitlines() == [
        "by,key,gpu_hours",
        'user,"\'=HYPERLINK(""http://x"")",1.500000',
        "user,alice,2.000000",
        "group,'@staff,1.000000",
    ]


BIDI = re.compile("[\u202a-\u202e\u2066-\u2069]")
"""The controls that make text read in another direction."""


def reads_reversed_anywhere(doc: BeautifulSoup) -> list[str]:
    """Every text and attribute of the page that holds a control reversing text."""
    texts = [str(t) for t in doc.find_all(string=True)]
    values = [str(v) for tag in doc.find_all(True) for v in tag.attrs.values()]
    return [t for t in texts + values if BIDI.search(t)]


def test_a_hub_name_holding_a_control_that_reverses_text_never_reads_reversed(
    hub: Hub, full: dict[str, str]
) -> None:
    """The hub takes "ann\\u202egro" (it reads as "annorg"): the broker refuses it as it
    refuses control characters, in a user's name, a group's and a quota the admin types,
    with the name escaped; the admin page and the audit log never show it reversed."""
    name = "ann\u202egro"
    refusal = (
        "user name 'ann\\u202egro' holds '\\u202e': a name may hold any character but "
        "control characters and line breaks"
    )
    token = hub.user(name)
    status, body = hub.api(token, "GET", "me")
    assert (status, body["message"]) == (403, f"the GPU broker cannot serve this caller: {refusal}")
    gus = hub.user("gus")
    hub.hub_api("POST", "groups/lab\u2067x", {"users": ["gus"]}, expect=None)
    hub.hub_api("POST", "groups/lab\u2067x/users", {"users": ["gus"]})
    status, body = hub.api(gus, "POST", "requests", SLICE)
    assert status == 403 and "group name 'lab\\u2067x' holds '\\u2067'" in body["message"]

    admin = hub.login("admin")
    form = {"form_id": "quota-new", "kind": "user", "name": name, "share": "2"}
    r = post(hub, admin, "admin/quota", form, xsrf(page(hub, admin, "admin")))
    assert r.status_code == 400 and error(r) == refusal
    doc = BeautifulSoup(r.text, "html.parser")
    assert reads_reversed_anywhere(doc) == []  # the name it re-offers to fix, escaped too
    assert doc.find("input", attrs={"name": "name", "form": "quota-new"})["value"] == (
        "ann\\u202egro"
    )
    assert quota(hub, full["admin"], name) is None
    assert not [a for a in hub.ok(full["admin"], "GET", "audit")["audit"] if name in str(a)]
    assert reads_reversed_anywhere(page(hub, admin, "admin")) == []
