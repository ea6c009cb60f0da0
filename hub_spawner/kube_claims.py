"""A grant of DRA devices as the cluster allocates it: the ResourceClaim a server's pod
asks for, built from plain values (tested without a cluster, as KubeSpawner's
``objects.py`` builds its pods), and the few calls that make, own and remove it.

On Kubernetes 1.34 (``resource.k8s.io/v1``) a pod names its devices in
``spec.resourceClaims``, and a container takes them through ``resources.claims``; the
scheduler allocates each claim from the drivers' ResourceSlices. The broker names the very
device it granted (``jupyter_gpubroker.engines.dra``), so each request of the claim is
``exactly`` one device of its class (``gpu.nvidia.com`` or ``mig.nvidia.com``) with a CEL
selector on its ``uuid``: the scheduler can place the grant or fail, never pick another.

- Whole GPUs and MIG devices: a ResourceClaimTemplate per server, named for its pod, carrying
  the broker's and the lease's labels, which the claim generated from it copies. The
  template is made afresh for each start and owned by the pod once it exists, so the
  garbage collector removes it with the pod; the claim is the pod's own (the resource
  claim controller makes and deletes it).
- A share of a GPU: in 1.34 a device is allocated to one claim at a time, and pods share a
  GPU by sharing a claim, as NVIDIA's driver shows it (its ``gpu-test3``: "one shared,
  global claim"). So every share of a GPU names one ResourceClaim of that GPU, configured
  for MPS (``GpuConfig`` ``sharing.strategy: MPS``), owned by each share's pod; the garbage
  collector deletes it once the last of them is gone, and the resource claim controller
  deallocates it as soon as nothing reserves it. Each server's own limits are in its
  environment (the broker's ``share_env``), which MPS holds its clients to.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio.client import ApiException, ResourceV1Api

from jupyter_gpubroker.engines.dra import DRIVER, UUID_PREFIX, DraDevice, parse_dra_uuid
from jupyter_gpubroker.engines.kubernetes import BROKER_LABEL, LEASE_LABEL

CLAIM = "gpu"
"""The pod's name for its claim, by which the notebook container takes it."""
SHARED_LABEL = "gpubroker.jupyter.org/shared-gpu"
"""On a shared GPU's claim: ``true``. Its leases are those of the pods it is reserved for."""
RESOURCE_API = "resource.k8s.io/v1"
GPU_CONFIG = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}
"""NVIDIA's opaque configuration of a GPU (its ``api/nvidia.com/resource/v1beta1``)."""


def is_dra(devices: Sequence[str]) -> bool:
    return any(d.startswith(f"{UUID_PREFIX}:") for d in devices)


def template_name(pod_name: str) -> str:
    return f"{pod_name}-{CLAIM}"


def shared_name(device: DraDevice) -> str:
    """The claim every share of ``device`` names (GPU UUIDs are unique in a cluster)."""
    return "gpubroker-shared-" + re.sub(r"[^a-z0-9-]", "-", device.uuid.lower()).strip("-")


