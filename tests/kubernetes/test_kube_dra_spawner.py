"""GPU servers through KubeSpawner on the real control plane with DRA (Kubernetes 1.34.4,
``resource.k8s.io/v1``): the broker reads the ResourceSlices ``dra_publisher`` writes as
NVIDIA's driver does, grants a whole GPU, a MIG device or a share of the shared GPU, and
the spawner's pod takes it as a claim that the real kube-scheduler allocates to that very
device (the claim's ``status.allocation``, the slice's ``uuid`` attribute) before KWOK runs
the pod. Shares of one GPU share its claim; a claim the scheduler cannot satisfy fails the
start with its reason; a start taken up again after the hub's restart leaves one claim, of
the lease's device; nothing is left behind a stop.

The spawner's own part runs (``ClaimedKubeSpawner.start`` / ``stop``: the claim, then
KubeSpawner's pod); the grant is the real broker's, as the mixin keeps it
(``reservation.held``). The whole path through a hub is ``test_kube_dra_hub.py``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubespawner.clients", reason="the kubernetes extra")

from kube_broker import grant, make_dra_broker, started  # noqa: E402
from kube_cluster import NAMESPACE, get, kubectl, until  # noqa: E402

from hub_spawner._compat import SpawnException  # noqa: E402
from hub_spawner.kube_claims import SHARED_LABEL  # noqa: E402
from hub_spawner.kubernetes import ClaimedKubeSpawner, GPUBrokerKubeSpawner  # noqa: E402
from jupyter_gpubroker.engines import ENGINE  # noqa: E402
from jupyter_gpubroker.engines.dra import parse_dra_uuid  # noqa: E402
from jupyter_gpubroker.engines.kubernetes import BROKER_LABEL, LEASE_LABEL  # noqa: E402
from jupyter_gpubroker.runtime import GPUBroker  # noqa: E402
from jupyter_gpubroker.wire.sizes import Size  # noqa: E402

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.usefixtures("dra"),
    # KubeSpawner closes its shared API client from a task its test's loop may outlive
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]
Spawners = Callable[..., GPUBrokerKubeSpawner]


def serve(spawner: GPUBrokerKubeSpawner, held: dict[str, Any]) -> GPUBrokerKubeSpawner:
    spawner._gpu = dict(held)
    return spawner


def allocated(pod: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The pod's claim, and the uuids of the devices the scheduler allocated it (read from
    the ResourceSlice that publishes each)."""
    (named,) = pod["spec"]["resourceClaims"]  # a share's claim, else the one made for the pod
    (made,) = pod["status"].get("resourceClaimStatuses") or [named]
    claim = get("resourceclaim", made["resourceClaimName"], "-n", NAMESPACE)
    uuids = []
    for result in claim["status"]["allocation"]["devices"]["results"]:
        (published,) = [
            s
            for s in get("resourceslices")["items"]
            if s["spec"]["driver"] == result["driver"]
            and s["spec"]["pool"]["name"] == result["pool"]
        ]
        (device,) = [d for d in published["spec"]["devices"] if d["name"] == result["device"]]
        uuids.append(device["attributes"]["uuid"]["string"])
    return claim, uuids


def pod_of(spawner: GPUBrokerKubeSpawner) -> dict[str, Any]:
    found: dict[str, Any] = get("pod", spawner.pod_name, "-n", NAMESPACE)
    return found


def names(kind: str) -> list[str]:
    return sorted(x["metadata"]["name"] for x in get(kind, "-n", NAMESPACE)["items"])


def owners(kind: str, name: str) -> list[str]:
    """The UIDs of the pods that own ``name``."""
    meta = get(kind, name, "-n", NAMESPACE)["metadata"]
    return [o["uid"] for o in meta.get("ownerReferences") or []]


async def settled(what: str, check: Callable[[], Any], timeout_s: float = 30) -> None:
    """``check`` true within ``timeout_s`` (the controllers work in their own time)."""
    await asyncio.to_thread(until, what, check, timeout_s)


async def gone(kind: str) -> None:
    await settled(f"no {kind} left", lambda: not names(kind))


async def claim_of(spawner: GPUBrokerKubeSpawner) -> tuple[dict[str, Any], list[str]]:
    return await asyncio.to_thread(lambda: allocated(pod_of(spawner)))


