"""GPU servers end to end: a real hub and proxy, the broker service and the GPU spawner
(``SimpleGPUBrokerSpawner``: the mixin over LocalProcessSpawner, every server as this OS
user) on the simulated machine (one H100 in seven 1g.10gb slices)."""

from __future__ import annotations

import contextlib
import html
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from live_hub import Hub, refusing, wait_for

from hub_spawner.environment import LEASE_ENV
from hub_spawner.hubauth import USE_SCOPE as USE
from jupyter_gpubroker.api.shapes import parse_iso

pytestmark = pytest.mark.hub
SLICE = {"profile": "1g.10gb"}
SERVICE_STARTED = "GPU broker service: the API at"
IMPATIENT = "impatient"
"""The user whose GPU servers wait only 5 s in the queue (the test config's hook)."""

CONFIG = f"""
c.JupyterHub.cleanup_servers = False  # servers outlive a hub restart (every test stops its own)
c.SimpleGPUBrokerSpawner.gpu_wait_timeout = 600
c.Spawner.poll_interval = 2  # a dead server is noticed within seconds
def _impatient(spawner):
    if spawner.user.name == {IMPATIENT!r}:
        spawner.gpu_wait_timeout = 5
c.Spawner.pre_spawn_hook = _impatient
c.JupyterHub.services[0]["command"].append("--log-level=INFO")  # its start, its releases
"""


GPU_HUB = {
    "spawner": "hub_spawner.spawner.SimpleGPUBrokerSpawner",
    "lease_ttl": 900,  # the filler's leases, never renewed, outlive the module
}
"""A hub on the GPU spawner (``Hub``'s options)."""


@pytest.fixture(scope="module")
def hub_options() -> dict[str, Any]:
    return {**GPU_HUB, "extra_config": CONFIG}


def ok(hub: Hub, token: str, method: str, path: str, body: Any = None) -> Any:
    status, data = hub.api(token, method, path, body)
    assert status in (200, 201, 204), f"{method} {path}: {status} {data}"
    return data


def spawn(hub: Hub, token: str, name: str, options: dict[str, Any]) -> requests.Response:
    """POST the user's server with ``options`` through the hub's REST API, as the user."""
    return requests.post(
        f"{hub.url}/hub/api/users/{name}/server",
        json=options,
        headers={"Authorization": f"token {token}"},
        timeout=60,
    )


def spawner_tokens(hub: Hub, name: str) -> list[list[str]]:
    """The scopes of each hub token the GPU spawner holds for ``name``'s server."""
    tokens = hub.hub_api("GET", f"users/{name}/tokens")["api_tokens"]
    return [sorted(t["scopes"]) for t in tokens if t["note"] == f"gpubroker spawner of {name}"]


class Progress:
    """The hub's spawn progress stream (server-sent events) of one user, read in a thread."""

    def __init__(self, hub: Hub, token: str, name: str) -> None:
        self.events: list[dict[str, Any]] = []
        self._response = requests.get(
            f"{hub.url}/hub/api/users/{name}/server/progress",
            headers={"Authorization": f"token {token}"},
            stream=True,
            timeout=300,
        )
        assert self._response.status_code == 200, self._response.text
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        with contextlib.suppress(requests.RequestException, AttributeError):  # closed
            for line in self._response.iter_lines(decode_unicode=True):
                if line and line.startswith("data:"):
                    self.events.append(json.loads(line[5:]))

    def messages(self) -> list[str]:
        return [e.get("message", "") for e in self.events]

    def close(self) -> None:
        self._response.close()


