"""The real Kubernetes control plane ``.ci/kube-up`` starts on this machine (etcd,
kube-apiserver, kube-controller-manager, kube-scheduler, KWOK) and the GPU nodes the tests
put in it: commands and waits the cluster tests share.

The nodes are what NVIDIA's device plugin and GPU feature discovery make a node look like
(the extended resources in ``status.allocatable``, the ``nvidia.com/*`` labels; see
tests/kubernetes/test_kube_inventory.py for the sources). No kubelet runs: KWOK keeps the
nodes annotated ``kwok.x-k8s.io/node: fake`` Ready and runs their pods (phase Running, an
IP, no container); ``gpu-notready``'s "kubelet" is nobody, so it reports NotReady as the
tests write it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

NAME = os.environ.get("GPUBROKER_KUBE_NAME", "gpubroker-kube")
"""The cluster of ``.ci/kube-up`` (``$GPUBROKER_KUBE_NAME``: the one ``.ci/run`` named)."""
STATE = Path("/var/lib", NAME)
RUN = Path("/run", NAME)
"""Its daemons' pid files."""
KUBECONFIG = Path(os.environ.get("GPUBROKER_KUBECONFIG", STATE / "admin.kubeconfig"))
KUBECTL = STATE / "bin" / "kubectl"


def api_server() -> str:
    """The API server's URL, as the admin's kubeconfig says (``.ci/kube-up`` chooses its
    port when it first starts it; in CI, while the tests are collected, it may not yet)."""
    return re.search(r'server: "([^"]+)"', KUBECONFIG.read_text())[1]  # type: ignore[index]


UP = "run .ci/kube-up as root (it builds Kubernetes and KWOK once, then starts the test cluster)"
NAMESPACE = "gpubroker-test"
PAUSE = "registry.k8s.io/pause:3.10"
"""The pods' image: nothing pulls it (KWOK runs no container)."""

