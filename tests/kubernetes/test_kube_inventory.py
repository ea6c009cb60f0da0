"""The Kubernetes inventory: what the API server's nodes and pods say, read into the
broker's view, and what that view does to a broker.

The nodes are built with the official client's models in the shapes NVIDIA documents
for its device plugin and GPU feature discovery. They are written from that
documentation, not recorded from a cluster:

- the MIG strategies and the resources they advertise (``nvidia.com/gpu``, and under
  ``mixed`` ``nvidia.com/mig-<slice_count>g.<memory_size>gb``):
  https://github.com/NVIDIA/k8s-device-plugin#configuration-option-details
- the node labels of each strategy (``nvidia.com/mig.strategy``, ``nvidia.com/gpu.product``
  with ``-MIG-<profile>`` under ``single``, ``nvidia.com/<MIG_TYPE>.memory`` under
  ``mixed``): https://github.com/NVIDIA/k8s-device-plugin/blob/main/docs/gpu-feature-discovery/README.md
- GPU sharing (time-slicing and MPS): each device advertised as ``replicas`` shares, under
  its own resource name or, with ``renameByDefault``, as ``<resource>.shared``; the labels
  ``nvidia.com/gpu.replicas``, ``nvidia.com/gpu.sharing-strategy`` and the product's
  ``-SHARED`` suffix: https://github.com/NVIDIA/k8s-device-plugin#shared-access-to-gpus
  and https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/gpu-sharing.html
  (the per-MIG-type ``nvidia.com/mig-<profile>.replicas`` follows GFD's naming of MIG
  labels; the documentation shows it for ``nvidia.com/gpu`` only)
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

k8s = pytest.importorskip("kubernetes_asyncio.client", reason="the kubernetes extra")

from jupyter_gpubroker.broker.clock import VirtualClock  # noqa: E402
from jupyter_gpubroker.broker.core import Broker  # noqa: E402
from jupyter_gpubroker.broker.store import Store  # noqa: E402
from jupyter_gpubroker.engines import (  # noqa: E402
    ENGINE,
    EngineUnavailable,
    apply_view,
    release_ended,
)
from jupyter_gpubroker.engines.kubernetes import (  # noqa: E402
    BROKER_LABEL,
    LEASE_LABEL,
    PLACEHOLDER_LABEL,
    KubernetesInventory,
    cluster_view,
    parse_device_uuid,
    resource_name,
)
from jupyter_gpubroker.wire.sizes import Size  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OURS = "gpubroker"
READY = k8s.V1NodeCondition(type="Ready", status="True", reason="KubeletReady")


def node(
    name: str,
    labels: dict[str, str],
    allocatable: dict[str, str],
    *,
    ready: Any = READY,
    unschedulable: bool | None = None,
) -> Any:
    return k8s.V1Node(
        metadata=k8s.V1ObjectMeta(name=name, labels={"kubernetes.io/hostname": name, **labels}),
        spec=k8s.V1NodeSpec(unschedulable=unschedulable),
        status=k8s.V1NodeStatus(
            allocatable={"cpu": "64", "memory": "512Gi", "pods": "110", **allocatable},
            capacity={"cpu": "64", "memory": "512Gi", "pods": "110", **allocatable},
            conditions=[ready],
        ),
    )


def pod(
    name: str,
    on: str | None,
    limits: dict[str, str],
    *,
    phase: str = "Running",
    labels: dict[str, str] | None = None,
    init: dict[str, str] | None = None,
) -> Any:
    def container(cname: str, lim: dict[str, str]) -> Any:
        return k8s.V1Container(
            name=cname,
            image="quay.io/jupyter/base-notebook",
            resources=k8s.V1ResourceRequirements(limits=lim),
        )

    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name, namespace="jhub", labels=labels or {}),
        spec=k8s.V1PodSpec(
            node_name=on,
            containers=[container("main", limits)],
            init_containers=[container("init", init)] if init else None,
        ),
        status=k8s.V1PodStatus(phase=phase),
    )


# Eight A100-40GB, each cut into 7 x 1g.5gb, under the single strategy: 56 MIG devices
# advertised as nvidia.com/gpu (GFD's example of the single strategy).
SINGLE = node(
    "dgx-single",
    {
        "nvidia.com/mig.strategy": "single",
        "nvidia.com/gpu.product": "A100-SXM4-40GB-MIG-1g.5gb",
        "nvidia.com/gpu.count": "56",
        "nvidia.com/gpu.memory": "5120",
        "nvidia.com/gpu.slices.gi": "1",
        "nvidia.com/gpu.slices.ci": "1",
    },
    {"nvidia.com/gpu": "56"},
)
# Four A100-40GB under the mixed strategy: two whole, one as 7 x 1g.5gb, one as 2 x 3g.20gb.
MIXED = node(
    "dgx-mixed",
    {
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/gpu.product": "A100-SXM4-40GB",
        "nvidia.com/gpu.count": "4",
        "nvidia.com/gpu.memory": "40960",
        "nvidia.com/mig-1g.5gb.count": "7",
        "nvidia.com/mig-1g.5gb.memory": "5120",
        "nvidia.com/mig-3g.20gb.count": "2",
        "nvidia.com/mig-3g.20gb.memory": "20480",
    },
    {"nvidia.com/gpu": "2", "nvidia.com/mig-1g.5gb": "7", "nvidia.com/mig-3g.20gb": "2"},
)
CPU_ONLY = node("cpu-1", {}, {})


def classes(view: Any, node_name: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for d in view.inventory.devices:
        if d.node == node_name:
            cls = d.profile or "gpu"
            found[cls] = found.get(cls, 0) + 1
    return found


def test_the_single_strategy_shows_mig_devices_as_nvidia_com_gpu() -> None:
    view = cluster_view([SINGLE, CPU_ONLY], [], "gpubroker")
    assert classes(view, "dgx-single") == {"1g.5gb": 56}
    assert {d.node for d in view.inventory.devices} == {"dgx-single"}  # no GPUs, not listed
    d = view.inventory.devices[0]
    assert (d.kind, d.memory_mib, d.compute_slices) == ("mig", 4864, 1)  # the catalog's size
    assert d.uuid == "k8s:dgx-single:1g.5gb:0"
    assert parse_device_uuid(d.uuid) == ("dgx-single", "1g.5gb")
    # a pod gets one by asking for nvidia.com/gpu: the plugin hands out slices under that name
    assert resource_name("1g.5gb", "single") == "nvidia.com/gpu"
    assert view.outside == {} and view.down == {}


def test_the_mixed_strategy_shows_each_profile_and_the_whole_gpus() -> None:
    view = cluster_view([MIXED], [], "gpubroker")
    assert classes(view, "dgx-mixed") == {"gpu": 2, "1g.5gb": 7, "3g.20gb": 2}
    by_class = {d.profile or "gpu": d for d in view.inventory.devices}
    assert by_class["gpu"].memory_mib == 40960 and by_class["gpu"].kind == "gpu"
    assert by_class["3g.20gb"].compute_slices == 3
    assert by_class["3g.20gb"].memory_mib == 19968
    assert resource_name("3g.20gb", "mixed") == "nvidia.com/mig-3g.20gb"
    assert resource_name("1g.10gb+me", "mixed") == "nvidia.com/mig-1g.10gb.me"
    assert resource_name("gpu", "mixed") == "nvidia.com/gpu"
    # UUIDs are stable from one read to the next
    again = cluster_view([MIXED], [], "gpubroker")
    assert [d.uuid for d in again.inventory.devices] == [d.uuid for d in view.inventory.devices]


def test_pods_outside_the_broker_count_and_the_brokers_own_do_not() -> None:
    """Nor its placeholder pods, which keep GPUs warm ahead of the forecast: their GPUs are
    free to its grants, whose pods preempt them (another broker's are outside use)."""
    pods = [
        pod("train-a", "dgx-mixed", {"nvidia.com/mig-1g.5gb": "2"}),
        # an init container that needs more than the app containers sets the request
        pod("etl", "dgx-mixed", {"nvidia.com/gpu": "0"}, init={"nvidia.com/gpu": "1"}),
        pod("done", "dgx-mixed", {"nvidia.com/mig-3g.20gb": "1"}, phase="Succeeded"),
        pod("failed", "dgx-mixed", {"nvidia.com/mig-3g.20gb": "1"}, phase="Failed"),
        pod("pending", None, {"nvidia.com/mig-3g.20gb": "2"}, phase="Pending"),
        pod(
            "jupyter-ann", "dgx-mixed", {"nvidia.com/gpu": "1"}, labels={BROKER_LABEL: "gpubroker"}
        ),
        # another hub's broker: outside this one
        pod("jupyter-zed", "dgx-single", {"nvidia.com/gpu": "3"}, labels={BROKER_LABEL: "other"}),
        pod("warm-1", "dgx-mixed", {"nvidia.com/gpu": "1"}, labels={PLACEHOLDER_LABEL: OURS}),
        pod("warm-2", None, {"nvidia.com/gpu": "1"}, labels={PLACEHOLDER_LABEL: OURS}),
        pod("warm-z", "dgx-single", {"nvidia.com/gpu": "1"}, labels={PLACEHOLDER_LABEL: "other"}),
    ]
    view = cluster_view([SINGLE, MIXED], pods, "gpubroker")
    assert view.outside == {
        ("dgx-mixed", "1g.5gb"): 2,
        ("dgx-mixed", "gpu"): 1,
        ("dgx-single", "1g.5gb"): 4,
    }
    assert view.grants == {} and set(view.holders or {}) == set()


def test_a_cordoned_or_not_ready_node_is_down_with_the_reason() -> None:
    cordoned = node("gpu-c", {}, {"nvidia.com/gpu": "8"}, unschedulable=True)
    lost = node(
        "gpu-l",
        {},
        {"nvidia.com/gpu": "8"},
        ready=k8s.V1NodeCondition(
            type="Ready",
            status="Unknown",
            reason="NodeStatusUnknown",
            message="Kubelet stopped posting node status.",
        ),
    )
    view = cluster_view([cordoned, lost, MIXED], [], "gpubroker")
    assert view.down == {
        "gpu-c": "cordoned (unschedulable)",
        "gpu-l": "NotReady (NodeStatusUnknown: Kubelet stopped posting node status.)",
    }


def test_the_view_makes_the_broker_respect_the_cluster(tmp_path: Any) -> None:
    lost = node(
        "gpu-l",
        {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        {"nvidia.com/gpu": "8"},
        ready=k8s.V1NodeCondition(type="Ready", status="False", reason="KubeletNotReady"),
    )
    pods = [pod("train-a", "dgx-mixed", {"nvidia.com/mig-1g.5gb": "6"})]
    view = cluster_view([MIXED, lost], pods, "gpubroker")
    assert view.inventory.devices[-1].memory_mib == 81559  # H100 80GB, from the catalog
    store = Store()
    broker = Broker(store, view.inventory, clock=VirtualClock(1_700_000_000.0))
    apply_view(broker, view)
    reasons = {broker.drained()[u][0] for u in broker.drained_by(ENGINE)}
    assert reasons == {
        "6 of 7 1g.5gb on dgx-mixed in use outside the broker",
        "gpu-l: NotReady (KubeletNotReady)",
    }
    first = broker.submit("ann", Size(profile="1g.5gb"))
    second = broker.submit("bob", Size(profile="1g.5gb"))
    three = broker.submit("cat", Size(gpus=3))  # 8 on the NotReady node, 2 on dgx-mixed
    assert [broker.request(r.id).state.value for r in (first, second, three)] == [
        "granted",
        "queued",
        "queued",
    ]
    (lease,) = broker.leases()
    assert parse_device_uuid(lease.devices[0]) == ("dgx-mixed", "1g.5gb")
    store.close()


async def test_an_api_server_that_does_not_answer_makes_the_engine_unavailable(
    kubeconfig: Any, tmp_path: Any
) -> None:
    source = KubernetesInventory(kubeconfig=str(kubeconfig()), request_timeout=5)
    with pytest.raises(EngineUnavailable, match=r"at http://127\.0\.0\.1:\d+ does not answer"):
        await source.read()
    missing = KubernetesInventory(kubeconfig=str(tmp_path / "nowhere"))
    with pytest.raises(EngineUnavailable, match="no Kubernetes API server configured"):
        await missing.read()


def test_a_device_of_another_engine_is_not_parsed() -> None:
    with pytest.raises(ValueError, match="not a Kubernetes device"):
        parse_device_uuid("GPU-8c3a5d6e-0000-0000-0000-000000000000")


def test_the_source_is_registered_as_the_kubernetes_engine() -> None:
    """So the broker finds it by the name ``kubernetes`` once the wheel is installed."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and newer
    points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    module, attr = points["jupyter_gpubroker.engines"]["kubernetes"].split(":")
    assert getattr(importlib.import_module(module), attr) is KubernetesInventory
    assert KubernetesInventory.name == "kubernetes"


# Four H100s time-sliced 4 ways under the plugin's default naming: 16 x nvidia.com/gpu.
TIME_SLICED = node(
    "h100-ts",
    {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-SHARED",
        "nvidia.com/gpu.count": "4",
        "nvidia.com/gpu.replicas": "4",
        "nvidia.com/gpu.sharing-strategy": "time-slicing",
    },
    {"nvidia.com/gpu": "16"},
)
# Two H100s shared by MPS 4 ways, renamed (renameByDefault): 8 x nvidia.com/gpu.shared.
MPS_RENAMED = node(
    "h100-mps",
    {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count": "2",
        "nvidia.com/gpu.replicas": "4",
        "nvidia.com/gpu.sharing-strategy": "mps",
    },
    {"nvidia.com/gpu.shared": "8"},
)


def test_shared_gpus_count_once_and_are_withheld_with_the_reason() -> None:
    pods = [pod("notebook", "h100-ts", {"nvidia.com/gpu": "3"})]  # three shares, not GPUs
    view = cluster_view([TIME_SLICED, MPS_RENAMED, MIXED], pods, OURS)
    assert classes(view, "h100-ts") == {"gpu": 4}  # the physical GPUs, not the 16 shares
    assert classes(view, "h100-mps") == {"gpu": 2}
    assert {g.name for g in view.inventory.gpus if g.node == "h100-ts"} == {"NVIDIA-H100-80GB-HBM3"}
    assert view.withheld[("h100-ts", "gpu")].startswith(
        "the device plugin shares each gpu 4 ways (time-slicing), so a pod there gets a share"
    )
    assert "(mps)" in view.withheld[("h100-mps", "gpu")]
    assert ("dgx-mixed", "gpu") not in view.withheld  # an unshared node is the broker's
    assert view.outside == {}  # shares in use change nothing: none of them is granted

    broker = Broker(Store(), view.inventory, clock=VirtualClock(1_700_000_000.0))
    apply_view(broker, view)
    drained = broker.drained()
    shared = [d.uuid for d in view.inventory.devices if d.node in ("h100-ts", "h100-mps")]
    assert sorted(broker.drained_by(ENGINE)) == sorted(shared)
    assert drained[shared[0]][0].startswith("h100-mps: the device plugin shares each gpu")
    # dgx-mixed has two whole GPUs; the six shared ones are never granted
    two = broker.submit("ann", Size(gpus=2))
    three = broker.submit("bob", Size(gpus=3))
    assert (broker.request(two.id).state.value, broker.request(three.id).state.value) == (
        "granted",
        "queued",
    )
    assert {parse_device_uuid(d)[0] for d in broker.leases()[0].devices} == {"dgx-mixed"}


def test_a_shared_mig_profile_is_withheld_and_the_others_are_not() -> None:
    mixed_shared = node(
        "dgx-mig-ts",
        {
            "nvidia.com/mig.strategy": "mixed",
            "nvidia.com/gpu.product": "A100-SXM4-40GB",
            "nvidia.com/mig-1g.5gb.count": "7",
            "nvidia.com/mig-1g.5gb.replicas": "2",
            "nvidia.com/gpu.sharing-strategy": "time-slicing",
        },
        {"nvidia.com/mig-1g.5gb.shared": "14", "nvidia.com/mig-3g.20gb": "2"},
    )
    view = cluster_view([mixed_shared], [], OURS)
    assert classes(view, "dgx-mig-ts") == {"1g.5gb": 7, "3g.20gb": 2}
    assert list(view.withheld) == [("dgx-mig-ts", "1g.5gb")]
    assert "each 1g.5gb 2 ways" in view.withheld[("dgx-mig-ts", "1g.5gb")]


def test_a_pod_whose_lease_ended_holds_its_gpu_until_it_stops() -> None:
    view = cluster_view([MIXED], [], OURS)
    broker = Broker(Store(), view.inventory, clock=VirtualClock(1_700_000_000.0))
    ann = broker.submit("ann", Size(profile="3g.20gb"))
    lease_id = broker.request(ann.id).lease_id or ""
    labels = {BROKER_LABEL: OURS, LEASE_LABEL: lease_id}
    running = [pod("jupyter-ann", "dgx-mixed", {"nvidia.com/mig-3g.20gb": "1"}, labels=labels)]
    view = cluster_view([MIXED], running, OURS)
    assert view.grants == {lease_id: {("dgx-mixed", "3g.20gb"): 1}} and view.outside == {}
    apply_view(broker, view)
    assert broker.drained_by(ENGINE) == set()  # its own pod, its lease active

    broker.release(lease_id)  # e.g. reclaimed: the spawner has not stopped the pod yet
    apply_view(broker, view)
    (held,) = broker.drained_by(ENGINE)
    assert broker.drained()[held][0] == (
        f"1 of 2 3g.20gb on dgx-mixed in use outside the broker or by the work of ended lease "
        f"{lease_id}"
    )
    bob = broker.submit("bob", Size(profile="3g.20gb"))
    cat = broker.submit("cat", Size(profile="3g.20gb"))
    assert [broker.request(r.id).state.value for r in (bob, cat)] == ["granted", "queued"]
    apply_view(broker, cluster_view([MIXED], [], OURS))  # the pod has stopped
    broker.schedule()
    assert broker.request(cat.id).state.value == "granted"


def test_a_lease_whose_pod_is_gone_is_released_and_a_pending_pods_is_not() -> None:
    clock = VirtualClock(1_700_000_000.0)
    broker = Broker(Store(), cluster_view([MIXED], [], OURS).inventory, clock=clock)
    leases = {}
    for user in ("ann", "bob", "cat"):
        r = broker.submit(user, Size(profile="1g.5gb"))
        leases[user] = broker.request(r.id).lease_id or ""

    def ours(name: str, user: str, on: str | None, phase: str) -> Any:
        labels = {BROKER_LABEL: OURS, LEASE_LABEL: leases[user]}
        return pod(name, on, {"nvidia.com/mig-1g.5gb": "1"}, phase=phase, labels=labels)

    pods = [
        ours("jupyter-ann", "ann", "dgx-mixed", "Running"),
        ours("jupyter-bob", "bob", None, "Pending"),  # not bound yet: at the scheduler
        ours("jupyter-cat", "cat", "dgx-mixed", "Failed"),  # ended
    ]
    view = cluster_view([MIXED], pods, OURS)
    assert view.holders == {leases["ann"]: "jhub/jupyter-ann", leases["bob"]: "jhub/jupyter-bob"}
    assert view.grants == {leases["ann"]: {("dgx-mixed", "1g.5gb"): 1}}
    clock.advance(120)
    assert release_ended(broker, view, 60, "Kubernetes pod") == [leases["cat"]]
    assert broker.lease(leases["cat"]).reason == "its Kubernetes pod ended"
    assert {x.user for x in broker.leases()} == {"ann", "bob"}
