"""The broker as a JupyterHub service, end to end: a real hub and proxy, the service the
hub starts (and its supervisor restarts), users with hub API tokens and a browser login, on the
example's simulated machine (one H100 in seven 1g.10gb slices here)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from live_hub import API, Hub, wait_for

from jupyter_gpubroker.client import BrokerClient

pytestmark = pytest.mark.hub
SLICE = {"profile": "1g.10gb"}


def ok(hub: Hub, token: str, method: str, path: str, body: Any = None, **kw: Any) -> Any:
    status, data = hub.api(token, method, path, body, **kw)
    assert status in (200, 201, 204), f"{method} {path}: {status} {data}"
    return data


def release_all(hub: Hub, *tokens: str) -> None:
    """Give back what the test holds and withdraw what it queued."""
    for token in tokens:
        for lease in ok(hub, token, "GET", "leases")["leases"]:
            ok(hub, token, "DELETE", f"leases/{lease['id']}")
        for r in ok(hub, token, "GET", "requests")["requests"]:
            if r["state"] == "queued":
                ok(hub, token, "DELETE", f"requests/{r['id']}")


def test_a_users_slice_is_theirs_and_nobody_else_sees_or_touches_it(hub: Hub) -> None:
    alice, bob, admin = hub.user("alice"), hub.user("bob"), hub.user("admin")
    hub.hub_api("POST", "groups/lab", expect=201)
    hub.hub_api("POST", "groups/lab/users", {"users": ["alice"]})
    try:
        # alice's kernel takes a slice with its kernel token: charged to alice, in her hub group
        kernel = ok(hub, alice, "POST", "tokens", {"kernel_id": "k-alice"})
        assert kernel["user"] == "alice"
        mine = ok(hub, kernel["token"], "POST", "requests", SLICE, kernel=True)
        assert (mine["state"], mine["user"], mine["groups"]) == ("granted", "alice", ["lab"])
        assert mine["lease"]["user"] == "alice" and mine["lease"]["group"] == "lab"
        for _ in range(6):  # the rest of the GPU
            ok(hub, alice, "POST", "requests", {**SLICE, "holder": "fill"})

        # bob waits, with his own kernel token
        bob_kernel = ok(hub, bob, "POST", "tokens", {"kernel_id": "k-bob"})["token"]
        his = ok(hub, bob_kernel, "POST", "requests", SLICE, kernel=True)
        assert (his["state"], his["user"], his["position"]) == ("queued", "bob", 1)
        hers = mine["lease"]["id"]

        # neither sees nor touches the other's request, lease or token, by any endpoint
        for token, kw, other in (
            (alice, {}, his["id"]),
            (kernel["token"], {"kernel": True}, his["id"]),
            (bob, {}, mine["id"]),
        ):
            for method, path in (
                ("GET", f"requests/{other}"),
                ("DELETE", f"requests/{other}"),
                ("POST", f"requests/{other}/renew"),
            ):
                assert hub.api(token, method, path, **kw)[0] == 403, (method, path)
        for method, path in (
            ("GET", f"leases/{hers}"),
            ("DELETE", f"leases/{hers}"),
            ("POST", f"leases/{hers}/renew"),
        ):
            assert hub.api(bob, method, path)[0] == 403, (method, path)
        assert hub.api(alice, "DELETE", "tokens/k-bob")[0] == 204  # only her own for k-bob
        assert ok(hub, bob_kernel, "GET", "me", kernel=True)["kernel_id"] == "k-bob"
        for path in ("requests", "leases", "queue", "overview", "devices", "usage", "quotas"):
            seen = json.dumps(ok(hub, alice, "GET", path))
            assert his["id"] not in seen and "k-bob" not in seen and bob_kernel not in seen
            seen = json.dumps(ok(hub, bob, "GET", path))
            assert mine["id"] not in seen and hers not in seen and "k-alice" not in seen

        # only the admin (custom:gpubroker:admin) sees everyone's and changes quotas
        quota = {"max_gpus": 1}
        status, refused = hub.api(bob, "PUT", "quotas/user/bob", quota)
        assert (status, refused["error"]) == (403, "forbidden")
        assert ok(hub, admin, "GET", "me") == {
            "user": "admin",
            "groups": [],
            "admin": True,
            "kernel_id": None,
        }
        assert ok(hub, admin, "PUT", "quotas/user/bob", quota)["max_gpus"] == 1
        status, refused = hub.api(bob, "GET", "alerts")  # and sees the health alerts
        assert (status, refused["error"]) == (403, "forbidden")
        assert refused["message"] == "only admins see health alerts (bob is not one)"
        assert ok(hub, admin, "GET", "alerts") == {"active": [], "history": [], "next_before": None}
        status, refused = hub.api(bob, "GET", "forecast")  # and the demand forecast
        assert (status, refused["error"]) == (403, "forbidden")
        assert not ok(hub, admin, "GET", "forecast")["ready"]  # minutes of history only
        status, refused = hub.api(bob, "POST", "whatif", {"gpus": 1})  # and what-if replays
        assert (status, refused["message"]) == (
            403,
            "only admins run what-if replays (bob is not one)",
        )
        replayed = ok(hub, admin, "POST", "whatif", {"gpus": 1})  # what they held till now
        assert replayed["what_if"]["requests"] == replayed["recorded"]["requests"] >= 2
        everyone = {r["id"] for r in ok(hub, admin, "GET", "requests")["requests"]}
        assert {mine["id"], his["id"]} <= everyone
    finally:
        release_all(hub, alice, bob)
        hub.api(admin, "DELETE", "quotas/user/bob")


def test_the_service_says_which_scope_a_caller_lacks(hub: Hub) -> None:
    no_use = hub.user("carol", scopes=["access:services!service=gpubroker"])
    status, data = hub.api(no_use, "GET", "me")
    assert status == 403 and "custom:gpubroker:use" in data["message"]
    no_access = hub.user("carol", scopes=["read:users:name!user"])
    status, data = hub.api(no_access, "GET", "me")
    assert status == 403 and "access:services!service=gpubroker" in data["message"]
    for r in (
        requests.get(f"{hub.api_url}/me", timeout=30),
        requests.post(f"{hub.api_url}/requests", json=SLICE, timeout=30),
    ):
        assert r.status_code == 403 and "hub API token" in r.json()["message"]
    status, data = hub.api("gpb_not-a-token", "GET", "me", kernel=True)
    assert status == 403 and "token" in data["message"]
    # at a terminal, with no token: the one the hub needs is named
    bare = {k: v for k, v in os.environ.items() if "TOKEN" not in k}
    cli = [sys.executable, "-m", "jupyter_gpubroker.cli", "queue", "--url", hub.api_url]
    done = subprocess.run(cli, env=bare, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "$JUPYTERHUB_API_TOKEN" in done.stderr, done.stderr


def test_a_browser_logs_in_through_the_hub_and_needs_xsrf_to_change_anything(hub: Hub) -> None:
    s = hub.login("dave")
    assert "Signed in as dave" in s.get(f"{hub.url}/services/gpubroker/", timeout=30).text
    assert s.get(f"{hub.api_url}/me", timeout=30).json()["user"] == "dave"

    refused = s.post(f"{hub.api_url}/requests", json=SLICE, timeout=30)
    assert refused.status_code == 403 and "X-XSRFToken" in refused.json()["message"]
    xsrf = s.cookies.get("_xsrf", path="/services/gpubroker/")
    assert xsrf
    taken = s.post(f"{hub.api_url}/requests", json=SLICE, headers={"X-XSRFToken": xsrf}, timeout=30)
    assert taken.status_code == 201 and taken.json()["user"] == "dave"
    lease = taken.json()["lease"]["id"]
    gone = s.delete(f"{hub.api_url}/leases/{lease}", headers={"X-XSRFToken": xsrf}, timeout=30)
    assert gone.status_code == 200


def test_a_killed_service_comes_back_with_its_leases_and_kernel_tokens(hub: Hub) -> None:
    erin, frank = hub.user("erin"), hub.user("frank")
    token = ok(hub, erin, "POST", "tokens", {"kernel_id": "k-erin"})["token"]
    try:
        held = ok(hub, token, "POST", "requests", SLICE, kernel=True)["lease"]
        for _ in range(6):
            ok(hub, erin, "POST", "requests", {**SLICE, "holder": "fill"})
        waiting = ok(hub, frank, "POST", "requests", {**SLICE, "holder": "cli"})
        leases = {x["id"] for x in ok(hub, erin, "GET", "leases")["leases"]}
        assert len(leases) == 7 and waiting["state"] == "queued"

        hub.kill_service()

        assert {x["id"] for x in ok(hub, erin, "GET", "leases")["leases"]} == leases
        assert ok(hub, token, "GET", "me", kernel=True)["kernel_id"] == "k-erin"
        renewed = ok(hub, token, "POST", f"leases/{held['id']}/renew", kernel=True)
        assert renewed["state"] == "active" and renewed["expires_at"] > held["expires_at"]
        assert ok(hub, frank, "GET", f"requests/{waiting['id']}")["state"] == "queued"
    finally:
        release_all(hub, erin, frank)


async def test_a_killed_service_answers_through_the_proxy_within_5_s(hub: Hub) -> None:
    """SIGKILL the process that holds the state file: its supervisor starts it again at
    once, on the socket it keeps open, so calls made while it starts wait instead of
    failing, through the proxy: a bare fetch (a page, the panel's first try) and a
    client's submit, neither of them retried."""
    token = hub.user("kim")
    client = BrokerClient(hub.api_url, token=token, retry_for=0)
    supervisor = hub.supervisor_pid()
    for _ in range(2):
        killed = hub.service_pid()
        assert killed is not None
        os.kill(killed, signal.SIGKILL)
        at = time.monotonic()
        gone = Path(f"/proc/{killed}")
        await asyncio.to_thread(
            wait_for, "the kill", lambda p=gone: not p.exists(), interval_s=0.01
        )
        assert hub.service_pid() is None  # no broker runs: the calls below wait for one
        bare = asyncio.to_thread(
            requests.get, f"{hub.api_url}/me", headers={"Authorization": f"token {token}"}
        )
        me, taken = await asyncio.gather(bare, client.submit(**SLICE, holder="crash"))
        took = time.monotonic() - at
        try:
            assert me.status_code == 200 and me.json()["user"] == "kim"
            assert taken["state"] == "granted"
            assert took <= 5.0, f"answered {took:.1f} s after the kill"
        finally:
            await client.release(taken["lease"]["id"])
    assert hub.supervisor_pid() == supervisor  # the hub had nothing to start again


async def test_an_event_stream_that_reconnects_with_last_event_id_misses_nothing(
    hub: Hub,
) -> None:
    grace = hub.user("grace")
    client = BrokerClient(hub.api_url, token=grace)
    live: list[dict[str, Any]] = []  # a stream open the whole time: what happened

    async def follow() -> None:
        async with contextlib.aclosing(client.events()) as events:
            async for message in events:
                live.append(message)

    watching = asyncio.ensure_future(follow())
    try:
        async with contextlib.aclosing(client.events()) as events:
            hello = await anext(events)  # then the client goes away
        assert hello["type"] == "hello"
        await asyncio.to_thread(wait_for, "the live stream", lambda: live)
        r = await client.submit(**SLICE, holder="sse")
        await client.release(r["lease"]["id"])
        r = await client.submit(**SLICE, holder="sse")
        await client.release(r["lease"]["id"])
        ended = await asyncio.to_thread(
            wait_for, "the last release", lambda: sum(m["type"] == "released" for m in live) >= 2
        )
        assert ended

        resumed: list[dict[str, Any]] = []
        async with contextlib.aclosing(client.events(hello["id"])) as events:
            async for message in events:
                resumed.append(message)
                if message["type"] == "positions":  # what follows the missed events
                    break
        # what a front needs of it: each request in its latest state, in order
        missed = [(m["id"], m["type"]) for m in resumed[:-1]]
        latest: dict[str, tuple[int, str]] = {}
        for m in live:
            if m["id"] > hello["id"] and m["data"].get("request_id"):
                latest.pop(m["data"]["request_id"], None)
                latest[m["data"]["request_id"]] = (m["id"], m["type"])
        assert missed == list(latest.values()) and len(missed) == 2
        assert all(m["data"]["request"]["state"] == "released" for m in resumed[:-1])
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching


def test_every_documented_operation_is_served_under_the_service_prefix(hub: Hub) -> None:
    """The service serves the server's route table: whatever handlers() lists."""
    doc = yaml.safe_load(
        (Path(__file__).parents[2] / "jupyter_gpubroker" / "api" / "openapi.yaml").read_text()
    )
    admin = hub.user("admin")
    for template, item in doc["paths"].items():
        if template == "/events":  # a stream: the resume test reads it
            continue
        path = re.sub(r"\{([^}]+)\}", lambda m: "user" if m.group(1) == "kind" else "x1", template)
        for method in set(item) & {"get", "put", "post", "delete", "patch"}:
            status, data = hub.api(admin, method.upper(), path.lstrip("/"))
            unrouted = status in (404, 405) and "API path" in str(data) or status == 405
            assert not unrouted and status < 500, (method, template, status, data)
    status, data = hub.api(admin, "GET", "nowhere")
    assert status == 404 and data["error"] == "not_found"
    assert (
        requests.get(f"{hub.url}{API}/me", timeout=30)
        .headers["Content-Type"]
        .startswith("application/json")
    )


def test_a_users_server_reaches_the_service_with_its_own_token(hub: Hub) -> None:
    """What the example gives single-user servers: the service's URL and a token that
    carries the broker's scopes (custom:gpubroker:admin only for the admin)."""
    hub.user("ivan")
    try:
        env = hub.start_server("ivan")
        assert env["GPUBROKER_URL"] == hub.service_url
        headers = {"Authorization": f"token {env['JUPYTERHUB_API_TOKEN']}"}
        me = requests.get(f"{env['GPUBROKER_URL']}/me", headers=headers, timeout=30)
        assert me.json() == {"user": "ivan", "groups": [], "admin": False, "kernel_id": None}
        taken = requests.post(
            f"{env['GPUBROKER_URL']}/requests", json=SLICE, headers=headers, timeout=30
        )
        assert taken.status_code == 201 and taken.json()["lease"]["user"] == "ivan"
        lease = taken.json()["lease"]["id"]
        gone = requests.delete(
            f"{env['GPUBROKER_URL']}/leases/{lease}", headers=headers, timeout=30
        )
        assert gone.status_code == 200
    finally:
        hub.stop_server("ivan")


def test_a_broker_config_error_leaves_the_hub_up_and_tells_its_users(
    tmp_path: Path, proxy: None
) -> None:
    """A typo in c.GPUBroker used to end the service at once, and the hub with it."""
    with Hub(tmp_path, simulate="dgx-h100-migg").running(broker_runs=False) as broken:
        token = broken.user("ann")
        status, answer = broken.api(token, "GET", "devices")
        assert status == 503 and answer["error"] == "broker_unavailable"
        assert "unknown simulated topology 'dgx-h100-migg'" in answer["message"]
        assert broken.hub_api("GET", "users/ann")["name"] == "ann"  # the hub works on
