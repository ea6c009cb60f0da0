"""GPU servers through a real JupyterHub and proxy with the GPU KubeSpawner
(``gpubroker-kubernetes``) and the broker service reading the test cluster
(``inventory_source = "kubernetes"``, a local process with a kubeconfig, as on a hub host):
a user's server becomes a pod that the real kube-scheduler binds to the node the broker
chose, and the next user's spawn page shows the broker's position and ETA, then the pod's
scheduling. KWOK runs no container, so no server ever answers in a pod: the hub gives up
after ``http_timeout``, deletes the pod, and the broker's lease ends with it. The cluster
has DRA nodes too (``dra_publisher.py``), and the admin page says which nodes the
inventory reads from which source."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from bs4 import BeautifulSoup
from kube_cluster import NAMESPACE, until
from kube_hubs import pod, progress, running_hub
from live_hub import Hub

pytestmark = [pytest.mark.cluster, pytest.mark.hub, pytest.mark.slow]


@pytest.fixture
def hub(
    tmp_path: Path, dra_nodes: None, kube: None, proxy: None, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Hub]:
    with running_hub(tmp_path, monkeypatch, "c.GPUBrokerKubeSpawner.http_timeout = 30") as hub:
        yield hub


def messages(hub: Hub, token: str, name: str, until_text: str) -> list[str]:
    """``name``'s spawn progress messages up to one containing ``until_text``."""
    seen = []
    for line, _ in progress(hub, token, name):
        seen.append(line)
        if until_text in line:
            break
    return seen


def test_a_gpu_server_is_a_pod_on_the_brokers_node_and_the_next_user_sees_the_queue(
    hub: Hub,
) -> None:
    admin = hub.login("admin").get(f"{hub.url}/services/gpubroker/admin", timeout=60)
    assert admin.status_code == 200, admin.text
    said = BeautifulSoup(admin.text, "html.parser").select_one("p.gpubroker-engine")
    assert said is not None and said.get_text(" ", strip=True) == (
        "Inventory: Kubernetes, from DRA (ResourceSlices of gpu.nvidia.com) on 3 nodes, "
        "the device plugin's extended resources on 5 nodes."
    )
    acting = BeautifulSoup(admin.text, "html.parser").select(".gpubroker-acting li")
    assert acting[-1].get_text(strip=True) == (
        "GPUs kept warm on Kubernetes ahead of the forecast: off."
    )
    tokens = {n: hub.user(n) for n in ("ann", "bob")}
    for name in ("ann", "bob"):
        answer = requests.post(
            f"{hub.url}/hub/api/users/{name}/server",
            json={"gpus": 4},
            headers={"Authorization": f"token {tokens[name]}"},
            timeout=60,
        )
        assert answer.status_code in (201, 202), answer.text
        if name == "ann":
            ann = until(
                "ann's pod to run",
                lambda: (p := pod("ann")) and p["status"].get("phase") == "Running" and p,
            )
    status, mine = hub.api(tokens["ann"], "GET", "leases")
    assert status == 200 and len(mine["leases"]) == 1
    lease = mine["leases"][0]
    assert ann["spec"]["nodeName"] == "gpu-h100"  # the only node with 4 GPUs to grant
    assert all(d.startswith("k8s:gpu-h100:gpu:") for d in lease["devices"])
    (notebook,) = ann["spec"]["containers"]
    assert notebook["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    assert ann["metadata"]["labels"]["gpubroker.jupyter.org/lease"] == lease["id"]
    # bob waits in the broker's queue, not at the scheduler: no pod of his yet
    waiting = messages(hub, tokens["bob"], "bob", "position 1 of 1")
    assert "Waiting for 4 GPUs" in waiting[-1] and "ETA" in waiting[-1]
    assert pod("bob") is None
    # nothing answers in ann's pod: the hub gives up, her pod goes, bob's is bound
    story = messages(hub, tokens["bob"], "bob", "Successfully assigned")
    assert any("Granted 4 GPUs" in m for m in story), story
    assert f"Successfully assigned {NAMESPACE}/jupyter-bob to gpu-h100" in story[-1]
    until("ann's pod to go", lambda: pod("ann") is None, timeout_s=60)
    status, ended = hub.api(tokens["ann"], "GET", f"leases/{lease['id']}")
    assert status == 200 and ended["state"] == "released", ended
