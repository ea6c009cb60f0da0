"""The Kubernetes inventory from DRA: the ResourceSlices NVIDIA's DRA driver publishes (as
``dra_publisher.py`` writes them, from the driver's source) and the ResourceClaims allocated
from them, read into the broker's view, and what that view does to a broker.

The objects are the official client's models, deserialized from the JSON the API server
serves (``resource.k8s.io/v1``)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

k8s = pytest.importorskip("kubernetes_asyncio.client", reason="the kubernetes extra")

import dra_publisher  # noqa: E402
from dra_publisher import NODES, Mig, device_name, gpu_uuid, mig_uuid  # noqa: E402
from live_server import free_port  # noqa: E402
from tornado import web  # noqa: E402
from tornado.httpserver import HTTPServer  # noqa: E402

from jupyter_gpubroker.broker.clock import VirtualClock  # noqa: E402
from jupyter_gpubroker.broker.core import Broker  # noqa: E402
from jupyter_gpubroker.broker.store import Store  # noqa: E402
from jupyter_gpubroker.engines import ENGINE, EngineUnavailable, apply_view  # noqa: E402
from jupyter_gpubroker.engines.dra import parse_dra_uuid  # noqa: E402
from jupyter_gpubroker.engines.dra_inventory import quantity  # noqa: E402
from jupyter_gpubroker.engines.kubernetes import (  # noqa: E402
    BROKER_LABEL,
    LEASE_LABEL,
    KubernetesInventory,
    cluster_view,
)
from jupyter_gpubroker.wire.sizes import Size  # noqa: E402

OURS = "gpubroker"
NS = "jhub"


def model(obj: dict[str, Any], klass: str) -> Any:
    """``obj`` as the client deserializes the API server's JSON into ``klass``."""

    class Answer:
        data = json.dumps(obj)

    async def read() -> Any:
        async with k8s.ApiClient() as api:
            return api.deserialize(Answer(), klass)

    return asyncio.run(read())