def test_gpu_servers_start_in_turn_and_the_waiting_user_sees_position_eta_then_grant(
    hub: Hub,
) -> None:
    tokens = {name: hub.user(name) for name in ("alice", "bob", "carol", "filler")}
    filled = [ok(hub, tokens["filler"], "POST", "requests", {**SLICE, "holder": "fill"})]
    filled += [ok(hub, tokens["filler"], "POST", "requests", {**SLICE, "holder": "fill"})]
    filled += [ok(hub, tokens["filler"], "POST", "requests", SLICE) for _ in range(3)]
    progress = None
    try:
        envs = {}
        for name in ("alice", "bob"):
            assert spawn(hub, tokens[name], name, SLICE).status_code in (201, 202)
            envs[name] = hub.ready_server_env(name)
        devices = {name: env["CUDA_VISIBLE_DEVICES"] for name, env in envs.items()}
        assert all(d.startswith("MIG-") for d in devices.values())
        assert devices["alice"] != devices["bob"]
        assert envs["alice"]["NVIDIA_VISIBLE_DEVICES"] == devices["alice"]
        # each lease is its user's (the spawner's token acts for that user only), and the
        # server's own token sees it: its kernels share the reservation
        for name, env in envs.items():
            mine = ok(hub, env["JUPYTERHUB_API_TOKEN"], "GET", "leases")["leases"]
            assert [(x["id"], x["user"], x["devices"]) for x in mine] == [
                (env[LEASE_ENV], name, [devices[name]])
            ]
        alice_lease = envs["alice"][LEASE_ENV]
        assert hub.api(tokens["bob"], "DELETE", f"leases/{alice_lease}")[0] == 403
        # the spawner's own token of alice's: the broker (and who she is) only
        identify = ["read:users:groups!user=alice", "read:users:name!user=alice"]
        assert spawner_tokens(hub, "alice") == [
            ["access:services!service=gpubroker", USE, *identify]
        ]

        # the machine is full: carol's start waits, and her progress says where she is
        assert spawn(hub, tokens["carol"], "carol", SLICE).status_code == 202
        progress = Progress(hub, tokens["carol"], "carol")
        wait_for(
            "carol's position",
            lambda: any("position 1 of 1" in m and "ETA" in m for m in progress.messages()),
            log=hub.log,
        )
        waiting = next(m for m in progress.messages() if "position 1" in m)
        assert waiting.startswith("Waiting for 1g.10gb (interactive): every 1g.10gb is in use")
        assert not hub.hub_api("GET", "users/carol")["servers"][""]["ready"]

        # alice stops: her lease is released, and carol gets her slice
        hub.stop_server("alice")
        wait_for(
            "alice's release",
            lambda: not ok(hub, tokens["alice"], "GET", "leases")["leases"],
            log=hub.log,
        )
        assert spawner_tokens(hub, "alice") == []  # revoked with the server
        carol = hub.ready_server_env("carol")
        assert carol["CUDA_VISIBLE_DEVICES"] == devices["alice"]
        wait_for("the ready event", lambda: any(e.get("ready") for e in progress.events))
        granted = [m for m in progress.messages() if m.startswith("Granted 1g.10gb")]
        assert granted and devices["alice"] in granted[0]
    finally:
        if progress is not None:
            progress.close()
        for name in ("alice", "bob", "carol"):
            hub.stop_server(name)
        for r in filled:
            hub.api(tokens["filler"], "DELETE", f"leases/{r['lease']['id']}")


def test_a_cpu_only_server_starts_at_once_without_a_gpu(hub: Hub) -> None:
    token = hub.user("dan")
    try:
        assert spawn(hub, token, "dan", {}).status_code in (201, 202)
        env = hub.ready_server_env("dan")
        assert env["CUDA_VISIBLE_DEVICES"] == "" and LEASE_ENV not in env
        assert not ok(hub, token, "GET", "requests")["requests"]
    finally:
        hub.stop_server("dan")


def test_options_the_user_may_not_ask_for_are_refused_at_once_with_what_they_may(
    hub: Hub,
) -> None:
    admin, dave = hub.user("admin"), hub.user("dave")
    ok(hub, admin, "PUT", "quotas/user/dave", {"max_gpus": 0.1})
    try:
        refused = spawn(hub, dave, "dave", SLICE)
        message = refused.json()["message"]
        assert refused.status_code == 400, refused.text
        assert "may hold at most 0.1" in message
        assert "you may ask for a CPU-only server" in message and "1g.10gb" not in message
        for options, says in (
            ({"gpus": 1}, "0 GPUs with MIG disabled"),
            ({"profile": "7g.80gb"}, "no GPU here offers MIG profile '7g.80gb'"),
            ({"profile": "1g.10gb", "user": "alice"}, "unknown server option(s) user"),
            ({"profile": "1g.10gb", "groups": ["lab"]}, "unknown server option(s) groups"),
            ({"gpus": "all"}, "'gpus' must be a whole number"),
        ):
            refused = spawn(hub, dave, "dave", options)
            assert refused.status_code == 400, (options, refused.text)
            assert says in refused.json()["message"], (options, refused.text)
        assert hub.hub_api("GET", "users/dave")["servers"] == {}
        assert not ok(hub, dave, "GET", "requests")["requests"]
    finally:
        ok(hub, admin, "DELETE", "quotas/user/dave")


