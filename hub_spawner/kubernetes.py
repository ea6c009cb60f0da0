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

On a cluster whose GPUs NVIDIA's DRA driver publishes (Kubernetes 1.34, ``resource.k8s.io/v1``),
the broker's inventory names each device (``dra:<node>:<gpu|mig>:<uuid>``), and a grant
becomes a ResourceClaim pinning those very devices (``kube_claims``): the pod's
``spec.resourceClaims`` (through ``extra_pod_config``) and the notebook container's
``resources.claims``, with the same node affinity and labels and no extended resource. A
pod the scheduler still refuses ``claim_unschedulable_timeout`` seconds on fails its start
with the scheduler's reason, and the mixin gives the lease back.

KubeSpawner's ``profile_list`` is not used: the options are the broker's (``profile`` is a MIG
profile here, not a profile slug).
"""

from __future__ import annotations

import asyncio
import time
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

from .kube_claims import CLAIM, ClaimError, Claims, DraGrant, is_dra, unschedulable
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


def claim_config(config: dict[str, Any], claim: dict[str, str]) -> dict[str, Any]:
    """``extra_pod_config`` with the grant's claim after the deployment's own claims."""
    config = dict(config)
    mine = [*config.pop("resourceClaims", []), *config.pop("resource_claims", []), claim]
    return {**config, "resourceClaims": mine}


def scheduled(pod: dict[str, Any] | None) -> bool:
    return bool(((pod or {}).get("spec") or {}).get("nodeName"))


class ClaimedKubeSpawner(KubeSpawner):
    """KubeSpawner whose pod takes a grant of DRA devices as a claim: the part of
    ``GPUBrokerKubeSpawner`` between the grant (the mixin, in front of it) and the pod.

    A start makes the claim's template (or a share's claim) before the pod, after any pod
    an earlier start left (the hub restarted mid-spawn: the same lease, so the same
    devices, and the old pod's claim goes with it), makes the pod its owner once it
    exists, and fails once the scheduler has refused the pod for
    ``claim_unschedulable_timeout`` seconds; ``stop`` removes what the start made."""

    _gpu: dict[str, Any] | None
    gpubroker_service: str

    claim_unschedulable_timeout = Seconds(
        15.0,
        0.0,
        3600.0,
        help="Seconds a GPU server's pod may stay unschedulable for its DRA claim before its "
        "start fails with the scheduler's reason (a device still held by a pod that is "
        "ending frees within seconds); 0: at the scheduler's first refusal.",
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._claim: dict[str, Any] | None = None
        """The template or shared claim the last start made, until ``stop`` removes it."""

    def _dra_grant(self) -> DraGrant | None:
        """The grant as DRA devices; None: no GPU, or the device plugin's devices."""
        if not is_dra((self._gpu or {}).get("devices") or []):
            return None
        assert self._gpu is not None
        try:
            return DraGrant.of(self._gpu)
        except ValueError as e:
            raise SpawnError(
                f"The GPU broker granted devices one pod cannot take ({e}); a pod takes the "
                "devices of one node.",
                reason="gpubroker_config",
                status_code=503,
            ) from None

    @property
    def _claims(self) -> Claims:
        return Claims(self.api.api_client, self.namespace, self.k8s_api_request_timeout)

    def _manifest(self, grant: DraGrant) -> dict[str, Any]:
        lease = (self._gpu or {}).get("lease_id", "")
        return grant.manifest(self.pod_name, self.namespace, self.gpubroker_service, lease)

    async def start(self) -> Any:
        grant = self._dra_grant()
        if grant is None:
            return await super().start()
        manifest = self._manifest(grant)
        try:
            await self._earlier_pod_gone()
            await self._claims.prepare(manifest)
        except ClaimError as e:
            raise claim_failed(e) from None
        self._claim = manifest
        started = super().start()
        following = asyncio.ensure_future(self._follow(manifest))
        try:
            await asyncio.wait([started, following], return_when=asyncio.FIRST_COMPLETED)
            if following.done():
                following.result()  # the scheduler's refusal, or the API server's
            url = await started
            await asyncio.wait_for(following, self.k8s_api_request_timeout)
            return url
        except BaseException:
            started.cancel()
            following.cancel()
            await KubeSpawner.stop(self, now=True)
            await self._release_claim()
            raise

    async def _earlier_pod_gone(self) -> None:
        """Delete a pod of this server an earlier start left (KubeSpawner's own answer to
        finding one is to call ``stop``, which would give the lease back)."""
        try:
            await self.api.read_namespaced_pod(self.pod_name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return
            why = f"the API server refused to read pods ({e.status} {e.reason})"
            raise ClaimError(why) from None
        self.log.info("%s: deleting the pod an earlier start left", self._log_name)
        await KubeSpawner.stop(self, now=True)

    async def _follow(self, manifest: dict[str, Any]) -> None:
        """Own the claim once the pod exists; fail once the scheduler refused it for
        ``claim_unschedulable_timeout`` seconds; return once it is owned and bound."""
        key, owned, since = f"{self.namespace}/{self.pod_name}", False, 0.0
        while True:
            reflector = self.pod_reflector
            pod = reflector.pods.get(key) if reflector is not None else None
            if pod is not None and not owned:
                try:
                    await self._claims.own(manifest, pod)
                except ClaimError as e:
                    raise claim_failed(e) from None
                owned = True
            why = unschedulable(pod)
            since = (since or time.monotonic()) if why else 0.0
            if why and time.monotonic() - since >= self.claim_unschedulable_timeout:
                raise SpawnError(
                    f"The cluster cannot place this server's GPU: {why}.",
                    reason="gpu_claim_unschedulable",
                    status_code=503,
                )
            if owned and scheduled(pod):
                return
            await asyncio.sleep(0.5)

    async def stop(self, now: bool = False) -> None:
        await super().stop(now)
        await self._release_claim()

    async def _release_claim(self) -> None:
        """The pod is gone: its template goes, and a shared claim no pod owns."""
        manifest, self._claim = self._claim, None
        if manifest is None:
            try:
                grant = self._dra_grant()
            except SpawnError:
                grant = None
            manifest = self._manifest(grant) if grant is not None else None
        if manifest is not None:
            try:
                await self._claims.release(manifest)
            except ClaimError as e:
                self.log.warning("Could not remove %s's GPU claim: %s", self._log_name, e)


def claim_failed(e: ClaimError) -> SpawnError:
    return SpawnError(
        f"Cannot start the server with its GPU claim: {e}.", reason="gpu_claim", status_code=503
    )


class GPUBrokerKubeSpawner(GPUBrokerSpawnerMixin, ClaimedKubeSpawner):
    """KubeSpawner with a GPU or MIG device granted by the broker (``"gpubroker-kubernetes"``;
    see the module's docstring)."""

    # KubeSpawner's traits (untyped) that every pod's grant is added to
    extra_resource_limits: dict[str, str]
    node_affinity_required: list[dict[str, Any]]
    extra_labels: dict[str, str]
    extra_pod_config: dict[str, Any]

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
            dict(self.extra_pod_config),
        )
        if self.profile_list:
            self.log.warning(
                "GPUBrokerKubeSpawner does not use KubeSpawner.profile_list: its options "
                "form is the GPU broker's"
            )

    async def load_user_options(self) -> None:
        """Nothing of KubeSpawner's profiles: ``user_options`` are the broker's."""

    def _dra_grant(self) -> DraGrant | None:
        """Refused in Kueue mode: Kueue's claim quota (0.14 on) finds a claim whose request
        has a CEL selector, or a shared claim's MPS config, inadmissible ("CEL selectors
        are not supported"), so the pod would be gated for good (docs/kubernetes.md)."""
        grant = super()._dra_grant()
        if grant is not None and self.kueue_queue:
            raise SpawnError(
                "This hub sends GPU servers to Kueue, which cannot count a GPU claimed by "
                "its name, as this cluster's GPUs are: an admin has to turn Kueue mode off "
                "(c.GPUBrokerKubeSpawner.kueue_queue) for this cluster.",
                reason="gpubroker_config",
                status_code=503,
            )
        return grant

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
        """KubeSpawner's pod, with the grant's node affinity and labels, and its limits
        (the device plugin's devices) or its claim (DRA devices)."""
        limits, affinity, labels, pod_config = self._configured_pod
        grant = self._dra_grant()
        placement = None if grant is not None else self._placement()
        node = grant.node if grant is not None else placement[0] if placement else None
        if node is not None:
            assert self._gpu is not None
            affinity = on_node(affinity, node)
            labels = {
                **labels,
                BROKER_LABEL: self.gpubroker_service,
                LEASE_LABEL: self._gpu["lease_id"],
            }
            if self.kueue_queue:
                labels[KUEUE_LABEL] = self.kueue_queue
        if placement is not None:
            limits = {**limits, placement[1]: str(placement[2])}
        if grant is not None:
            pod_config = claim_config(pod_config, grant.pod_claim(self.pod_name))
        self.extra_resource_limits = dict(limits)
        self.node_affinity_required = list(affinity)
        self.extra_labels = dict(labels)
        self.extra_pod_config = dict(pod_config)
        pod = await super().get_pod_manifest()
        if grant is not None:
            (notebook,) = [c for c in pod.spec.containers if c.name == "notebook"]
            notebook.resources.claims = [*(notebook.resources.claims or []), {"name": CLAIM}]
        return pod

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


__all__ = [
    "ClaimedKubeSpawner",
    "GPUBrokerKubeSpawner",
    "KueuePosition",
    "claim_config",
    "kueue_message",
    "kueue_position",
    "merged",
]
