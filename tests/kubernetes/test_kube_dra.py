"""The broker against a real Kubernetes 1.34 control plane whose GPUs are published as
NVIDIA's DRA driver publishes them (``dra_publisher.py``), beside the nodes of the device
plugin (``kube_cluster.py``): the slices are the inventory (whole GPUs, MIG devices under
their GPU, the GPU lent in shares), a claim kube-scheduler allocates to a pod outside the
broker holds back exactly its device, a claim of the broker's own pod pinned by its CEL
selector is the lease's, and the device plugin's nodes keep working beside them.

Shares of a DRA GPU are granted here as on one machine; their claims are the spawner's
(``test_kube_dra_spawner.py``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes_asyncio", reason="the kubernetes extra")

from dra_publisher import NODES, SHARED_MODEL, Mig, device_name, gpu_uuid  # noqa: E402
from kube_broker import drains, lease_of, make_broker, poll  # noqa: E402
from kube_cluster import NAMESPACE, get, gone, kubectl, pod_manifest, running, until  # noqa: E402

from jupyter_gpubroker.engines.dra import DraDevice, parse_dra_uuid  # noqa: E402
from jupyter_gpubroker.engines.kubernetes import BROKER_LABEL, LEASE_LABEL  # noqa: E402
from jupyter_gpubroker.runtime import GPUBroker  # noqa: E402
from jupyter_gpubroker.wire.sizes import Size  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("dra")]
BOTH = (
    "DRA (ResourceSlices of gpu.nvidia.com) on 3 nodes, "
    "the device plugin's extended resources on 5 nodes"
)


@pytest.fixture
def broker(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> Iterator[GPUBroker]:
    """The broker, asked to lend the L40S in shares; its start's log lines in ``caplog``."""
    running = make_broker(
        tmp_path / "state.sqlite", sharing_rules=[{"mode": "shared", "gpus": [SHARED_MODEL]}]
    )
    running.log.propagate = True
    with caplog.at_level(logging.INFO):
        running.start()
    try:
        yield running
    finally:
        running.stop()


def claim_request(device_class: str, expression: str) -> dict[str, Any]:
    """A claim's spec for one device of ``device_class`` that ``expression`` selects."""
    exactly = {"deviceClassName": device_class, "selectors": [{"cel": {"expression": expression}}]}
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def claim_pod(name: str, node: str, claim: dict[str, str], **labels: str) -> dict[str, Any]:
    """A pod on ``node`` whose container uses the claim ``claim`` names (a ResourceClaim's
    or a ResourceClaimTemplate's name)."""
    pod = pod_manifest(name, node, {}, **labels)
    pod["spec"]["resourceClaims"] = [{"name": "gpu", **claim}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return pod


def create(kind: str, name: str, spec: dict[str, Any]) -> None:
    manifest = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec,
    }
    kubectl("create", "-f", "-", input=manifest)


def allocated(claim: str) -> list[tuple[str, str]]:
    """The (pool, device) the scheduler allocated ``claim``."""
    status = get("resourceclaim", claim, "-n", NAMESPACE).get("status", {})
    results = status.get("allocation", {}).get("devices", {}).get("results", [])
    return [(r["pool"], r["device"]) for r in results]


def test_the_drivers_slices_are_the_inventory_beside_the_device_plugins_nodes(
    broker: GPUBroker, caplog: pytest.LogCaptureFixture
) -> None:
    (start,) = [m for r in caplog.get_records("setup") if "devices on" in (m := r.getMessage())]
    assert f"(kubernetes, 8 nodes, from {BOTH})" in start
    assert broker.engine_state()["source"] == BOTH  # type: ignore[index]
    core = broker.core
    dra = [d for d in core.inventory.devices if d.node in NODES]
    assert all(parse_dra_uuid(d.uuid).node == d.node for d in dra)
    per_gpu = {
        (g.node, g.index, g.name, g.mig_enabled): sorted(
            (d.profile or "gpu", d.start) for d in dra if d.gpu_uuid == g.uuid
        )
        for g in core.inventory.gpus
        if g.node in NODES
    }
    assert per_gpu == {
        ("dra-a100-mig", 0, "NVIDIA A100-SXM4-80GB", True): [
            ("1g.10gb", 6),
            ("2g.20gb", 4),
            ("3g.40gb", 0),
        ],
        ("dra-a100-mig", 1, "NVIDIA A100-SXM4-80GB", True): [("1g.10gb", s) for s in range(7)],
        ("dra-h100", 0, "NVIDIA H100 80GB HBM3", False): [("gpu", None)],
        ("dra-h100", 1, "NVIDIA H100 80GB HBM3", False): [("gpu", None)],
        ("dra-l40s", 0, "NVIDIA L40S", False): [("gpu", None)],
    }
    # the device plugin's nodes are still read from their extended resources
    assert {d.node for d in core.inventory.devices} - set(NODES) == {
        "gpu-h100",
        "gpu-a100-mig",
        "gpu-ts",
        "gpu-cordoned",
        "gpu-notready",
    }
    # the GPU meant for shares is lent in shares, held by NVIDIA's MPS (the spawner's claim:
    # test_kube_dra_spawner.py); the device plugin's GPUs never are
    l40s = f"dra:dra-l40s:gpu:{gpu_uuid('dra-l40s', 0)}"
    assert core.inventory.device(l40s) is not None
    shared = broker.sharing_of(l40s) or {}
    assert (shared["mode"], shared["mechanism"]) == ("shared", "mps")
    plugin = next(g.uuid for g in core.inventory.gpus if g.node == "gpu-h100")
    assert broker.sharing_of(plugin)["why"] == "the GPUs are an engine's: it lends them whole"  # type: ignore[index]
    mig = core.submit("bob", Size(profile="2g.20gb"))  # only DRA's node has one
    (granted,) = lease_of(broker, mig.id).devices
    assert granted in {d.uuid for d in dra if d.profile == "2g.20gb"}