def test_a_start_that_waits_past_its_limit_is_withdrawn_and_told_its_position(hub: Hub) -> None:
    filler, token = hub.user("filler"), hub.user(IMPATIENT)
    held = [ok(hub, filler, "POST", "requests", SLICE) for _ in range(7)]
    try:
        refused = spawn(hub, token, IMPATIENT, SLICE)  # the hub waits 10 s for a start
        assert refused.status_code == 503, refused.text
        message = refused.json()["message"]
        assert "No GPU for this server within 5 s (position 1 in the queue)" in message
        assert "withdrawn" in message
        assert not ok(hub, token, "GET", "requests")["requests"]
        assert hub.hub_api("GET", f"users/{IMPATIENT}")["servers"] == {}
    finally:
        for r in held:
            hub.api(filler, "DELETE", f"leases/{r['lease']['id']}")


def test_a_restarted_hub_keeps_a_servers_lease_renews_it_and_releases_it_on_stop(
    hub: Hub,
) -> None:
    token = hub.user("erin")
    try:
        assert spawn(hub, token, "erin", SLICE).status_code in (201, 202)
        lease_id = hub.ready_server_env("erin")[LEASE_ENV]
        before = ok(hub, token, "GET", f"leases/{lease_id}")
        hub.stop()
        hub.start()
        renewed = wait_for(
            "the restarted hub's renewal",
            lambda: (
                (x := ok(hub, token, "GET", f"leases/{lease_id}"))["expires_at"]
                > before["expires_at"]
                and x
            ),
            log=hub.log,
        )
        assert renewed["state"] == "active"
        assert hub.hub_api("GET", "users/erin")["servers"][""]["ready"]
        hub.stop_server("erin")
        assert ok(hub, token, "GET", f"leases/{lease_id}")["state"] == "released"
    finally:
        hub.stop_server("erin")


def test_a_start_still_queued_when_the_hub_restarts_keeps_its_request_and_starts_on_grant(
    hub: Hub,
) -> None:
    filler, token = hub.user("filler"), hub.user("hal")
    held = [ok(hub, filler, "POST", "requests", SLICE) for _ in range(7)]
    try:
        assert spawn(hub, token, "hal", SLICE).status_code == 202
        queued = wait_for(
            "hal's request in the queue",
            lambda: ok(hub, token, "GET", "requests")["requests"],
            log=hub.log,
        )
        (request,) = queued
        assert request["state"] == "queued" and request["holder"] == "server:hal"
        hub.stop()  # the hub and the broker service with it
        hub.start()
        # the restarted hub takes the start up again: the same request, still waiting
        wait_for(
            "hal's start to resume",
            lambda: hub.hub_api("GET", "users/hal")["servers"].get("", {}).get("pending"),
            log=hub.log,
        )
        assert [r["id"] for r in ok(hub, token, "GET", "requests")["requests"]] == [request["id"]]
        freed = hub.api(filler, "DELETE", f"leases/{held.pop()['lease']['id']}")[1]
        env = hub.ready_server_env("hal")
        assert env["CUDA_VISIBLE_DEVICES"] == freed["devices"][0]
        lease = ok(hub, token, "GET", f"leases/{env[LEASE_ENV]}")
        assert lease["request_id"] == request["id"]  # granted the request it had, no other
    finally:
        hub.stop_server("hal")
        for r in held:
            hub.api(filler, "DELETE", f"leases/{r['lease']['id']}")