SIZES = {
    "a whole GPU": (Size(gpus=1), "gpu.nvidia.com"),
    "a MIG device": (Size(profile="1g.10gb"), "mig.nvidia.com"),
    "a share": (Size(share_gb=8, compute_percent=50), "gpu.nvidia.com"),
}


@pytest.mark.parametrize("what", SIZES)
async def test_a_server_runs_on_the_very_device_the_broker_granted(
    dra_broker: GPUBroker, spawner: Spawners, what: str
) -> None:
    size, device_class = SIZES[what]
    held = grant(dra_broker, "ann", size)
    (device,) = (parse_dra_uuid(d) for d in held["devices"])
    server = serve(spawner(), held)
    started = time.monotonic()
    await ClaimedKubeSpawner.start(server)
    print(f"{what}: the pod ran {time.monotonic() - started:.1f} s after the start")
    try:
        pod = await asyncio.to_thread(pod_of, server)
        assert (pod["status"]["phase"], pod["spec"]["nodeName"]) == ("Running", device.node)
        (notebook,) = pod["spec"]["containers"]
        assert notebook["resources"] == {"claims": [{"name": "gpu"}]}  # no nvidia.com/gpu
        assert pod["metadata"]["labels"][LEASE_LABEL] == held["lease_id"]
        claim, uuids = await asyncio.to_thread(allocated, pod)
        assert uuids == [device.uuid]  # the scheduler's allocation is the broker's grant
        (request,) = claim["spec"]["devices"]["requests"]
        assert request["exactly"]["deviceClassName"] == device_class
        if what == "a share":
            assert claim["metadata"]["labels"][SHARED_LABEL] == "true"
            config = claim["status"]["allocation"]["devices"]["config"]
            assert config[0]["opaque"]["parameters"]["sharing"] == {"strategy": "MPS"}
            env = {e["name"]: e.get("value") for e in notebook["env"]}
            assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=7630M"  # 8 GB, in MiB up
            assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
        else:  # the template's labels, copied into the claim
            assert claim["metadata"]["labels"][LEASE_LABEL] == held["lease_id"]
            (template,) = await asyncio.to_thread(names, "resourceclaimtemplates")
            assert template == f"{server.pod_name}-gpu"
        owners = claim["metadata"]["ownerReferences"]
        assert [o["uid"] for o in owners] == [pod["metadata"]["uid"]]
        # the broker knows the claim as its grant's: the device is not drained
        await dra_broker.poll_engine()
        assert held["devices"][0] not in dra_broker.core.drained_by(ENGINE)
        assert dra_broker.core.lease(held["lease_id"]).state.value == "active"
    finally:
        await ClaimedKubeSpawner.stop(server, now=True)
    for kind in ("pods", "resourceclaims", "resourceclaimtemplates"):
        await gone(kind)


async def test_shares_of_one_gpu_share_its_claim_until_the_last_one_stops(
    dra_broker: GPUBroker, spawner: Spawners
) -> None:
    ann, bob = (grant(dra_broker, who, Size(share_gb=16)) for who in ("ann", "bob"))
    assert ann["devices"] == bob["devices"]  # the broker packs both on the L40S
    servers = [serve(spawner(user=who), h) for who, h in (("ann", ann), ("bob", bob))]
    for server in servers:
        await ClaimedKubeSpawner.start(server)
    try:
        pods = [await asyncio.to_thread(pod_of, s) for s in servers]
        claims = [(await asyncio.to_thread(allocated, p))[0] for p in pods]
        assert claims[0]["metadata"]["uid"] == claims[1]["metadata"]["uid"]
        reserved = {r["uid"] for r in claims[1]["status"]["reservedFor"]}
        assert reserved == {p["metadata"]["uid"] for p in pods}
        await ClaimedKubeSpawner.stop(servers[0], now=True)
        # bob's server keeps the claim, still allocated to the GPU, its owner now alone
        kept, uuids = await claim_of(servers[1])
        assert uuids == [parse_dra_uuid(bob["devices"][0]).uuid]
        name, bobs = kept["metadata"]["name"], pods[1]["metadata"]["uid"]
        await settled("bob alone to own it", lambda: owners("resourceclaim", name) == [bobs])
    finally:
        for server in servers:
            await ClaimedKubeSpawner.stop(server, now=True)
    await gone("resourceclaims")


