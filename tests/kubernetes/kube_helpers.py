"""Helpers of the Kubernetes tests: the pod a GPU KubeSpawner builds, as the JSON it sends
to the API server, read field by field."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hub_spawner.kubernetes import GPUBrokerKubeSpawner


def granted(spawner: GPUBrokerKubeSpawner, *devices: str, **held: Any) -> GPUBrokerKubeSpawner:
    """``spawner`` as a grant of ``devices`` leaves it (``held``: more of the reservation)."""
    spawner._gpu = {"request_id": "r-1", "lease_id": "l-0a1b2c", "devices": list(devices), **held}
    return spawner


async def manifest(spawner: GPUBrokerKubeSpawner) -> dict[str, Any]:
    """The pod KubeSpawner's get_pod_manifest builds, as the JSON sent to the API server."""
    from kubernetes_asyncio.client import ApiClient

    pod = await spawner.get_pod_manifest()
    async with ApiClient() as api:
        return dict(api.sanitize_for_serialization(pod))


def notebook(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "notebook"]
    return container


def limits(pod: dict[str, Any]) -> dict[str, str]:
    return dict(notebook(pod)["resources"].get("limits") or {})


def env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in notebook(pod)["env"]}


def terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    required = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    return list(required["nodeSelectorTerms"])
