"""The GPU spawner over KubeSpawner: what pod KubeSpawner's own ``get_pod_manifest`` builds
for a grant (limits, node affinity, labels, the Kueue label, the environment), and Kueue's
positions on the spawn page from its visibility API."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

pytest.importorskip("kubespawner.clients", reason="the kubernetes extra")

from kube_helpers import env, granted, limits, manifest, terms  # noqa: E402
from live_server import free_port  # noqa: E402
from tornado import web  # noqa: E402
from tornado.httpserver import HTTPServer  # noqa: E402

from hub_spawner._compat import SpawnException  # noqa: E402
from hub_spawner.environment import LEASE_ENV  # noqa: E402
from hub_spawner.kubernetes import (  # noqa: E402
    KueuePosition,
    kueue_position,
    merged,
)
from jupyter_gpubroker.engines.kubernetes import BROKER_LABEL, LEASE_LABEL  # noqa: E402

PIN = {"key": "metadata.name", "operator": "In", "values": ["node-a"]}


async def test_a_mig_grant_under_the_mixed_strategy_is_a_mig_limit_on_that_node(
    make_spawner: Any,
) -> None:
    spawner = make_spawner()
    pod = await manifest(granted(spawner, "k8s:node-a:1g.10gb:3"))
    assert limits(pod) == {"nvidia.com/mig-1g.10gb": "1"}
    assert terms(pod) == [{"matchFields": [PIN]}]
    labels = pod["metadata"]["labels"]
    assert (labels[BROKER_LABEL], labels[LEASE_LABEL]) == ("gpubroker", "l-0a1b2c")
    assert "kueue.x-k8s.io/queue-name" not in labels
    # the device plugin names the devices in the container; the spawner does not
    assert "CUDA_VISIBLE_DEVICES" not in env(pod) and "NVIDIA_VISIBLE_DEVICES" not in env(pod)
    assert env(pod)[LEASE_ENV] == "l-0a1b2c"


async def test_whole_gpus_join_the_deployments_own_limits_and_affinity(make_spawner: Any) -> None:
    pool = {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["notebooks"]}]}
    spawner = make_spawner(
        extra_resource_limits={"example.com/fpga": "1"},
        node_affinity_required=[pool],
        extra_labels={"team": "vision"},
        gpubroker_service="broker-b",
    )
    pod = await manifest(granted(spawner, "k8s:node-a:gpu:0", "k8s:node-a:gpu:1"))
    assert limits(pod) == {"example.com/fpga": "1", "nvidia.com/gpu": "2"}
    assert terms(pod) == [{**pool, "matchFields": [PIN]}]  # one term: the pool AND this node
    assert pod["metadata"]["labels"]["team"] == "vision"
    assert pod["metadata"]["labels"][BROKER_LABEL] == "broker-b"
    # the next start, without a GPU, keeps the deployment's values and nothing of the grant
    spawner._gpu = None
    pod = await manifest(spawner)
    assert limits(pod) == {"example.com/fpga": "1"}
    assert terms(pod) == [pool]
    assert BROKER_LABEL not in pod["metadata"]["labels"]


async def test_under_the_single_strategy_a_mig_slice_is_asked_for_as_nvidia_com_gpu(
    make_spawner: Any,
) -> None:
    spawner = make_spawner(mig_strategy="single")
    pod = await manifest(granted(spawner, "k8s:node-a:1g.5gb:17"))
    assert limits(pod) == {"nvidia.com/gpu": "1"}
    assert terms(pod) == [{"matchFields": [PIN]}]


async def test_kueue_mode_labels_a_gpu_servers_pod_with_its_queue(make_spawner: Any) -> None:
    spawner = make_spawner(kueue_queue="gpu-notebooks")
    pod = await manifest(granted(spawner, "k8s:node-a:gpu:0"))
    assert pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-notebooks"
    spawner._gpu = None  # a CPU-only server starts at once, outside Kueue
    pod = await manifest(spawner)
    assert "kueue.x-k8s.io/queue-name" not in pod["metadata"]["labels"]


async def test_a_cpu_only_pod_sees_no_gpu(make_spawner: Any) -> None:
    spawner = make_spawner()
    pod = await manifest(spawner)
    assert limits(pod) == {} and "affinity" not in pod["spec"]
    assert env(pod)["NVIDIA_VISIBLE_DEVICES"] == "void" and env(pod)["CUDA_VISIBLE_DEVICES"] == ""


async def test_a_grant_from_a_broker_on_another_inventory_is_refused_clearly(
    make_spawner: Any,
) -> None:
    spawner = make_spawner()
    granted(spawner, "MIG-8c3a5d6e-0000-0000-0000-000000000000")
    with pytest.raises(SpawnException, match="give the broker the cluster's inventory"):
        await spawner.get_pod_manifest()


async def test_the_options_form_is_the_brokers_not_kubespawners_profiles(make_spawner: Any) -> None:
    spawner = make_spawner()
    assert spawner.options_form.__qualname__.startswith("GPUBrokerSpawnerMixin.")
    assert spawner.options_from_form({"gpu_kind": ["profile"], "profile": ["1g.10gb"]}) == {
        "job_class": "interactive",
        "profile": "1g.10gb",
    }


# A PendingWorkloadsSummary in the shape Kueue's visibility API defines
# (https://github.com/kubernetes-sigs/kueue/blob/main/apis/visibility/v1beta2/types.go;
# https://kueue.sigs.k8s.io/docs/tasks/manage/monitor_pending_workloads/pending_workloads_on_demand/):
# written from that definition, not recorded from a cluster. Positions count from 0.
def summary(*pods: str) -> dict[str, Any]:
    return {
        "kind": "PendingWorkloadsSummary",
        "apiVersion": "visibility.kueue.x-k8s.io/v1beta2",
        "metadata": {"creationTimestamp": None},
        "items": [
            {
                "metadata": {
                    "name": f"pod-{name}-3c7a1",
                    "namespace": "jhub",
                    "creationTimestamp": "2026-12-01T10:00:00Z",
                    "ownerReferences": [
                        {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": f"uid-{name}"}
                    ],
                },
                "priority": 0,
                "localQueueName": "gpu-notebooks",
                "positionInClusterQueue": 3 + i,
                "positionInLocalQueue": i,
            }
            for i, name in enumerate(pods)
        ],
    }


def test_kueues_position_of_the_servers_pod_is_read_from_the_summary() -> None:
    body = summary("jupyter-ann", "jupyter-bob")
    assert kueue_position(body, "jupyter-bob") == KueuePosition("gpu-notebooks", 2, 5)
    assert kueue_position(body, "jupyter-cat") is None
    assert kueue_position({"items": []}, "jupyter-bob") is None


class Visibility(web.RequestHandler):
    """Kueue's visibility endpoint of one LocalQueue, answering from a script of bodies."""

    def initialize(self, bodies: list[dict[str, Any]], seen: list[str]) -> None:
        self.bodies, self.seen = bodies, seen

    def get(self, version: str, namespace: str, queue: str) -> None:
        self.seen.append(f"{version} {namespace}/{queue} {self.request.headers['Authorization']}")
        self.write(json.dumps(self.bodies.pop(0) if len(self.bodies) > 1 else self.bodies[0]))