NODE_BASE = {"cpu": "64", "memory": "512Gi", "pods": "110"}
MIXED = {"nvidia.com/mig.strategy": "mixed", "nvidia.com/gpu.present": "true"}
NODES: dict[str, dict[str, Any]] = {
    # whole GPUs
    "gpu-h100": {
        "resources": {"nvidia.com/gpu": "4"},
        "labels": MIXED
        | {
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.memory": "81559",
            "nvidia.com/gpu.count": "4",
        },
    },
    # MIG under the mixed strategy: one A100 cut 7 x 1g.10gb, one 2 x 3g.40gb
    "gpu-a100-mig": {
        "resources": {
            "nvidia.com/gpu": "0",
            "nvidia.com/mig-1g.10gb": "7",
            "nvidia.com/mig-3g.40gb": "2",
        },
        "labels": MIXED
        | {
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
            "nvidia.com/gpu.count": "2",
            "nvidia.com/mig-1g.10gb.count": "7",
            "nvidia.com/mig-1g.10gb.memory": "9728",
            "nvidia.com/mig-3g.40gb.count": "2",
            "nvidia.com/mig-3g.40gb.memory": "40192",
        },
    },
    # time-slicing: 2 A100 shared 4 ways each, advertised as 8 nvidia.com/gpu
    "gpu-ts": {
        "resources": {"nvidia.com/gpu": "8"},
        "labels": MIXED
        | {
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-SHARED",
            "nvidia.com/gpu.count": "2",
            "nvidia.com/gpu.replicas": "4",
            "nvidia.com/gpu.sharing-strategy": "time-slicing",
        },
    },
    "gpu-cordoned": {
        "resources": {"nvidia.com/gpu": "2"},
        "labels": MIXED | {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "unschedulable": True,
    },
    "gpu-notready": {
        "resources": {"nvidia.com/gpu": "2"},
        "labels": MIXED | {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "kwok": False,
    },
}
NOT_READY = {
    "type": "Ready",
    "status": "False",
    "reason": "KubeletNotReady",
    "message": "container runtime network not ready",
}
"""What a kubelet whose container runtime is not ready reports (gpu-notready's)."""


def kubectl(*args: str, input: Any = None, check: bool = True) -> str:
    """The real kubectl (built by .ci/kube-up) as the cluster's admin; ``input``: an object
    sent as JSON on its standard input (``-f -``)."""
    done = subprocess.run(
        [str(KUBECTL), "--kubeconfig", str(KUBECONFIG), *args],
        input=None if input is None else json.dumps(input),
        capture_output=True,
        text=True,
        timeout=60,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def get(*args: str) -> Any:
    return json.loads(kubectl("get", "-o", "json", *args))


def until(what: str, check: Callable[[], Any], timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what}")
        time.sleep(0.5)


def node_manifest(name: str) -> dict[str, Any]:
    spec = NODES[name]
    resources = NODE_BASE | spec["resources"]
    annotations = {"kwok.x-k8s.io/node": "fake"} if spec.get("kwok", True) else {}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": spec["labels"] | {"kubernetes.io/hostname": name, "type": "kwok"},
            "annotations": annotations,
        },
        "spec": {"unschedulable": spec.get("unschedulable", False)},
        "status": {"capacity": resources, "allocatable": resources},
    }


def ready(node: dict[str, Any]) -> str | None:
    conditions = node.get("status", {}).get("conditions") or []
    return next((c["status"] for c in conditions if c["type"] == "Ready"), None)


def make_nodes() -> None:
    """The GPU nodes afresh (created as a kubelet registers its node, with its status),
    the test namespace without pods; returns once KWOK made its nodes Ready and the node
    lifecycle controller lifted their not-ready taint."""
    kubectl("delete", "pods", "--all", "-n", NAMESPACE, "--grace-period=0", "--force", check=False)
    kubectl("delete", "node", *NODES, "--ignore-not-found")
    for name in NODES:
        kubectl("create", "-f", "-", input=node_manifest(name))
    kubectl("create", "namespace", NAMESPACE, check=False)
    notready = {"status": {"conditions": [NOT_READY | {"lastHeartbeatTime": now()}]}}
    kubectl("patch", "node", "gpu-notready", "--subresource=status", "-p", json.dumps(notready))

    def schedulable() -> bool:
        nodes = {n["metadata"]["name"]: n for n in get("nodes")["items"]}
        return all(
            ready(nodes[n]) == "True" and not nodes[n]["spec"].get("taints")
            for n, spec in NODES.items()
            if spec.get("kwok", True) and not spec.get("unschedulable")
        )

    until("KWOK's nodes Ready and untainted", schedulable, timeout_s=90)
    until(
        "the test namespace's default service account",
        lambda: kubectl("get", "serviceaccount", "default", "-n", NAMESPACE, check=False),
    )


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def pod_manifest(name: str, node: str, limits: dict[str, str], **labels: str) -> dict[str, Any]:
    """A pod for the scheduler to place on ``node`` (by its hostname label) with these
    extended resource limits."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{"name": "work", "image": PAUSE, "resources": {"limits": limits}}],
        },
    }


def running(name: str, timeout_s: float = 60) -> dict[str, Any]:
    """The pod once it runs (bound by the scheduler, started by KWOK)."""

    def check() -> dict[str, Any] | None:
        pod = get("pod", name, "-n", NAMESPACE)
        return pod if pod["status"].get("phase") == "Running" else None

    found: dict[str, Any] = until(f"pod {name} to run", check, timeout_s)
    return found


def gone(name: str) -> None:
    until(
        f"pod {name} to be gone",
        lambda: not kubectl("get", "pod", name, "-n", NAMESPACE, "--ignore-not-found"),
    )


def cleanup() -> None:
    """No test pods left, nor their events (KubeSpawner shows a pod's events on the spawn
    page by its name, which the next test's pod of that user has too), every node as made."""
    kubectl("delete", "pods", "--all", "-n", NAMESPACE, "--wait=true", "--timeout=60s")
    kubectl("delete", "events", "--all", "-n", NAMESPACE)
    kubectl("uncordon", "gpu-h100", "gpu-a100-mig")


def service_account(
    tmp_path: Path, name: str, rules: list[dict[str, Any]], role: str = "ClusterRole"
) -> Path:
    """A service account bound to a ``role`` (``ClusterRole``, or ``Role`` in the test
    namespace) with exactly ``rules``; a kubeconfig with its token (the API server's
    TokenRequest, as a pod's projected token)."""
    kubectl("create", "serviceaccount", name, "-n", NAMESPACE)
    meta = {"name": name} if role == "ClusterRole" else {"name": name, "namespace": NAMESPACE}
    rbac = "rbac.authorization.k8s.io"
    binding = {
        "apiVersion": f"{rbac}/v1",
        "kind": f"{role}Binding",
        "metadata": meta,
        "roleRef": {"apiGroup": rbac, "kind": role, "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}],
    }
    made = {"apiVersion": f"{rbac}/v1", "kind": role, "metadata": meta, "rules": rules}
    listed = {"apiVersion": "v1", "kind": "List", "items": [made, binding]}
    kubectl("apply", "-f", "-", input=listed)
    token = kubectl("create", "token", name, "-n", NAMESPACE).strip()
    admin = yaml.safe_load(KUBECONFIG.read_text())
    path = tmp_path / f"{name}.kubeconfig"
    cluster = admin["clusters"][0]["name"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": cluster, "user": name}}],
        "current-context": name,
    }
    path.write_text(json.dumps(config))
    return path
