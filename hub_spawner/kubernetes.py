"""GPU servers on Kubernetes: the broker decides who goes next and on which node and device
class, KubeSpawner starts the pod, NVIDIA's device plugin enforces it.

``GPUBrokerKubeSpawner`` (``c.JupyterHub.spawner_class = "gpubroker-kubernetes"``) is the GPU
spawner (``GPUBrokerSpawnerMixin``: options, form, queue position and ETA, lease, the user's
token) over KubeSpawner, for a broker whose inventory is the cluster's
(``jupyter_gpubroker.engines.kubernetes``, devices named ``k8s:<node>:<class>:<i>``). A grant
becomes, through KubeSpawner's own ``get_pod_manifest``, the notebook container's resource
limits (``nvidia.com/gpu: N``, or ``nvidia.com/mig-1g.10gb: 1`` under the device plugin's
``mixed`` MIG strategy), a required node affinity to the granted node, and the broker's labels
(its name and the lease), by which the inventory knows the pod as the broker's own. The device
plugin picks the devices and names them in the container, so the spawner sets no
``CUDA_VISIBLE_DEVICES``; a CPU-only pod gets ``NVIDIA_VISIBLE_DEVICES=void``, so an image that
says ``all`` sees no GPU either.

Kueue mode (``kueue_queue``): a GPU server's pod also carries ``kueue.x-k8s.io/queue-name``, so
Kueue gates it until its ClusterQueue's quota admits it. The broker's queue comes first (its
position and ETA on the spawn page, as on one machine); while Kueue then holds the pod, the
spawn page shows Kueue's positions from its visibility API (``pendingworkloads``), which gives
no ETA of its own.

KubeSpawner's ``profile_list`` is not used: the options are the broker's (``profile`` is a MIG
profile here, not a profile slug).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from aiohttp import ClientError
from kubernetes_asyncio.client import ApiException
from kubespawner import KubeSpawner
from traitlets import Enum, Unicode

from jupyter_gpubroker.engines.kubernetes import (
    BROKER_LABEL,
    LEASE_LABEL,
    parse_device_uuid,
    resource_name,
)
from jupyter_gpubroker.wire.sizes import RESOLUTION
from jupyter_gpubroker.wire.traits import Seconds

from .spawner import GPUBrokerSpawnerMixin, SpawnError

KUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_VISIBILITY = (
    "/apis/visibility.kueue.x-k8s.io/{version}/namespaces/{{namespace}}"
    "/localqueues/{{name}}/pendingworkloads"
)


@dataclass(frozen=True)
class KueuePosition:
    """Where Kueue has a pending workload, counted from 1 (the API counts from 0)."""

    local_queue: str
    in_local_queue: int
    in_cluster_queue: int


def kueue_position(summary: dict[str, Any], pod_name: str) -> KueuePosition | None:
    """The position of ``pod_name``'s workload in a ``PendingWorkloadsSummary`` (Kueue's
    visibility API: ``items[]`` with ``metadata.ownerReferences``, ``localQueueName``,
    ``positionInLocalQueue``, ``positionInClusterQueue``); ``None`` when it is not pending
    (not created yet, or admitted)."""
    for item in summary.get("items") or []:
        owners = (item.get("metadata") or {}).get("ownerReferences") or []
        if any(o.get("kind") == "Pod" and o.get("name") == pod_name for o in owners):
            return KueuePosition(
                str(item.get("localQueueName", "")),
                int(item.get("positionInLocalQueue", 0)) + 1,
                int(item.get("positionInClusterQueue", 0)) + 1,
            )
    return None


def kueue_message(position: KueuePosition) -> str:
    return (
        f"GPU granted; Kueue holds the pod until its cluster queue has quota: position "
        f"{position.in_local_queue} in local queue {position.local_queue}, "
        f"{position.in_cluster_queue} in the cluster queue (Kueue gives no ETA)"
    )


def on_node(terms: list[dict[str, Any]], node: str) -> list[dict[str, Any]]:
    """Required node-affinity ``terms`` (NodeSelectorTerms, ORed) narrowed to ``node``: its
    name goes into every term's ``matchFields``, or into a term of its own."""
    pin = {"key": "metadata.name", "operator": "In", "values": [node]}
    narrowed = []
    for term in terms:
        field = "match_fields" if "match_fields" in term else "matchFields"
        narrowed.append({**term, field: [*term.get(field, []), pin]})
    return narrowed or [{"matchFields": [pin]}]