async def test_a_claim_the_scheduler_cannot_satisfy_fails_with_its_reason(
    dra_broker: GPUBroker, spawner: Spawners
) -> None:
    """The broker granted a GPU that work outside it then took (between two readings): the
    scheduler refuses the claim, and the start says so once it has for the timeout."""
    held = grant(dra_broker, "ann", Size(gpus=1))
    (device,) = (parse_dra_uuid(d) for d in held["devices"])
    outside = serve(spawner(user="train"), {**held, "lease_id": "not-the-brokers"})
    await ClaimedKubeSpawner.start(outside)
    try:
        server = serve(spawner(claim_unschedulable_timeout=2), held)
        started = time.monotonic()
        with pytest.raises(SpawnException) as failed:
            await ClaimedKubeSpawner.start(server)
        waited = time.monotonic() - started
        print(f"the start failed {waited:.1f} s after it began")
        message = str(failed.value)
        assert message.startswith("The cluster cannot place this server's GPU: 0/")
        assert "nodes are available: 1 cannot allocate all claims, " in message
        assert message.endswith(" didn't satisfy plugin(s) [NodeAffinity].")
        assert ". " not in message  # one sentence: nothing of preemption
        assert 2 <= waited < 30
        # its pod and template are gone; the outside work's claim still holds the GPU
        assert names("pods") == [outside.pod_name]
        assert names("resourceclaimtemplates") == [f"{outside.pod_name}-gpu"]
        _, uuids = await claim_of(outside)
        assert uuids == [device.uuid]
    finally:
        await ClaimedKubeSpawner.stop(outside, now=True)


async def test_a_start_taken_up_again_after_the_hubs_restart_leaves_one_claim_of_its_lease(
    tmp_path: Path, spawner: Spawners
) -> None:
    """The hub and its broker die while a server's pod runs but its start has not ended;
    the restarted hub starts it again with the same lease (``reservation.ask`` takes the
    request up again), so the same device: one pod, one template, one claim, of that
    device. A start with another grant (the old lease ended meanwhile) leaves only the
    claim of its own device."""
    state = tmp_path / "state.sqlite"
    with started(make_dra_broker(state)) as first:
        held = grant(first, "ann", Size(gpus=1))
    interrupted = serve(spawner(), held)
    await ClaimedKubeSpawner.start(interrupted)
    old = await asyncio.to_thread(pod_of, interrupted)
    # the restarted hub: a spawner of the same server, from the state the first saved
    again = spawner()
    again.load_state(interrupted.get_state())
    await ClaimedKubeSpawner.start(again)
    try:
        pod = await asyncio.to_thread(pod_of, again)
        assert pod["metadata"]["uid"] != old["metadata"]["uid"]
        claim, uuids = await asyncio.to_thread(allocated, pod)
        assert uuids == [parse_dra_uuid(held["devices"][0]).uuid]
        one = [claim["metadata"]["name"]]
        await settled("the old pod's claim to go", lambda: names("resourceclaims") == one)
        template = f"{again.pod_name}-gpu"
        assert owners("resourceclaimtemplate", template) == [pod["metadata"]["uid"]]
        # the restarted broker finds its lease's claim: the lease lives, its device is its own
        with started(make_dra_broker(state)) as second:
            await second.poll_engine()
            assert second.core.lease(held["lease_id"]).state.value == "active"
            assert not second.core.drained_by(ENGINE)
            # the lease ends while its pod runs, which holds its GPU: a new grant is the other
            second.core.release(held["lease_id"])
            await second.poll_engine()
            other = grant(second, "ann", Size(gpus=1))
        assert other["devices"] != held["devices"]
        moved = serve(spawner(), other)
        await ClaimedKubeSpawner.start(moved)
        pod = await asyncio.to_thread(pod_of, moved)
        claim, uuids = await asyncio.to_thread(allocated, pod)
        assert uuids == [parse_dra_uuid(other["devices"][0]).uuid]
        one = [claim["metadata"]["name"]]
        await settled("only the new grant's claim", lambda: names("resourceclaims") == one)
        assert claim["metadata"]["labels"][LEASE_LABEL] == other["lease_id"]
        assert claim["metadata"]["labels"][BROKER_LABEL] == "gpubroker"
    finally:
        await ClaimedKubeSpawner.stop(again, now=True)
    for kind in ("pods", "resourceclaims", "resourceclaimtemplates"):
        await gone(kind)
    assert kubectl("get", "resourceclaimtemplates", "-n", NAMESPACE, "-o", "name") == ""
