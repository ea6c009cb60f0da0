"""A team sharing one GPU machine through the hub, end to end: the real hub and proxy, the
broker service the hub starts, alice's and bob's servers started by LocalProcessSpawner in
remote mode (the example's ``c.Spawner.environment``), and real kernels of those servers
on GPU kernelspecs, driven through the proxy as JupyterLab drives them.

The simulated H100 is cut into only two 1g.10gb slices, so that alice's GPU kernel and one
more lease fill it. Leases live 90 s: a killed service is back well within one lease
(its supervisor starts it again at once); batch leases are reclaimed after 2 s idle."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from live_hub import Hub, ServerKernel, wait_for
from test_service import SLICE, ok

from jupyter_gpubroker.api import API_PREFIX
from jupyter_gpubroker.kernelspec import install, spec_for
from jupyter_gpubroker.wire.sizes import Size

pytestmark = pytest.mark.hub
TOPOLOGY = """\
version: v1
simulate: {gpu-model: H100-80GB, gpu-count: 1}
mig-configs:
  two-slices:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 2}
"""
KERNELSPECS = ((Size(profile="1g.10gb"), "interactive"), (Size(profile="1g.10gb"), "batch"))
GPU, BATCH = (spec_for(size, job_class)[0] for size, job_class in KERNELSPECS)
ON_DEMAND = spec_for(None)[0]
FEED = """\
seen = []
async def keep(event):
    seen.append(event)
stop = get_ipython().magics_manager.registry["GPUMagics"].session.feed.subscribe(keep)
"""
"""Keep what the kernel's event feed (what its %gpu widgets follow) yields, in ``seen``."""
TYPES = "[e['type'] for e in seen]"
DRAINS = (
    "[(e['data'].get('request_id'), e['data']['device'], e['data']['reason']) "
    "for e in seen if e['type'] == 'drained']"
)