def test_a_server_stopped_while_the_service_is_down_is_released_when_it_comes_back(
    hub: Hub,
) -> None:
    """The service's supervisor dies, and the service with it, and the user's server
    stops while none runs (its give-back finds no broker; the service's port is held
    closed meanwhile, so the hub's poll cannot start one within the give-back's retries);
    the hub starts the service again at its next poll:
    the restarted service releases its lease within seconds of starting, charged no later
    than the stop (up to the last renewal, at most a third of the TTL before), through the
    API: the audit log records the release, the service as its actor, with its reason."""
    token, admin = hub.user("ida"), hub.user("admin")
    try:
        assert spawn(hub, token, "ida", SLICE).status_code in (201, 202)
        lease_id = hub.ready_server_env("ida")[LEASE_ENV]
        ttl_s = ok(hub, token, "GET", f"leases/{lease_id}")["ttl_s"]
        starts = hub.log.read_text().count(SERVICE_STARTED)
        os.kill(hub.supervisor_pid(), signal.SIGKILL)
        stopped_at = time.time()
        with refusing(hub.service_port):
            hub.stop_server("ida")  # its give-back fails: no broker
            wait_for("ida's stop", lambda: hub.hub_api("GET", "users/ida")["servers"] == {})
            wait_for("the failed give-back", lambda: "Could not give ida" in hub.log.read_text())
        # the hub restarts its dead service at its next poll
        wait_for(
            "the restarted service",
            lambda: hub.log.read_text().count(SERVICE_STARTED) > starts,
            timeout_s=60,
            interval_s=0.05,
            log=hub.log,
        )
        started = time.monotonic()
        lease = wait_for(
            "the stopped server's release",
            lambda: (
                (x := hub.api(token, "GET", f"leases/{lease_id}")[1])["state"] == "released" and x
            ),
            timeout_s=10,
            interval_s=0.05,
            log=hub.log,
        )
        print(f"released {time.monotonic() - started:.2f} s after the service started")
        assert "not running" in lease["reason"]
        ended = parse_iso(lease["ended_at"])
        assert ended <= stopped_at + ttl_s / 3, (lease, stopped_at)
        records = ok(hub, admin, "GET", "audit", None)["audit"]
        (record,) = [a for a in records if a["target"] == lease_id]
        assert (record["actor"], record["action"]) == (
            "services/gpubroker",
            "release_stopped_server",
        )
        assert record["detail"] == {
            "user": "ida",
            "server": "ida",
            "reason": "server ida is not running",
        }
    finally:
        hub.stop_server("ida")


def test_a_killed_service_costs_a_waiting_start_and_the_spawn_page_nothing(hub: Hub) -> None:
    """The service is SIGKILLed while a GPU server waits in its queue: the spawn page,
    loaded while the service starts again, shows the form within 5 s of the kill, and
    the waiting start goes on to the next free slice with no error on its progress."""
    filler, token = hub.user("filler"), hub.user("jo")
    held = [ok(hub, filler, "POST", "requests", SLICE) for _ in range(7)]
    browser = login(hub, "kai")
    progress = None
    try:
        assert spawn(hub, token, "jo", SLICE).status_code == 202
        progress = Progress(hub, token, "jo")
        wait_for("jo's place", lambda: any("position" in m for m in progress.messages()))
        killed = hub.service_pid()
        assert killed is not None
        os.kill(killed, signal.SIGKILL)
        at = time.monotonic()
        wait_for("the kill", lambda: not Path(f"/proc/{killed}").exists(), interval_s=0.01)
        page = browser.get(f"{hub.url}/hub/spawn", timeout=60)
        took = time.monotonic() - at
        assert page.status_code == 200 and "1g.10gb: 0 of 7 free" in page.text
        assert took <= 5.0, f"the spawn page came {took:.1f} s after the kill"

        freed = ok(hub, filler, "DELETE", f"leases/{held.pop()['lease']['id']}")
        env = hub.ready_server_env("jo")
        assert env["CUDA_VISIBLE_DEVICES"] == freed["devices"][0]
        assert not any(e.get("failed") for e in progress.events), progress.messages()
    finally:
        if progress is not None:
            progress.close()
        hub.stop_server("jo")
        for r in held:
            hub.api(filler, "DELETE", f"leases/{r['lease']['id']}")


