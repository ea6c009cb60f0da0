"""Against a real cluster (kind or k3s; docs/kubernetes.md says how): the inventory reads a
node that advertises GPU resources, counts a pod outside the broker, knows the broker's own
pod and a cordoned node, and the spawner's pod lands on the granted node.

No cluster can run where these tests were written: they are skipped without
``GPUBROKER_TEST_CLUSTER=1`` and were not run there. A node without GPUs stands in for one
by advertising them as extended resources, as Kubernetes documents
(https://kubernetes.io/docs/tasks/administer-cluster/extended-resource-node/); the
scheduler and kubelet count them like the device plugin's, nothing uses them.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        os.environ.get("GPUBROKER_TEST_CLUSTER") != "1",
        reason="needs a Kubernetes cluster: set GPUBROKER_TEST_CLUSTER=1 with KUBECONFIG "
        "(docs/kubernetes.md)",
    ),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

k8s = pytest.importorskip("kubernetes_asyncio", reason="the kubernetes extra")

from hub_spawner.kubernetes import GPUBrokerKubeSpawner  # noqa: E402
from jupyter_gpubroker.engines.kubernetes import KubernetesInventory  # noqa: E402

NAMESPACE = os.environ.get("GPUBROKER_TEST_NAMESPACE", "default")
GPUS = {"nvidia.com/gpu": "2", "nvidia.com/mig-1g.10gb": "7"}
LABELS = {"nvidia.com/mig.strategy": "mixed", "nvidia.com/gpu.product": "A100-SXM4-80GB"}


async def api() -> Any:
    await k8s.config.load_kube_config()
    return k8s.client.CoreV1Api(k8s.client.ApiClient())


async def until(check: Any, what: str, seconds: float = 120) -> Any:
    for _ in range(int(seconds * 2)):
        found = await check()
        if found:
            return found
        await asyncio.sleep(0.5)
    raise AssertionError(f"not within {seconds:g} s: {what}")


@pytest.fixture
def gpu_node() -> Iterator[str]:
    """A node of the cluster advertising 2 GPUs and 7 x 1g.10gb, labelled as GPU feature
    discovery labels a mixed-strategy A100 node; given back as it was."""

    async def patch(add: bool) -> str:
        core = await api()
        nodes = (await core.list_node()).items
        name = os.environ.get("GPUBROKER_TEST_NODE") or nodes[-1].metadata.name
        ops = [
            {"op": "add" if add else "remove", "path": f"/status/capacity/{r.replace('/', '~1')}"}
            | ({"value": n} if add else {})
            for r, n in GPUS.items()
        ]
        await core.patch_node_status(name, ops)
        labels = {k: (v if add else None) for k, v in LABELS.items()}
        await core.patch_node(
            name, {"metadata": {"labels": labels}, "spec": {"unschedulable": None}}
        )
        if add:

            async def advertised() -> bool:
                node = await core.read_node(name)
                return all(node.status.allocatable.get(r) == n for r, n in GPUS.items())

            await until(advertised, f"{name} advertises {GPUS}")
        await core.api_client.close()
        return name

    name = asyncio.run(patch(True))
    yield name
    asyncio.run(patch(False))


async def test_the_inventory_reads_the_nodes_gpus_and_work_outside_the_broker(
    gpu_node: str,
) -> None:
    core = await api()
    source = KubernetesInventory()
    try:
        view = await source.read()
        mine = [d for d in view.inventory.devices if d.node == gpu_node]
        assert sorted({d.profile or "gpu" for d in mine}) == ["1g.10gb", "gpu"] and len(mine) == 9
        outside = k8s.client.V1Pod(
            metadata=k8s.client.V1ObjectMeta(name="gpubroker-test-outside"),
            spec=k8s.client.V1PodSpec(
                node_name=gpu_node,
                containers=[
                    k8s.client.V1Container(
                        name="c",
                        image="registry.k8s.io/pause:3.9",
                        resources=k8s.client.V1ResourceRequirements(
                            limits={"nvidia.com/mig-1g.10gb": "2"}
                        ),
                    )
                ],
            ),
        )
        await core.create_namespaced_pod(NAMESPACE, outside)

        async def counted() -> Any:
            return (await source.read()).outside.get((gpu_node, "1g.10gb")) == 2

        await until(counted, "the outside pod's two slices counted")
        await core.patch_node(gpu_node, {"spec": {"unschedulable": True}})

        async def cordoned() -> Any:
            return (await source.read()).down.get(gpu_node) == "cordoned (unschedulable)"

        await until(cordoned, f"{gpu_node} down as cordoned")
    finally:
        await core.delete_namespaced_pod(
            "gpubroker-test-outside", NAMESPACE, grace_period_seconds=0
        )
        await source.close()
        await core.api_client.close()


async def test_the_spawners_pod_lands_on_the_granted_node_and_is_the_brokers(
    gpu_node: str,
) -> None:
    spawner = GPUBrokerKubeSpawner(
        _mock=True, namespace=NAMESPACE, image="registry.k8s.io/pause:3.9", cmd=None
    )
    spawner._gpu = {"lease_id": "l-test", "devices": [f"k8s:{gpu_node}:1g.10gb:0"]}
    pod = await spawner.get_pod_manifest()
    core = await api()
    source = KubernetesInventory()
    try:
        await core.create_namespaced_pod(NAMESPACE, pod)

        async def bound() -> Any:
            return (await core.read_namespaced_pod(pod.metadata.name, NAMESPACE)).spec.node_name

        assert await until(bound, "the pod bound to a node") == gpu_node
        assert (await source.read()).outside.get((gpu_node, "1g.10gb")) is None
    finally:
        await core.delete_namespaced_pod(pod.metadata.name, NAMESPACE, grace_period_seconds=0)
        await source.close()
        await core.api_client.close()
