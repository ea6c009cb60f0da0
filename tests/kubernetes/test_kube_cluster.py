"""The broker and the GPU KubeSpawner against a real Kubernetes control plane
(``.ci/kube-up``: etcd, kube-apiserver with RBAC, kube-controller-manager, kube-scheduler,
KWOK; ``kube_cluster.py`` has the GPU nodes): the nodes as NVIDIA's device plugin
advertises them are the inventory, other pods' GPUs are in use, a cordoned or NotReady node
is drained with Kubernetes' reason, the spawner's pod is accepted by the API server and
bound by the scheduler to the node the broker chose, a pod deleted with kubectl releases its
lease, a restarted broker reconciles, an API server that hangs or forbids says so, and the
broker needs no more RBAC than the docs give it."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

k8s = pytest.importorskip("kubernetes_asyncio", reason="the kubernetes extra")
pytest.importorskip("kubespawner.clients", reason="the kubernetes extra")

from kube_broker import drains, lease_of, make_broker, poll, started  # noqa: E402
from kube_cluster import (  # noqa: E402
    KUBECONFIG,
    NAMESPACE,
    NODES,
    RUN,
    api_server,
    get,
    gone,
    kubectl,
    pod_manifest,
    ready,
    running,
    service_account,
    until,
)
from kubespawner import KubeSpawner  # noqa: E402

from hub_spawner.kubernetes import GPUBrokerKubeSpawner  # noqa: E402
from jupyter_gpubroker.engines.kubernetes import (  # noqa: E402
    BROKER_LABEL,
    LEASE_LABEL,
    KubernetesInventory,
    parse_device_uuid,
)
from jupyter_gpubroker.runtime import GPUBroker  # noqa: E402
from jupyter_gpubroker.wire.errors import ConfigError  # noqa: E402
from jupyter_gpubroker.wire.sizes import Size  # noqa: E402

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.usefixtures("kube"),
    # KubeSpawner closes its shared API client from a task its test's loop may outlive
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]
DOCS = Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[GPUBroker]:
    with started(make_broker(tmp_path / "state.sqlite")) as running:
        yield running


def brokers_pod(name: str, lease: Any, node: str, limits: dict[str, str]) -> dict[str, Any]:
    """A pod carrying a lease, labelled as GPUBrokerKubeSpawner labels its pods."""
    return pod_manifest(name, node, limits, **{BROKER_LABEL: "gpubroker", LEASE_LABEL: lease.id})


def test_gpu_nodes_as_the_device_plugin_advertises_them_are_the_inventory(
    broker: GPUBroker,
) -> None:
    nodes = {n["metadata"]["name"]: n for n in get("nodes")["items"]}
    # KWOK keeps its nodes Ready; gpu-notready's kubelet said it is not
    assert {n: ready(nodes[n]) for n in NODES} == {
        "gpu-h100": "True",
        "gpu-a100-mig": "True",
        "gpu-ts": "True",
        "gpu-cordoned": "True",
        "gpu-notready": "False",
    }
    core = broker.core
    assert sorted((d.node, d.kind, d.profile or "") for d in core.inventory.devices) == sorted(
        [("gpu-h100", "gpu", "")] * 4
        + [("gpu-a100-mig", "mig", "1g.10gb")] * 7
        + [("gpu-a100-mig", "mig", "3g.40gb")] * 2
        + [("gpu-ts", "gpu", "")] * 2  # 8 time-sliced shares of 2 GPUs
        + [("gpu-cordoned", "gpu", "")] * 2
        + [("gpu-notready", "gpu", "")] * 2
    )
    held = drains(broker)
    assert sorted(held) == ["gpu-cordoned", "gpu-notready", "gpu-ts"]
    assert set(held["gpu-cordoned"]) == {"gpu-cordoned: cordoned (unschedulable)"}
    (notready,) = set(held["gpu-notready"])
    assert notready.startswith("gpu-notready: NotReady (")
    (shared,) = set(held["gpu-ts"])
    assert shared.startswith("gpu-ts: the device plugin shares each gpu 4 ways (time-slicing)")
    # what is granted is on the nodes that take pods, and no more than they have
    whole = core.submit("ann", Size(gpus=3))
    mig = core.submit("bob", Size(profile="3g.40gb"))
    more = core.submit("cat", Size(gpus=2))
    assert {parse_device_uuid(u)[0] for u in lease_of(broker, whole.id).devices} == {"gpu-h100"}
    assert {parse_device_uuid(u)[0] for u in lease_of(broker, mig.id).devices} == {"gpu-a100-mig"}
    assert core.request(more.id).state.value == "queued"
    # uncordoned, the node's GPUs come back
    kubectl("uncordon", "gpu-cordoned")
    try:
        poll(broker)
        assert "gpu-cordoned" not in drains(broker)
        assert core.request(more.id).state.value == "granted"
    finally:
        kubectl("cordon", "gpu-cordoned")
    poll(broker)
    assert "gpu-cordoned" in drains(broker)


async def test_the_node_selector_narrows_the_inventory_and_pending_pods_are_listed() -> None:
    """``node_selector`` picks the nodes; a broker pod still waiting at the scheduler is
    listed with its lease (it carries the lease out once bound)."""
    pending = pod_manifest("waits", "gpu-cordoned", {"nvidia.com/gpu": "1"})
    pending["metadata"]["labels"] = {BROKER_LABEL: "gpubroker", LEASE_LABEL: "l-waits"}
    await asyncio.to_thread(kubectl, "create", "-f", "-", input=pending)
    source = KubernetesInventory(
        kubeconfig=str(KUBECONFIG), node_selector="nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB"
    )
    view = await source.read()
    assert {d.node for d in view.inventory.devices} == {"gpu-a100-mig"}
    assert view.holders == {"l-waits": f"{NAMESPACE}/waits"}


def test_other_pods_gpu_requests_are_in_use_until_they_are_deleted(broker: GPUBroker) -> None:
    core = broker.core
    kubectl("create", "-f", "-", input=pod_manifest("train", "gpu-h100", {"nvidia.com/gpu": "3"}))
    kubectl(
        "create",
        "-f",
        "-",
        input=pod_manifest("infer", "gpu-a100-mig", {"nvidia.com/mig-1g.10gb": "2"}),
    )
    assert running("train")["spec"]["nodeName"] == "gpu-h100"  # bound by the scheduler
    running("infer")
    poll(broker)
    held = drains(broker)
    assert held["gpu-h100"] == ["3 of 4 gpu on gpu-h100 in use outside the broker"] * 3
    assert held["gpu-a100-mig"] == ["2 of 7 1g.10gb on gpu-a100-mig in use outside the broker"] * 2
    waiting = core.submit("ann", Size(gpus=2))
    assert core.request(waiting.id).state.value == "queued"  # one H100 is left
    kubectl("delete", "pod", "train", "-n", NAMESPACE)
    gone("train")
    poll(broker)
    assert core.request(waiting.id).state.value == "granted"
    assert "gpu-h100" not in drains(broker)


def grant(spawner: GPUBrokerKubeSpawner, request: Any, lease: Any) -> GPUBrokerKubeSpawner:
    spawner._gpu = {"request_id": request.id, "lease_id": lease.id, "devices": list(lease.devices)}
    return spawner


async def test_the_spawners_pod_is_bound_by_the_scheduler_to_the_node_the_broker_chose(
    broker: GPUBroker, spawner: Callable[..., GPUBrokerKubeSpawner]
) -> None:
    core = broker.core
    granted = core.submit("ann", Size(profile="3g.40gb"))
    lease = lease_of(broker, granted.id)
    (node,) = {parse_device_uuid(u)[0] for u in lease.devices}
    server = grant(spawner(), granted, lease)
    # KubeSpawner's own start: the pod from the mixin's manifest, created and waited for
    # until it runs (KWOK's "container")
    await KubeSpawner.start(server)
    try:
        pod = await asyncio.to_thread(get, "pod", server.pod_name, "-n", NAMESPACE)
        assert pod["spec"]["nodeName"] == node == "gpu-a100-mig"
        (notebook,) = pod["spec"]["containers"]
        assert notebook["resources"]["limits"] == {"nvidia.com/mig-3g.40gb": "1"}
        assert pod["metadata"]["labels"][LEASE_LABEL] == lease.id
        events = await asyncio.to_thread(
            get,
            "events",
            "-n",
            NAMESPACE,
            "--field-selector",
            f"involvedObject.uid={pod['metadata']['uid']}",
        )
        scheduled = [e["message"] for e in events["items"] if e["reason"] == "Scheduled"]
        assert scheduled == [f"Successfully assigned {NAMESPACE}/{server.pod_name} to {node}"]
        # the broker knows it as its own grant, not as work outside it
        await broker.poll_engine()
        assert set(drains(broker)) == {"gpu-cordoned", "gpu-notready", "gpu-ts"}
        # the scheduler itself holds the line: with one 3g.40gb left, two do not fit
        more = pod_manifest("greedy", node, {"nvidia.com/mig-3g.40gb": "2"})
        made = await asyncio.to_thread(kubectl, "create", "-o", "json", "-f", "-", input=more)
        uid = json.loads(made)["metadata"]["uid"]

        def refused() -> str:
            found = get("events", "-n", NAMESPACE, "--field-selector", f"involvedObject.uid={uid}")
            return " ".join(
                e["message"] for e in found["items"] if e["reason"] == "FailedScheduling"
            )

        why = await asyncio.to_thread(until, "the scheduler to refuse the greedy pod", refused)
        assert "Insufficient nvidia.com/mig-3g.40gb" in why
    finally:
        await KubeSpawner.stop(server, now=True)


async def test_the_api_server_accepts_every_pod_the_spawner_builds(
    broker: GPUBroker, spawner: Callable[..., GPUBrokerKubeSpawner]
) -> None:
    """Server-side dry runs: the API server validates each manifest as it would create it."""
    core = broker.core
    whole = core.submit("ann", Size(gpus=2))
    mig = core.submit("bob", Size(profile="1g.10gb"))
    cases = [
        grant(spawner(), whole, lease_of(broker, whole.id)),
        grant(spawner(), mig, lease_of(broker, mig.id)),
        grant(spawner(mig_strategy="single"), mig, lease_of(broker, mig.id)),
        grant(spawner(kueue_queue="gpu-notebooks"), mig, lease_of(broker, mig.id)),
        spawner(),  # no GPU
        grant(
            spawner(
                node_affinity_required=[
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["lab"]}]}
                ],
                extra_resource_limits={"example.com/fpga": "1"},
            ),
            whole,
            lease_of(broker, whole.id),
        ),
    ]
    async with k8s.client.ApiClient(await _configuration()) as api:
        core_api = k8s.client.CoreV1Api(api)
        for server in cases:
            pod = await server.get_pod_manifest()
            created = await core_api.create_namespaced_pod(NAMESPACE, pod, dry_run="All")
            assert created.metadata.labels == pod.metadata.labels
            limits = created.spec.containers[0].resources.limits or {}
            assert limits == (pod.spec.containers[0].resources.limits or {})
        # and refuses what is not a valid pod: the check is real
        bad = await cases[0].get_pod_manifest()
        bad.metadata.labels[LEASE_LABEL] = "not a label value"
        with pytest.raises(k8s.client.ApiException) as refused:
            await core_api.create_namespaced_pod(NAMESPACE, bad, dry_run="All")
        assert refused.value.status == 422


async def _configuration(kubeconfig: Path = KUBECONFIG) -> Any:
    configuration = k8s.client.Configuration()
    await k8s.config.load_kube_config(str(kubeconfig), client_configuration=configuration)
    return configuration


def test_a_pod_deleted_with_kubectl_releases_its_lease_after_engine_grace(
    broker: GPUBroker,
) -> None:
    core = broker.core
    broker.engine_grace = 3
    granted = core.submit("ann", Size(gpus=1))
    lease = lease_of(broker, granted.id)
    poll(broker)  # no pod yet, but within engine_grace: the spawner is creating it
    assert core.request(granted.id).state.value == "granted"
    kubectl(
        "create", "-f", "-", input=brokers_pod("ann", lease, "gpu-h100", {"nvidia.com/gpu": "1"})
    )
    running("ann")
    until("engine_grace to pass", lambda: time.time() - lease.granted_at > 3)
    poll(broker)
    assert core.request(granted.id).state.value == "granted"  # its pod runs
    assert "gpu-h100" not in drains(broker)  # the broker's own pod is not outside work
    kubectl("delete", "pod", "ann", "-n", NAMESPACE)
    gone("ann")
    poll(broker)
    ended = core.lease(lease.id)
    assert ended.state.value == "released" and ended.reason == "its Kubernetes pod ended"


def test_a_pod_still_running_after_its_lease_ended_holds_its_gpus(broker: GPUBroker) -> None:
    core = broker.core
    granted = core.submit("ann", Size(gpus=2))
    lease = lease_of(broker, granted.id)
    kubectl(
        "create", "-f", "-", input=brokers_pod("ann", lease, "gpu-h100", {"nvidia.com/gpu": "2"})
    )
    running("ann")
    core.release(lease.id)
    poll(broker)
    why = "2 of 4 gpu on gpu-h100 in use outside the broker or by the work of ended lease"
    assert drains(broker)["gpu-h100"] == [f"{why} {lease.id}"] * 2
    whole = core.submit("bob", Size(gpus=4))
    assert core.request(whole.id).state.value == "queued"
    kubectl("delete", "pod", "ann", "-n", NAMESPACE)
    gone("ann")
    poll(broker)
    assert core.request(whole.id).state.value == "granted"


def test_a_restarted_broker_keeps_running_pods_leases_and_releases_the_deleted_ones(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state.sqlite"
    first = make_broker(state)
    first.start()
    try:
        core = first.core
        kept, lost = core.submit("ann", Size(gpus=1)), core.submit("bob", Size(profile="1g.10gb"))
        leases = {"ann": lease_of(first, kept.id), "bob": lease_of(first, lost.id)}
    finally:
        first.stop()
    for who, node, limits in (
        ("ann", "gpu-h100", {"nvidia.com/gpu": "1"}),
        ("bob", "gpu-a100-mig", {"nvidia.com/mig-1g.10gb": "1"}),
    ):
        kubectl("create", "-f", "-", input=brokers_pod(who, leases[who], node, limits))
        running(who)
    # while the broker is down: bob's pod deleted, other work started
    kubectl("delete", "pod", "bob", "-n", NAMESPACE)
    kubectl("create", "-f", "-", input=pod_manifest("train", "gpu-h100", {"nvidia.com/gpu": "2"}))
    gone("bob")
    running("train")
    second = make_broker(state, engine_grace=0)
    second.start()
    try:
        poll(second)
        core = second.core
        assert core.lease(leases["ann"].id).state.value == "active"
        bob = core.lease(leases["bob"].id)
        assert bob.state.value == "released" and bob.reason == "its Kubernetes pod ended"
        assert (
            drains(second)["gpu-h100"] == ["2 of 4 gpu on gpu-h100 in use outside the broker"] * 2
        )
    finally:
        second.stop()


def test_an_api_server_that_hangs_keeps_the_queue_and_says_so(broker: GPUBroker) -> None:
    core = broker.core
    waiting = [core.submit(u, Size(gpus=4)) for u in ("ann", "bob")]
    apiserver = int((RUN / "kube-apiserver.pid").read_text())
    os.kill(apiserver, signal.SIGSTOP)
    try:
        poll(broker)  # request_timeout: 3 s
    finally:
        os.kill(apiserver, signal.SIGCONT)
    state = broker.engine_state()
    assert state is not None and state["reachable"] is False
    assert state["error"].startswith(
        f"the Kubernetes API server at {api_server()} does not answer ("
    )
    assert state["error"].endswith("): the broker keeps its queue and its last view")
    assert [core.request(r.id).state.value for r in waiting] == ["granted", "queued"]
    until("the API server to answer", lambda: kubectl("get", "--raw", "/readyz", check=False))
    poll(broker)
    assert broker.engine_state()["reachable"] is True  # type: ignore[index]


def test_a_broker_cannot_start_without_an_api_server_and_says_why(tmp_path: Path) -> None:
    elsewhere = tmp_path / "kubeconfig"
    elsewhere.write_text(KUBECONFIG.read_text().replace(api_server(), "https://127.0.0.1:9"))
    broker = make_broker(tmp_path / "state.sqlite", elsewhere)
    with pytest.raises(ConfigError) as refused:
        broker.start()
    assert refused.value.message.startswith(
        "the Kubernetes API server at https://127.0.0.1:9 does not answer ("
    )


def documented_rules() -> list[dict[str, Any]]:
    """The broker's ClusterRole as docs/kubernetes.md gives it."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), re.S)
    for block in blocks:
        for doc in yaml.safe_load_all(block):
            if doc and doc.get("kind") == "ClusterRole":
                return list(doc["rules"])
    raise AssertionError("docs/kubernetes.md shows no ClusterRole for the broker")