async def merged(main: AsyncIterator[Any], side: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """``main``'s items with ``side``'s in between as they come, until ``main`` ends."""
    queue: asyncio.Queue[tuple[bool, Any]] = asyncio.Queue()

    async def pump(items: AsyncIterator[Any], last: bool) -> None:
        try:
            async for item in items:
                await queue.put((False, item))
        finally:
            if last:
                await queue.put((True, None))

    tasks = [asyncio.ensure_future(pump(main, True)), asyncio.ensure_future(pump(side, False))]
    try:
        while True:
            ended, item = await queue.get()
            if ended:
                break
            yield item
        tasks[0].result()  # main's own error, if it ended with one
    finally:
        for task in tasks:
            task.cancel()


class GPUBrokerKubeSpawner(GPUBrokerSpawnerMixin, KubeSpawner):
    """KubeSpawner with a GPU or MIG device granted by the broker (``"gpubroker-kubernetes"``;
    see the module's docstring)."""

    # KubeSpawner's traits (untyped) that every pod's grant is added to
    extra_resource_limits: dict[str, str]
    node_affinity_required: list[dict[str, Any]]
    extra_labels: dict[str, str]

    mig_strategy = Enum(
        ("mixed", "single"),
        "mixed",
        help="The device plugin's MIG strategy (the GPU operator's mig.strategy): 'mixed' asks "
        "for a MIG slice as nvidia.com/mig-<profile>, 'single' as nvidia.com/gpu.",
    ).tag(config=True)
    kueue_queue = Unicode(
        "",
        help="Kueue mode: the LocalQueue (in the pods' namespace) that GPU servers' pods go to, "
        "as their kueue.x-k8s.io/queue-name label; the spawn page shows Kueue's position while "
        "it holds a pod. Empty: no Kueue.",
    ).tag(config=True)
    kueue_visibility_version = Unicode(
        "v1beta2",
        help="The version of Kueue's visibility API (visibility.kueue.x-k8s.io) to ask for "
        "positions; v1beta1 for a Kueue that serves only that.",
    ).tag(config=True)
    kueue_poll_interval = Seconds(
        5.0,
        RESOLUTION,
        3600.0,
        help="Seconds between two readings of Kueue's positions while it holds a pod.",
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # the deployment's own values, which every pod's grant is added to
        self._configured_pod = (
            dict(self.extra_resource_limits),
            list(self.node_affinity_required),
            dict(self.extra_labels),
        )
        if self.profile_list:
            self.log.warning(
                "GPUBrokerKubeSpawner does not use KubeSpawner.profile_list: its options "
                "form is the GPU broker's"
            )

    async def load_user_options(self) -> None:
        """Nothing of KubeSpawner's profiles: ``user_options`` are the broker's."""

    def _placement(self) -> tuple[str, str, int] | None:
        """The granted node, the extended resource and how many of it (``None``: no GPU)."""
        devices = (self._gpu or {}).get("devices")
        if not devices:
            return None
        try:
            slots = Counter(parse_device_uuid(u) for u in devices)
        except ValueError as e:
            raise SpawnError(
                f"The GPU broker granted a device this spawner cannot place ({e}): give the "
                "broker the cluster's inventory (engine 'kubernetes').",
                reason="gpubroker_config",
                status_code=503,
            ) from None
        if len(slots) != 1:
            raise SpawnError(
                f"The GPU broker granted devices of {len(slots)} kinds or nodes "
                f"({', '.join(devices)}); a pod takes one kind on one node.",
                reason="gpubroker_config",
                status_code=503,
            )
        ((node, cls), n) = slots.popitem()
        return node, resource_name(cls, self.mig_strategy), n

    async def get_pod_manifest(self) -> Any:
        """KubeSpawner's pod, with the grant's limits, node affinity and labels."""
        limits, affinity, labels = self._configured_pod
        placement = self._placement()
        if placement is not None:
            node, resource, n = placement
            assert self._gpu is not None
            affinity = on_node(affinity, node)
            limits = {**limits, resource: str(n)}
            labels = {
                **labels,
                BROKER_LABEL: self.gpubroker_service,
                LEASE_LABEL: self._gpu["lease_id"],
            }
            if self.kueue_queue:
                labels[KUEUE_LABEL] = self.kueue_queue
        self.extra_resource_limits = dict(limits)
        self.node_affinity_required = list(affinity)
        self.extra_labels = dict(labels)
        return await super().get_pod_manifest()

    def _device_env(self, devices: list[str] | None) -> dict[str, str]:
        if devices is None:
            return {"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void"}
        return {}  # the device plugin sets them in the container

    # -- Kueue

    async def progress(self) -> Any:
        events = super().progress()
        if self.kueue_queue:
            events = merged(events, self._kueue_progress())
        async for event in events:
            yield event

    async def _pending_workloads(self) -> dict[str, Any]:
        path = KUEUE_VISIBILITY.format(version=self.kueue_visibility_version)
        summary: dict[str, Any] = await self.api.api_client.call_api(
            path,
            "GET",
            path_params={"namespace": self.namespace, "name": self.kueue_queue},
            response_types_map={200: "object"},
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            _request_timeout=self.k8s_api_request_timeout,
        )
        return summary

    async def _kueue_progress(self) -> AsyncIterator[dict[str, Any]]:
        """Kueue's positions of this server's pod while it is pending there, from the
        granted start on; one message and no more asking if the API does not answer."""
        said, held = "", False
        while True:
            if (self._gpu or {}).get("lease_id"):
                try:
                    position = kueue_position(await self._pending_workloads(), self.pod_name)
                except (ApiException, ClientError, OSError, asyncio.TimeoutError) as e:
                    why = getattr(e, "reason", None) or e or type(e).__name__
                    yield {
                        "message": f"Waiting for Kueue to admit the pod; its visibility API "
                        f"does not say where ({why})"
                    }
                    return
                if position is None and held:
                    yield {"progress": 80, "message": "Kueue admitted the pod"}
                    return
                if position is not None:
                    held = True
                    message = kueue_message(position)
                    if message != said:
                        said = message
                        yield {"progress": 70, "message": message}
            await asyncio.sleep(self.kueue_poll_interval)


__all__ = ["GPUBrokerKubeSpawner", "KueuePosition", "kueue_message", "kueue_position", "merged"]
