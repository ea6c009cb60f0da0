"""GPU-aware idle culling of GPU servers, end to end: a real hub and proxy, the broker
service and the GPU spawner on the simulated machine (one H100 in seven 1g.10gb slices).

A GPU server is idle once none of its kernels ran a cell for 4 s and its GPU stayed quiet
as long; it is warned, and stopped 20 s later. Its server reports its kernels' activity
every second, and the hub polls it every second."""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Any

import pytest
import requests
from live_hub import Hub, ServerKernel, wait_for
from test_spawner import GPU_HUB, SLICE, login, ok, spawn

from hub_spawner.environment import LEASE_ENV

pytestmark = pytest.mark.hub
TIMEOUT_S, GRACE_S = 4.0, 20.0
VIP = "vip"
"""A user whose servers are never culled (c.GPUBroker.reclaim_exempt_users)."""

CONFIG = """
c.SimpleGPUBrokerSpawner.gpu_wait_timeout = 600
c.Spawner.poll_interval = 1
c.Spawner.args = [*c.Spawner.args, "--GPUBrokerExtension.server_report_interval=1"]
"""


@pytest.fixture(scope="module")
def hub_options() -> dict[str, Any]:
    return {
        **GPU_HUB,
        "extra_config": CONFIG,
        "sample_interval": 0.5,
        "server_idle_timeout_by_profile": {"1g.10gb": TIMEOUT_S},
        "grace": GRACE_S,
        "reclaim_exempt_users": {VIP},
    }


class OpenTab:
    """A browser tab left open on a server: JupyterLab's polling of its REST API."""

    def __init__(self, hub: Hub, name: str, token: str) -> None:
        self.url, self.headers = f"{hub.url}/user/{name}/api", {"Authorization": f"token {token}"}
        self.calls = 0
        self._closed = threading.Event()
        threading.Thread(target=self._poll, daemon=True).start()

    def _poll(self) -> None:
        while not self._closed.wait(0.5):
            for path in ("status", "kernels", "sessions"):
                try:
                    requests.get(f"{self.url}/{path}", headers=self.headers, timeout=10)
                    self.calls += 1
                except requests.RequestException:
                    pass

    def close(self) -> None:
        self._closed.set()


def lease_of(hub: Hub, token: str, lease_id: str) -> dict[str, Any]:
    return ok(hub, token, "GET", f"leases/{lease_id}")  # type: ignore[no-any-return]


def test_an_idle_gpu_server_is_warned_then_stopped_and_its_slice_goes_to_the_waiting_user(
    hub: Hub,
) -> None:
    tokens = {name: hub.user(name) for name in ("alice", "bob", "filler")}
    held = [ok(hub, tokens["filler"], "POST", "requests", SLICE) for _ in range(6)]
    tab = kernel = None
    try:
        assert spawn(hub, tokens["alice"], "alice", SLICE).status_code in (201, 202)
        env = hub.ready_server_env("alice")
        lease_id, device = env[LEASE_ENV], env["CUDA_VISIBLE_DEVICES"]
        # the machine is full: bob's start waits
        assert spawn(hub, tokens["bob"], "bob", SLICE).status_code == 202
        tab = OpenTab(hub, "alice", tokens["alice"])
        # a notebook of hers shows her server's GPU, live (%gpu follows the server's lease)
        kernel = ServerKernel(hub, "alice", tokens["alice"], "python3")
        shown = kernel.run("%load_ext jupyter_gpubroker\n%gpu")
        ran_at = time.time()
        assert "Holding 1g.10gb (interactive)" in shown, shown

        # the warning after her cell (one before it, while her kernel started, is cleared)
        warned = wait_for(
            "the idle warning",
            lambda: (
                (x := lease_of(hub, tokens["alice"], lease_id))["reclaim_at"]
                and datetime.fromisoformat(x["reclaim_at"]).timestamp() > ran_at + GRACE_S
                and x
            ),
            log=hub.log,
        )
        assert warned["state"] == "active" and warned["idle_s"] >= TIMEOUT_S
        browser = login(hub, "alice")
        home = wait_for(
            "the warning on the hub's home page",
            lambda: "will be stopped at" in (t := browser.get(f"{hub.url}/hub/home").text) and t,
            log=hub.log,
        )
        assert f"Your GPU server ({device}) has been idle for" in home
        wait_for(
            "the warning in her notebook's %gpu widget",
            lambda: any("unless used" in s.get("value", "") for s in kernel.widget_states("value")),
            log=hub.log,
        )

        ended = wait_for(
            "the reclaim",
            lambda: (x := lease_of(hub, tokens["alice"], lease_id))["state"] != "active" and x,
            timeout_s=120,
            log=hub.log,
        )
        assert ended["state"] == "reclaimed" and ended["reason"].startswith("idle for")
        wait_for(
            "alice's server to stop",
            lambda: hub.hub_api("GET", "users/alice")["servers"] == {},
            log=hub.log,
        )
        assert tab.calls > 0  # her open tab kept polling all along
        home = browser.get(f"{hub.url}/hub/home").text
        assert "Your GPU server was stopped at" in home and "its GPU lease was reclaimed" in home

        # her slice goes to bob, who was waiting
        assert hub.ready_server_env("bob")["CUDA_VISIBLE_DEVICES"] == device
    finally:
        if tab is not None:
            tab.close()
        for name in ("alice", "bob"):
            hub.stop_server(name)
        for r in held:
            hub.api(tokens["filler"], "DELETE", f"leases/{r['lease']['id']}")


def test_a_busy_kernel_or_an_exempt_user_keeps_a_gpu_server(hub: Hub) -> None:
    tokens = {name: hub.user(name) for name in ("carol", VIP)}
    kernel = None
    try:
        leases = {}
        for name in tokens:
            assert spawn(hub, tokens[name], name, SLICE).status_code in (201, 202)
        for name in tokens:
            leases[name] = hub.ready_server_env(name)[LEASE_ENV]
        kernel = ServerKernel(hub, "carol", tokens["carol"], "python3")
        cell = kernel.start("import time\ntime.sleep(600)")  # a long cell, GPU quiet
        # the broker has judged the exempt server idle for longer than timeout and grace
        wait_for(
            "the exempt server's idle time",
            lambda: (lease_of(hub, tokens[VIP], leases[VIP])["idle_s"] or 0) > TIMEOUT_S + GRACE_S,
            timeout_s=120,
            log=hub.log,
        )
        vip = lease_of(hub, tokens[VIP], leases[VIP])
        assert vip["state"] == "active" and vip["reclaim_at"] is None, vip  # never warned
        # carol's server may have been warned in the seconds before her cell began; the
        # running cell withdraws the warning, and her lease outlives timeout and grace
        wait_for(
            "carol's warning withdrawn by her running cell",
            lambda: (
                (lease := lease_of(hub, tokens["carol"], leases["carol"]))["reclaim_at"] is None
                and lease["idle_s"] == 0
            ),
            timeout_s=30,
            log=hub.log,
        )
        assert lease_of(hub, tokens["carol"], leases["carol"])["state"] == "active"
        for name in leases:
            assert hub.hub_api("GET", f"users/{name}")["servers"][""]["ready"]
        assert not any(
            m["msg_type"] == "status" and m["content"]["execution_state"] == "idle"
            for m in kernel.replies(cell)
        )  # the cell still runs
    finally:
        if kernel is not None:
            kernel.shutdown()
        for name in tokens:
            hub.stop_server(name)