def login(hub: Hub, name: str) -> requests.Session:
    """A browser's session of ``name`` (the example's dummy authenticator)."""
    s = requests.Session()
    s.get(f"{hub.url}/hub/login", timeout=30)
    form = {"username": name, "password": "any", "_xsrf": s.cookies.get("_xsrf", path="/hub/")}
    assert s.post(f"{hub.url}/hub/login", data=form, timeout=30).ok
    return s


def test_the_options_form_shows_whats_free_and_starts_the_choice_without_javascript(
    hub: Hub,
) -> None:
    filler, token = hub.user("filler"), hub.user("fay")
    held = [ok(hub, filler, "POST", "requests", SLICE) for _ in range(2)]
    browser = login(hub, "fay")
    try:
        page = browser.get(f"{hub.url}/hub/spawn", timeout=60)
        assert page.status_code == 200
        assert 'name="gpu_kind" id="gpu-cpu" value="cpu" checked' in page.text
        assert "1g.10gb: 5 of 7 free; starts at once" in page.text
        assert "You hold nothing now; no quota of your own; the default" in page.text
        assert "largest has 10.4 GB" in page.text and "Whole GPUs" not in page.text

        choice = {"gpu_kind": "profile", "profile": "1g.10gb", "job_class": "batch"}
        choice["_xsrf"] = browser.cookies.get("_xsrf", path="/hub/")
        # a choice the form does not offer starts nothing, CPU-only or else
        refused = browser.post(f"{hub.url}/hub/spawn", data={**choice, "gpu_kind": "tpu"})
        assert (
            "Cannot start the server: gpu_kind must be cpu, gpus, profile, min_memory_gb or "
            "share_gb, not 'tpu'." in html.unescape(refused.text)
        )
        assert hub.hub_api("GET", "users/fay")["servers"] == {}
        assert browser.post(f"{hub.url}/hub/spawn", data=choice, timeout=60).ok
        env = hub.ready_server_env("fay")
        lease = ok(hub, token, "GET", f"leases/{env[LEASE_ENV]}")
        assert lease["user"] == "fay" and env["CUDA_VISIBLE_DEVICES"] == lease["devices"][0]
        request = ok(hub, token, "GET", f"requests/{lease['request_id']}")
        assert request["job_class"] == "batch"
        hub.stop_server("fay")

        # over quota from the form: the page says why, and no server starts
        ok(hub, hub.user("admin"), "PUT", "quotas/user/fay", {"max_gpus": 0.1, "share": 2})
        page = browser.get(f"{hub.url}/hub/spawn", timeout=60)
        assert (
            "your quota allows 0.1 GPUs' worth at a time, less than any device here; your "
            "share: 2" in html.unescape(page.text)
        )
        refused = browser.post(f"{hub.url}/hub/spawn", data=choice, timeout=60)
        assert "may hold at most 0.1" in html.unescape(refused.text)
        assert hub.hub_api("GET", "users/fay")["servers"] == {}
    finally:
        hub.api(hub.user("admin"), "DELETE", "quotas/user/fay")
        hub.stop_server("fay")
        for r in held:
            hub.api(filler, "DELETE", f"leases/{r['lease']['id']}")


def test_a_server_that_dies_gives_its_gpu_back(hub: Hub) -> None:
    token = hub.user("gus")
    try:
        assert spawn(hub, token, "gus", SLICE).status_code in (201, 202)
        env = hub.ready_server_env("gus")
        pid = hub.hub_api("GET", "users/gus")["servers"][""]["state"]["pid"]
        os.kill(pid, signal.SIGKILL)
        wait_for(
            "the dead server's release",
            lambda: ok(hub, token, "GET", f"leases/{env[LEASE_ENV]}")["state"] == "released",
            log=hub.log,
        )
        # the poll gives the lease back first, then the hub forgets the server
        wait_for("the hub to forget it", lambda: hub.hub_api("GET", "users/gus")["servers"] == {})
    finally:
        hub.stop_server("gus")