@pytest.fixture(scope="module")
def hub_options(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    topology = tmp_path_factory.mktemp("machine") / "two-slices.yaml"
    topology.write_text(TOPOLOGY)
    return {
        "simulate": str(topology),
        "lease_ttl": 90.0,
        "sample_interval": 0.5,
        "idle_timeout_by_class": {"batch": 2.0},
        "grace": 2.0,
    }


class Team:
    """alice's and bob's servers, and everyone's hub API tokens (admin is the admin)."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.tokens = {name: hub.user(name) for name in ("alice", "bob", "admin")}
        self.alice, self.bob, self.admin = self.tokens.values()
        for name in ("alice", "bob"):
            home = hub.home / "users" / name  # the spawner's home_dir_template
            for size, job_class in (*KERNELSPECS, (None, "interactive")):
                install(size, job_class, prefix=str(home / ".local"))  # ~/.local/share/jupyter
            hub.start_server(name)

    def kernel(self, user: str, kernelspec: str) -> ServerKernel:
        return ServerKernel(self.hub, user, self.tokens[user], kernelspec)

    def relayed(self, user: str, method: str, path: str, body: Any = None) -> requests.Response:
        """A broker call through ``user``'s own server (its relay to the service)."""
        return requests.request(
            method,
            f"{self.hub.url}/user/{user}/{API_PREFIX}/{path}",
            json=body,
            headers={"Authorization": f"token {self.tokens[user]}"},
            timeout=30,
        )


@pytest.fixture(scope="module")
def team(hub: Hub) -> Iterator[Team]:
    running = Team(hub)
    yield running
    for name in ("alice", "bob"):
        hub.stop_server(name)


@pytest.fixture(scope="module")
def alices_kernel(team: Team) -> Iterator[ServerKernel]:
    """alice's GPU kernel, holding one of the two slices for the whole module."""
    kernel = team.kernel("alice", GPU)
    yield kernel
    kernel.shutdown()


def shown(kernel: ServerKernel, expr: str) -> Any:
    """The value of ``expr`` (a literal) in the kernel."""
    return ast.literal_eval(kernel.run(f"print(repr({expr}))"))


def lease_of(team: Team, kernel: ServerKernel) -> dict[str, Any]:
    """The active lease of ``kernel``, as the admin sees it."""
    for lease in ok(team.hub, team.admin, "GET", "leases")["leases"]:
        request = ok(team.hub, team.admin, "GET", f"requests/{lease['request_id']}")
        if request["holder"] == kernel.id:
            return dict(lease)
    raise AssertionError(f"kernel {kernel.id} holds no lease")


def test_a_gpu_kernel_takes_its_slice_from_the_service_charged_to_its_user(
    team: Team, alices_kernel: ServerKernel
) -> None:
    device, url = alices_kernel.run(
        "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['GPUBROKER_URL'])"
    ).split()
    lease = lease_of(team, alices_kernel)
    assert lease["devices"] == [device] and device.startswith("MIG-")
    assert lease["user"] == "alice"
    usage = ok(team.hub, team.admin, "GET", "usage")["gpu_hours"]
    assert usage["alice"] > 0 and "bob" not in usage
    assert url.rstrip("/") == team.hub.service_url  # the kernel's %gpu talks to the service
    home = team.hub.home / "users" / "alice"
    assert list(home.rglob("*gpubroker*")) == []  # no broker, no state in her server


def test_bobs_request_waits_and_his_widget_shows_his_position_move(
    team: Team, alices_kernel: ServerKernel
) -> None:
    hub = team.hub
    fill = ok(hub, team.admin, "POST", "requests", {**SLICE, "holder": "fill"})
    ahead = ok(hub, team.bob, "POST", "requests", {**SLICE, "holder": "cli"})
    assert (fill["state"], ahead["position"]) == ("granted", 1)  # the machine is full
    kernel = team.kernel("bob", ON_DEMAND)
    try:
        cell = kernel.start("%gpu request 1g.10gb")

        def positions() -> list[Any]:
            return [(s["state"], s["position"]) for s in kernel.widget_states("position")]

        wait_for("bob's widget at position 2", lambda: ("queued", 2) in positions(), log=hub.log)
        ok(hub, team.bob, "DELETE", f"requests/{ahead['id']}")
        wait_for("bob's widget at position 1", lambda: ("queued", 1) in positions(), log=hub.log)
        ok(hub, team.admin, "DELETE", f"leases/{fill['lease']['id']}")
        kernel.wait(cell)
        seen = positions()
        assert seen.index(("queued", 2)) < seen.index(("queued", 1)) < seen.index(("granted", None))
        granted = kernel.widget_states("devices")[-1]
        assert granted["state"] == "granted"
        assert lease_of(team, kernel)["devices"] == granted["devices"]
        assert lease_of(team, kernel)["user"] == "bob"
        assert kernel.run("%gpu release").startswith(f"Released {granted['devices'][0]}")
    finally:
        kernel.shutdown()
        for r in ok(hub, team.admin, "GET", "requests")["requests"]:
            if r["state"] in ("queued", "granted") and r["holder"] in ("fill", "cli"):
                ok(hub, team.admin, "DELETE", f"requests/{r['id']}")


def test_an_admins_drain_reaches_the_holders_kernel_and_nobody_else_may_drain(
    team: Team, alices_kernel: ServerKernel
) -> None:
    hub = team.hub
    held = lease_of(team, alices_kernel)
    (device,) = held["devices"]
    alices_kernel.run(FEED)
    wait_for("alice's kernel feed", lambda: "hello" in shown(alices_kernel, TYPES), log=hub.log)

    reason = {"reason": "fan replaced"}
    for refused in (
        hub.api(team.bob, "POST", f"devices/{device}/drain", reason)[0],
        team.relayed("bob", "POST", f"devices/{device}/drain", reason).status_code,
        team.relayed("bob", "PATCH", "requests/x1", {"job_class": "batch"}).status_code,
    ):
        assert refused == 403
    try:
        drained = ok(hub, team.admin, "POST", f"devices/{device}/drain", reason)
        assert drained["drained"]["reason"] == "drained by admin: fan replaced"
        got = wait_for(
            "the drain in alice's kernel", lambda: shown(alices_kernel, DRAINS), log=hub.log
        )
        assert got == [(held["request_id"], device, "drained by admin: fan replaced")]
        assert lease_of(team, alices_kernel)["devices"] == [device]  # she keeps her lease
    finally:
        alices_kernel.run("stop()")
        ok(hub, team.admin, "DELETE", f"devices/{device}/drain")


def test_a_killed_service_comes_back_and_the_kernels_keep_their_leases_and_tokens(
    team: Team, alices_kernel: ServerKernel
) -> None:
    hub = team.hub
    held = lease_of(team, alices_kernel)
    bobs = team.kernel("bob", ON_DEMAND)
    try:
        assert "holds no GPU" in bobs.run("%gpu status")
        hub.kill_service()

        shown = alices_kernel.run('lease = %gpu status\nprint(lease["id"], lease["state"])')
        assert shown.splitlines()[0] == f"{held['id']} active"  # her kernel token still works
        assert "holds no GPU" in bobs.run("%gpu status")  # and bob's
        # alice's server keeps renewing her kernel's lease with the service that came back
        renewed = wait_for(
            "a renewal after the restart",
            lambda: (
                (now := lease_of(team, alices_kernel))["expires_at"] > held["expires_at"] and now
            ),
            timeout_s=120,
            log=hub.log,
        )
        assert renewed["id"] == held["id"] and renewed["state"] == "active"
    finally:
        bobs.shutdown()


def test_an_idle_kernel_is_warned_reclaimed_by_the_service_and_shut_down_by_its_server(
    team: Team, alices_kernel: ServerKernel
) -> None:
    hub = team.hub
    kernel = team.kernel("alice", BATCH)  # the second slice, reclaimed after 2 s idle
    try:
        lease = lease_of(team, kernel)
        kernel.run("%gpu status")  # on display: the widget tells her what happens
        wait_for("the kernel's shutdown", lambda: not kernel.alive(), timeout_s=120, log=hub.log)

        texts = [s["value"] for s in kernel.widget_states("value")]
        warned = next(i for i, t in enumerate(texts) if "unless used" in t)
        assert any(": reclaimed" in t for t in texts[warned:])
        ended = ok(hub, team.alice, "GET", f"leases/{lease['id']}")
        assert ended["state"] == "reclaimed" and ended["reason"].startswith("idle for")
        records = ok(hub, team.admin, "GET", "reclaims")["reclaims"]
        (record,) = [r for r in records if r["lease_id"] == lease["id"]]
        assert record["cause"] == "idle" and record["evidence"]["kernel_state"] == "idle"
        assert alices_kernel.alive()  # her interactive kernel is not idle-reclaimed
    finally:
        if kernel.alive():
            kernel.shutdown()