def node(name: str, allocatable: dict[str, str] | None = None) -> Any:
    manifest = dra_publisher.node_manifest(name)
    manifest["status"]["allocatable"] |= allocatable or {}
    manifest["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return model(manifest, "V1Node")


def published(name: str) -> Any:
    return model(dra_publisher.resource_slice(name, f"uid-{name}"), "V1ResourceSlice")


def pod(name: str, uid: str, **labels: str) -> Any:
    return model(
        {
            "metadata": {"name": name, "namespace": NS, "uid": uid, "labels": labels},
            "spec": {"nodeName": "dra-h100", "containers": [{"name": "c", "image": "x"}]},
            "status": {"phase": "Running"},
        },
        "V1Pod",
    )


def claim(
    name: str, pool: str, device: str, reserved: str = "", owner: str = "", driver: str = ""
) -> Any:
    status: dict[str, Any] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": driver or dra_publisher.DRIVER,
                        "pool": pool,
                        "device": device,
                    }
                ]
            }
        }
    }
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": "p", "uid": reserved}]
    owners = [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": owner}] if owner else []
    return model(
        {
            "metadata": {"name": name, "namespace": NS, "ownerReferences": owners},
            "spec": {"devices": {"requests": []}},
            "status": status if pool else {},
        },
        "ResourceV1ResourceClaim",
    )


ALL = [node(n) for n in NODES]
SLICES = [published(n) for n in NODES]


def test_the_drivers_slices_are_the_inventory_with_mig_devices_under_their_gpu() -> None:
    view = cluster_view(ALL, [], OURS, SLICES, [])
    assert view.source == "DRA (ResourceSlices of gpu.nvidia.com)"
    gpus = [(g.node, g.index, g.model, g.mig_enabled, g.memory_mib) for g in view.inventory.gpus]
    assert gpus == [
        ("dra-a100-mig", 0, "A100-80GB", True, 81920),
        ("dra-a100-mig", 1, "A100-80GB", True, 81920),
        ("dra-h100", 0, "H100-80GB", False, 81559),
        ("dra-h100", 1, "H100-80GB", False, 81559),
        ("dra-l40s", 0, "L40S-48GB", False, 46068),
    ]
    first = view.inventory.gpus[0]
    assert first.uuid == f"dra:dra-a100-mig:gpu:{gpu_uuid('dra-a100-mig', 0)}"
    assert first.name == "NVIDIA A100-SXM4-80GB" and first.pci_bus_id == "0000:0f:00.0"
    # the MIG devices of each GPU, by parentUUID, with their profile, placement and memory
    on_first = [
        (d.profile, d.start, d.compute_slices, d.memory_mib)
        for d in view.inventory.devices
        if d.gpu_uuid == first.uuid
    ]
    assert sorted(on_first) == [
        ("1g.10gb", 6, 1, 9728),
        ("2g.20gb", 4, 2, 19968),
        ("3g.40gb", 0, 3, 40192),
    ]
    second = [d for d in view.inventory.devices if d.gpu_uuid == view.inventory.gpus[1].uuid]
    assert sorted(d.start for d in second) == list(range(7))
    assert {d.profile for d in second} == {"1g.10gb"}
    # each device is named for its own uuid attribute, which a claim's selector pins
    mig = next(d for d in second if d.start == 3)
    named = parse_dra_uuid(mig.uuid)
    assert (named.node, named.kind) == ("dra-a100-mig", "mig")
    assert named.uuid == mig_uuid("dra-a100-mig", 1, Mig("1g.10gb", 3))
    assert named.selector == f'device.attributes["gpu.nvidia.com"].uuid == "{named.uuid}"'
    whole = [d for d in view.inventory.devices if d.kind == "gpu"]
    assert [(d.node, d.memory_mib) for d in whole] == [
        ("dra-h100", 81559),
        ("dra-h100", 81559),
        ("dra-l40s", 46068),
    ]
    assert all(d.uuid == d.gpu_uuid for d in whole)
    assert view.outside == {} and view.outside_devices == {} and view.down == {}


def test_only_a_pools_newest_generation_counts_and_only_the_drivers_gpus() -> None:
    older, newer = (published("dra-h100") for _ in range(2))
    newer.spec.pool.generation = 2
    newer.spec.devices = newer.spec.devices[:1]
    newer.spec.devices[0].capacity["memory"].value = "80Gi"  # what the slice says, not the catalog
    vfio = published("dra-l40s")
    vfio.spec.devices[0].attributes["type"].string = "vfio"
    other = published("dra-a100-mig")
    other.spec.driver = "gpu.example.com"
    view = cluster_view(ALL, [], OURS, [older, newer, vfio, other], [])
    assert [(d.node, d.memory_mib) for d in view.inventory.devices] == [("dra-h100", 81920)]
    # a node the broker does not hand out (node_selector) is not read
    assert cluster_view(ALL[:1], [], OURS, SLICES, []).inventory.devices[0].node == "dra-h100"


def test_allocated_claims_are_outside_use_or_the_brokers_grants() -> None:
    pods = [
        pod("train", "u-train"),
        pod("jupyter-ann", "u-ann", **{BROKER_LABEL: OURS, LEASE_LABEL: "l-ann"}),
        pod("jupyter-bob", "u-bob", **{BROKER_LABEL: OURS, LEASE_LABEL: "l-bob"}),
        pod("jupyter-new", "u-new", **{BROKER_LABEL: OURS}),  # the broker's, no lease yet
    ]
    mig = device_name("dra-a100-mig", 1, Mig("1g.10gb", 2))
    claims = [
        claim("train-gpu", "dra-h100", "gpu-1", reserved="u-train"),
        claim("ann-gpu", "dra-a100-mig", mig, reserved="u-ann"),
        claim("bob-gpu-x7k2p", "dra-l40s", "gpu-0", owner="u-bob"),  # from bob's template
        claim("new-gpu", "dra-h100", "gpu-0", reserved="u-new"),
        claim("pending", "", ""),  # not allocated
        claim("fpga", "dra-h100", "gpu-0", driver="fpga.example.com"),
    ]
    view = cluster_view(ALL, pods, OURS, SLICES, claims)
    h100 = f"dra:dra-h100:gpu:{gpu_uuid('dra-h100', 1)}"
    assert view.outside_devices == {h100: f"ResourceClaim {NS}/train-gpu"}
    assert view.lease_devices == {
        "l-ann": {f"dra:dra-a100-mig:mig:{mig_uuid('dra-a100-mig', 1, Mig('1g.10gb', 2))}"},
        "l-bob": {f"dra:dra-l40s:gpu:{gpu_uuid('dra-l40s', 0)}"},
    }
    # the broker drains exactly that device, with the claim that holds it; the leases'
    # devices too, since this broker has no such leases (as if they had ended)
    broker = Broker(Store(), view.inventory, clock=VirtualClock(1_700_000_000.0))
    apply_view(broker, view)
    drains = {u: why for u, (why, *_) in broker.drained().items()}
    (ann,) = view.lease_devices["l-ann"]
    (bob,) = view.lease_devices["l-bob"]
    assert drains == {
        h100: f"dra-h100: in use outside the broker by ResourceClaim {NS}/train-gpu",
        ann: "dra-a100-mig: in use by the work of ended lease l-ann",
        bob: "dra-l40s: in use by the work of ended lease l-bob",
    }
    assert broker.drained_by(ENGINE) == set(drains)
    two = broker.submit("cat", Size(gpus=2))
    assert broker.request(two.id).state.value == "queued"  # one H100 is free, not two
    # gone, the claim frees it
    apply_view(broker, cluster_view(ALL, pods, OURS, SLICES, claims[1:]))
    assert broker.request(two.id).state.value == "granted"
    assert broker.drained_by(ENGINE) == {ann, bob}


def test_the_device_of_an_ended_lease_is_held_until_its_claim_goes() -> None:
    view = cluster_view(ALL, [], OURS, SLICES, [])
    broker = Broker(Store(), view.inventory, clock=VirtualClock(1_700_000_000.0))
    granted = broker.submit("ann", Size(gpus=1))
    lease = broker.lease(broker.request(granted.id).lease_id or "")
    (device,) = lease.devices
    node = parse_dra_uuid(device).node
    ours = pod("jupyter-ann", "u-ann", **{BROKER_LABEL: OURS, LEASE_LABEL: lease.id})
    name = "gpu-0" if device.endswith(gpu_uuid(node, 0)) else "gpu-1"
    held = [claim("ann-gpu", node, name, reserved="u-ann")]
    apply_view(broker, cluster_view(ALL, [ours], OURS, SLICES, held))
    assert not broker.drained_by(ENGINE)  # its own grant is not outside use
    broker.release(lease.id, reason="reclaimed")
    apply_view(broker, cluster_view(ALL, [ours], OURS, SLICES, held))
    assert broker.drained()[device][0] == f"{node}: in use by the work of ended lease {lease.id}"
    apply_view(broker, cluster_view(ALL, [], OURS, SLICES, []))  # the pod and claim are gone
    assert device not in broker.drained()


def test_a_cluster_with_both_reads_each_node_from_its_own_source() -> None:
    plugin = model(
        {
            "metadata": {
                "name": "gpu-old",
                "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            },
            "status": {
                "allocatable": {"nvidia.com/gpu": "4"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        },
        "V1Node",
    )
    # a DRA node whose extended resources are also there is read from its slices alone
    both = node("dra-h100", {"nvidia.com/gpu": "2"})
    view = cluster_view([plugin, both], [], OURS, SLICES, [])
    assert sorted({d.uuid.split(":")[0] for d in view.inventory.devices}) == ["dra", "k8s"]
    assert sum(d.node == "dra-h100" for d in view.inventory.devices) == 2
    assert sum(d.node == "gpu-old" for d in view.inventory.devices) == 4
    assert view.source == (
        "DRA (ResourceSlices of gpu.nvidia.com) on 1 node, "
        "the device plugin's extended resources on 1 node"
    )
    assert (
        cluster_view([plugin], [], OURS, [], []).source == "the device plugin's extended resources"
    )


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("81559Mi", 81559 * 2**20),
        ("80Gi", 80 * 2**30),
        ("42", 42),
        ("1e3", 1000),
        ("1.5Ki", 1536),
        ("2G", 2 * 10**9),
        ("1500m", 1),
        ("many", 0),
        (None, 0),
    ],
)
def test_quantities_read_as_kubernetes_writes_them(text: str | None, value: int) -> None:
    assert quantity(text) == value


class ApiServer(web.RequestHandler):
    """An API server's list calls: nodes and pods, and ``dra`` for resource.k8s.io/v1 (its
    HTTP status: 404 where Kubernetes before 1.34 serves no such API, 403 where RBAC
    forbids it)."""

    def initialize(self, dra: int) -> None:
        self.dra = dra

    def get(self, path: str) -> None:
        if path.startswith("apis/resource.k8s.io/"):
            self.set_status(self.dra)
            self.write({"kind": "Status", "code": self.dra})
            return
        items = [
            {"metadata": {"name": "gpu-old"}, "status": {"allocatable": {"nvidia.com/gpu": "2"}}}
        ]
        self.write({"items": items if path == "api/v1/nodes" else []})


@pytest.mark.parametrize("dra", [404, 403])
async def test_a_cluster_without_dra_or_rbac_for_it_is_read_or_says_what_to_grant(
    kubeconfig: Any, dra: int
) -> None:
    port = free_port()
    server = HTTPServer(web.Application([(r"/(.*)", ApiServer, {"dra": dra})]))
    server.listen(port, "127.0.0.1")
    try:
        source = KubernetesInventory(kubeconfig=str(kubeconfig(f"http://127.0.0.1:{port}")))
        if dra == 404:  # no resource.k8s.io/v1: the device plugin's resources alone
            view = await source.read()
            assert view.source == "the device plugin's extended resources"
            assert [d.node for d in view.inventory.devices] == ["gpu-old", "gpu-old"]
            return
        with pytest.raises(EngineUnavailable) as refused:
            await source.read()
        assert str(refused.value) == (
            "the Kubernetes API server refused to list resourceslices (403 Forbidden): grant the "
            "broker's service account list on resourceslices and resourceclaims (add to its "
            "ClusterRole the rule apiGroups: [resource.k8s.io], resources: [resourceslices, "
            "resourceclaims], verbs: [list])"
        )
    finally:
        server.stop()