@dataclass(frozen=True)
class DraGrant:
    """The devices of one grant, on one node, and whether it is a share of its GPU."""

    devices: tuple[DraDevice, ...]
    shared: bool

    @classmethod
    def of(cls, held: Mapping[str, Any]) -> DraGrant:
        """The grant a server's reservation holds; ``ValueError`` for devices one pod
        cannot take (another inventory's, two nodes, a share of several)."""
        devices = tuple(parse_dra_uuid(d) for d in held["devices"])
        if len({d.node for d in devices}) != 1:
            raise ValueError(f"devices on {len({d.node for d in devices})} nodes")
        shared = bool(held.get("share_text"))
        if shared and (len(devices) != 1 or devices[0].kind != "gpu"):
            raise ValueError("a share names one GPU")
        return cls(devices, shared)

    @property
    def node(self) -> str:
        return self.devices[0].node

    def claim_spec(self) -> dict[str, Any]:
        """The claim's ``spec``: one request per device, each pinned by its selector; a
        share's GPU configured for MPS."""
        n = len(self.devices)
        names = [CLAIM] if n == 1 else [f"{CLAIM}-{i}" for i in range(n)]
        requests = [
            {
                "name": name,
                "exactly": {
                    "deviceClassName": d.device_class,
                    "selectors": [{"cel": {"expression": d.selector}}],
                },
            }
            for name, d in zip(names, self.devices, strict=True)
        ]
        devices: dict[str, Any] = {"requests": requests}
        if self.shared:
            mps = {**GPU_CONFIG, "sharing": {"strategy": "MPS"}}
            devices["config"] = [
                {"requests": names, "opaque": {"driver": DRIVER, "parameters": mps}}
            ]
        return {"devices": devices}

    def claim_name(self, pod_name: str) -> str:
        """The template (whole devices) or the shared claim (a share) the pod names."""
        return shared_name(self.devices[0]) if self.shared else template_name(pod_name)

    def pod_claim(self, pod_name: str) -> dict[str, str]:
        """The pod's ``spec.resourceClaims`` entry."""
        key = "resourceClaimName" if self.shared else "resourceClaimTemplateName"
        return {"name": CLAIM, key: self.claim_name(pod_name)}

    def manifest(self, pod_name: str, namespace: str, broker: str, lease: str) -> dict[str, Any]:
        """The ResourceClaimTemplate, labelled with the broker and the lease as the pod is
        (its claim copies them), or a share's ResourceClaim, which serves several leases."""
        meta = {"name": self.claim_name(pod_name), "namespace": namespace}
        if self.shared:
            labels = {BROKER_LABEL: broker, SHARED_LABEL: "true"}
            return {
                "apiVersion": RESOURCE_API,
                "kind": "ResourceClaim",
                "metadata": {**meta, "labels": labels},
                "spec": self.claim_spec(),
            }
        labels = {BROKER_LABEL: broker, LEASE_LABEL: lease}
        return {
            "apiVersion": RESOURCE_API,
            "kind": "ResourceClaimTemplate",
            "metadata": {**meta, "labels": labels},
            "spec": {"metadata": {"labels": labels}, "spec": self.claim_spec()},
        }


def owner(pod: Mapping[str, Any]) -> dict[str, str]:
    """An owner reference to ``pod`` (as the API server lists it) that lets the garbage
    collector remove what it owns with it; not a controller, so a shared claim may have
    several and the claim controller never takes it for a pod's generated claim."""
    meta = pod["metadata"]
    return {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}