def test_a_claim_the_scheduler_allocates_outside_the_broker_holds_back_its_device(
    broker: GPUBroker,
) -> None:
    core = broker.core
    create(
        "ResourceClaim",
        "train",
        claim_request("mig.nvidia.com", "device.attributes['gpu.nvidia.com'].profile == '2g.20gb'"),
    )
    train = claim_pod("train", "dra-a100-mig", {"resourceClaimName": "train"})
    kubectl("create", "-f", "-", input=train)
    assert running("train")["spec"]["nodeName"] == "dra-a100-mig"  # bound by the scheduler
    assert allocated("train") == [
        ("dra-a100-mig", device_name("dra-a100-mig", 0, Mig("2g.20gb", 4)))
    ]
    poll(broker)
    why = f"dra-a100-mig: in use outside the broker by ResourceClaim {NAMESPACE}/train"
    assert drains(broker)["dra-a100-mig"] == [why]
    waiting = core.submit("ann", Size(profile="2g.20gb"))
    assert core.request(waiting.id).state.value == "queued"  # the one 2g.20gb is taken
    kubectl("delete", "pod", "train", "-n", NAMESPACE)
    gone("train")
    kubectl("delete", "resourceclaim", "train", "-n", NAMESPACE, "--wait=true")
    poll(broker)
    assert core.request(waiting.id).state.value == "granted"
    assert "dra-a100-mig" not in drains(broker)


def test_the_brokers_pod_claim_pins_the_granted_device_and_is_the_leases(
    broker: GPUBroker,
) -> None:
    core = broker.core
    granted = core.submit("ann", Size(profile="2g.20gb"))  # a profile only DRA's node has
    lease = lease_of(broker, granted.id)
    (uuid,) = lease.devices
    device = parse_dra_uuid(uuid)
    # a template as the spawner writes one: the granted device's class, a selector on its uuid
    spec = claim_request(device.device_class, device.selector)
    create("ResourceClaimTemplate", "ann-gpu", {"spec": spec})
    labels = {BROKER_LABEL: "gpubroker", LEASE_LABEL: lease.id}
    pod = claim_pod("jupyter-ann", device.node, {"resourceClaimTemplateName": "ann-gpu"}, **labels)
    kubectl("create", "-f", "-", input=pod)
    running("jupyter-ann")
    (made,) = get("pod", "jupyter-ann", "-n", NAMESPACE)["status"]["resourceClaimStatuses"]
    (pool, name) = allocated(made["resourceClaimName"])[0]
    published = get("resourceslices", "--field-selector", f"spec.nodeName={device.node}")
    (shown,) = [d for s in published["items"] for d in s["spec"]["devices"] if d["name"] == name]
    assert pool == device.node and shown["attributes"]["uuid"]["string"] == device.uuid
    poll(broker)
    assert "dra-a100-mig" not in drains(broker)  # the broker's own, not outside use
    # reclaimed while the pod still runs: its device is held until the pod goes
    core.release(lease.id, reason="reclaimed")
    poll(broker)
    assert drains(broker)["dra-a100-mig"] == [
        f"dra-a100-mig: in use by the work of ended lease {lease.id}"
    ]
    kubectl("delete", "pod", "jupyter-ann", "-n", NAMESPACE)
    gone("jupyter-ann")
    until(
        "the pod's claim to go",
        lambda: not kubectl("get", "resourceclaims", "-n", NAMESPACE, "-o", "name"),
    )
    poll(broker)
    assert "dra-a100-mig" not in drains(broker)


def test_device_plugin_pods_and_dra_claims_are_each_counted_on_their_own_nodes(
    broker: GPUBroker,
) -> None:
    kubectl("create", "-f", "-", input=pod_manifest("plugin", "gpu-h100", {"nvidia.com/gpu": "3"}))
    create("ResourceClaim", "whole", claim_request("gpu.nvidia.com", "true"))
    kubectl("create", "-f", "-", input=claim_pod("dra", "dra-h100", {"resourceClaimName": "whole"}))
    running("plugin")
    running("dra")
    ((pool, name),) = allocated("whole")
    assert pool == "dra-h100" and name in ("gpu-0", "gpu-1")
    poll(broker)
    held = drains(broker)
    assert held["gpu-h100"] == ["3 of 4 gpu on gpu-h100 in use outside the broker"] * 3
    assert held["dra-h100"] == [
        f"dra-h100: in use outside the broker by ResourceClaim {NAMESPACE}/whole"
    ]
    minor = int(name.removeprefix("gpu-"))
    (uuid,) = [u for u in broker.core.drained_by("engine") if u.startswith("dra:dra-h100:")]
    assert DraDevice("dra-h100", "gpu", gpu_uuid("dra-h100", minor)) == parse_dra_uuid(uuid)