async def test_the_spawn_page_shows_kueues_position_until_it_admits_the_pod(
    make_spawner: Any,
) -> None:
    port = free_port()
    seen: list[str] = []
    mine = "jupyter-mock-name---6241db84"  # KubeSpawner's name of mock@name's pod
    bodies = [summary("jupyter-zed", mine), summary(mine), summary()]
    route = (
        r"/apis/visibility\.kueue\.x-k8s\.io/(\w+)/namespaces/([\w-]+)"
        r"/localqueues/([\w-]+)/pendingworkloads"
    )
    app = web.Application([(route, Visibility, {"bodies": bodies, "seen": seen})])
    server = HTTPServer(app)
    server.listen(port, "127.0.0.1")
    try:
        spawner = make_spawner(
            f"http://127.0.0.1:{port}", kueue_queue="gpu-notebooks", kueue_poll_interval=0.01
        )
        granted(spawner, "k8s:node-a:gpu:0")
        assert spawner.pod_name == mine
        messages = [e["message"] async for e in spawner._kueue_progress()]
    finally:
        server.stop()
    assert messages == [
        "GPU granted; Kueue holds the pod until its cluster queue has quota: position 2 in "
        "local queue gpu-notebooks, 5 in the cluster queue (Kueue gives no ETA)",
        "GPU granted; Kueue holds the pod until its cluster queue has quota: position 1 in "
        "local queue gpu-notebooks, 4 in the cluster queue (Kueue gives no ETA)",
        "Kueue admitted the pod",
    ]
    assert seen[0] == f"v1beta2 {spawner.namespace}/gpu-notebooks Bearer t"


async def test_kueue_not_answering_is_said_once(make_spawner: Any) -> None:
    spawner = make_spawner(kueue_queue="gpu-notebooks")  # nothing listens at its API server
    granted(spawner, "k8s:node-a:gpu:0")
    (event,) = [e async for e in spawner._kueue_progress()]
    assert event["message"].startswith("Waiting for Kueue to admit the pod; its visibility API")


async def test_merged_progress_ends_with_the_spawners_own() -> None:
    async def main() -> AsyncIterator[str]:
        yield "queued"
        await asyncio.sleep(0.05)
        yield "started"

    async def side() -> AsyncIterator[str]:
        await asyncio.sleep(0.01)
        yield "kueue"
        await asyncio.sleep(3600)
        yield "never"

    assert [e async for e in merged(main(), side())] == ["queued", "kueue", "started"]