CORE = "nodes and pods (403 Forbidden): grant the broker's service account list on nodes and pods"
DRA = (
    "(403 Forbidden): grant the broker's service account list on resourceslices and "
    "resourceclaims (add to its ClusterRole the rule apiGroups: [resource.k8s.io], resources: "
    "[resourceslices, resourceclaims], verbs: [list])"
)
REFUSED = {
    "nodes": CORE,
    "pods": CORE,
    "resourceslices": f"resourceslices {DRA}",
    "resourceclaims": f"resourceclaims {DRA}",
}
"""What the broker says when its role lacks list on each resource."""


def test_the_documented_rbac_is_all_the_broker_needs_and_each_verb_is_needed(
    tmp_path: Path, accounts: list[str]
) -> None:
    rules = documented_rules()
    accounts.append("gpubroker-docs")
    broker = make_broker(
        tmp_path / "docs.sqlite", service_account(tmp_path, "gpubroker-docs", rules)
    )
    broker.start()
    try:
        assert len(broker.core.inventory.devices) == 19  # every GPU node's devices
    finally:
        broker.stop()
    verbs = [
        (i, r, v) for i, rule in enumerate(rules) for r in rule["resources"] for v in rule["verbs"]
    ]
    assert verbs, "the documented role grants nothing"
    for i, resource, verb in verbs:
        fewer = [dict(rule) for rule in rules]
        fewer[i]["resources"] = [x for x in fewer[i]["resources"] if x != resource]
        less = [
            dict(fewer[i], resources=[resource], verbs=[v for v in fewer[i]["verbs"] if v != verb])
        ]
        name = f"gpubroker-no-{verb}-{resource}"
        accounts.append(name)
        kubeconfig = service_account(
            tmp_path, name, [r for r in fewer + less if r["resources"] and r["verbs"]]
        )
        broker = make_broker(tmp_path / f"{name}.sqlite", kubeconfig)
        with pytest.raises(ConfigError) as refused:
            broker.start()
        assert refused.value.message.startswith(
            "the Kubernetes API server refused to list " + REFUSED[resource]
        ), (verb, resource)
