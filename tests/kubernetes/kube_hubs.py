"""A real JupyterHub and proxy over the test cluster for the Kubernetes hub tests: the GPU
KubeSpawner (``gpubroker-kubernetes``) in the test namespace, the broker service reading
the cluster with the admin's kubeconfig; a user's pod; and a spawn's progress events."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests
from kube_cluster import KUBECONFIG, NAMESPACE, PAUSE, get, kubectl
from live_hub import Hub


@contextmanager
def running_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spawner_config: str
) -> Iterator[Hub]:
    """The hub, its KubeSpawner also configured by ``spawner_config`` (config lines)."""
    monkeypatch.setenv("KUBECONFIG", str(KUBECONFIG))  # the hub's KubeSpawner's
    running = Hub(
        tmp_path,
        spawner="gpubroker-kubernetes",
        extra_config=f"""
broker["command"].append("--KubernetesInventory.kubeconfig={KUBECONFIG}")
c.GPUBrokerKubeSpawner.namespace = "{NAMESPACE}"
c.GPUBrokerKubeSpawner.image = "{PAUSE}"
{spawner_config}
""",
        inventory_source="kubernetes",
        engine_grace=10,
    )
    try:
        running.start()
        yield running
    finally:
        running.stop()


def pod(name: str) -> dict[str, Any] | None:
    """``name``'s server pod, None while the API server has none."""
    found = kubectl("get", "pod", f"jupyter-{name}", "-n", NAMESPACE, "-o", "json", check=False)
    return get("pod", f"jupyter-{name}", "-n", NAMESPACE) if found else None


def progress(hub: Hub, token: str, name: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """``name``'s spawn progress events as they come: each ``data:`` line and its JSON."""
    with requests.get(
        f"{hub.url}/hub/api/users/{name}/server/progress",
        headers={"Authorization": f"token {token}"},
        stream=True,
        timeout=180,
    ) as r:
        for line in r.iter_lines(decode_unicode=True):
            if line and line.startswith("data:"):
                yield line, json.loads(line[len("data:") :])