def unschedulable(pod: Mapping[str, Any] | None) -> str:
    """The scheduler's reason for not placing ``pod`` ("" while it has none): its
    ``PodScheduled`` condition's message up to the first sentence's end, without what it
    adds of preemption ("0/8 nodes are available: 1 cannot allocate all claims, 7 node(s)
    didn't satisfy plugin(s) [NodeAffinity]")."""
    for c in ((pod or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable":
            message = str(c.get("message") or "the scheduler gave no reason")
            return message.split(". ", 1)[0].rstrip(".")
    return ""


class ClaimError(Exception):
    """What the API server refused, in words."""


TEMPLATE, SHARED = "resource_claim_template", "resource_claim"
"""The kinds ``ResourceV1Api`` names its calls by."""


def api_message(e: ApiException) -> str:
    """What the API server said of a refusal (its Status's message), else its status."""
    try:
        said = json.loads(e.body or "{}").get("message")
    except (ValueError, AttributeError):
        said = None
    return str(said or f"{e.status} {e.reason}")


def kind_of(manifest: Mapping[str, Any]) -> str:
    return SHARED if manifest["kind"] == "ResourceClaim" else TEMPLATE


class Claims:
    """The calls on the claims of one namespace, through KubeSpawner's API client."""

    def __init__(self, api_client: Any, namespace: str, timeout: float) -> None:
        self.api = ResourceV1Api(api_client)
        self.namespace, self.timeout = namespace, timeout

    async def _call(self, verb: str, kind: str, *args: Any, ok: tuple[int, ...] = ()) -> Any:
        """``verb`` on ``kind`` (``read``, ``create``, ``patch``, ``delete``); None where the
        API server answers one of the statuses ``ok``; a refusal as ClaimError."""
        call = getattr(self.api, f"{verb}_namespaced_{kind}")
        what = f"{'get' if verb == 'read' else verb} {kind.replace('_', ' ')}s"  # as RBAC says
        options: dict[str, Any] = {}
        if verb == "create":
            # Sent compact: the API server keeps an opaque configuration's bytes as they
            # came, but compares them re-encoded compact when the object is patched, and the
            # client's JSON has spaces: its owner's patch would be refused ("spec: field is
            # immutable"). YAML is the one other type the client sends as given.
            manifest = args[-1]
            args = (*args[:-1], json.dumps(manifest, separators=(",", ":")).encode())
            options["_headers"] = {"Content-Type": "application/yaml"}
        try:
            return await asyncio.wait_for(call(*args, **options), self.timeout)
        except ApiException as e:
            if e.status in ok:
                return None
            if e.status == 403:
                raise ClaimError(
                    f"the API server forbids the hub to {what} in namespace {self.namespace}: "
                    "grant its service account the rules docs/kubernetes.md gives"
                ) from None
            raise ClaimError(f"the API server refused to {what}: {api_message(e)}") from None
        except (OSError, asyncio.TimeoutError) as e:
            raise ClaimError(f"the API server did not answer ({e or type(e).__name__})") from None

    async def _gone(self, kind: str, name: str) -> None:
        deadline = time.monotonic() + self.timeout
        while await self._call("read", kind, name, self.namespace, ok=(404,)) is not None:
            if time.monotonic() > deadline:
                raise ClaimError(f"{name} was not deleted within {self.timeout:g} seconds")
            await asyncio.sleep(0.2)

    async def prepare(self, manifest: dict[str, Any]) -> None:
        """A server's template made afresh (no owner yet, nothing of an earlier start); a
        shared GPU's claim made where it is not there (one being deleted: once it is gone)."""
        name = manifest["metadata"]["name"]
        if kind_of(manifest) == TEMPLATE:
            await self._call("delete", TEMPLATE, name, self.namespace, ok=(404,))
            await self._gone(TEMPLATE, name)
            await self._call("create", TEMPLATE, self.namespace, manifest)
            return
        found = await self._call("read", SHARED, name, self.namespace, ok=(404,))
        if found is not None and found.metadata.deletion_timestamp:
            await self._gone(SHARED, name)
            found = None
        if found is None:  # another share's start may make it first
            await self._call("create", SHARED, self.namespace, manifest, ok=(409,))

    async def own(self, manifest: dict[str, Any], pod: Mapping[str, Any]) -> None:
        """Make ``pod`` an owner of its template or claim; a shared claim deleted since
        ``prepare`` (its last owner went) is made again, owned."""
        kind = kind_of(manifest)
        name, body = manifest["metadata"]["name"], {"metadata": {"ownerReferences": [owner(pod)]}}
        done = await self._call("patch", kind, name, self.namespace, body, ok=(404,))
        if done is None or done.metadata.deletion_timestamp:
            await self._gone(kind, name)
            owned = {**manifest, "metadata": {**manifest["metadata"], **body["metadata"]}}
            await self._call("create", kind, self.namespace, owned)

    async def release(self, manifest: dict[str, Any]) -> None:
        """Once a server's pod is gone: its template deleted; a shared claim only where no
        pod owns it (made for a start that never made its pod)."""
        name, kind = manifest["metadata"]["name"], kind_of(manifest)
        if kind == SHARED:
            found = await self._call("read", SHARED, name, self.namespace, ok=(404,))
            if found is None or found.metadata.owner_references:
                return
        await self._call("delete", kind, name, self.namespace, ok=(404,))


__all__ = [
    "CLAIM",
    "SHARED_LABEL",
    "ClaimError",
    "Claims",
    "DraGrant",
    "is_dra",
    "owner",
    "template_name",
    "unschedulable",
]
