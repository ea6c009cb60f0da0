"""Kubernetes: the inventory from the nodes' GPU resources, read from the API server.

NVIDIA's device plugin advertises GPUs as extended resources in each node's
``status.allocatable``: ``nvidia.com/gpu`` for whole GPUs and, under its ``mixed`` MIG
strategy, ``nvidia.com/mig-<g>g.<mem>gb`` per MIG profile. Under the ``single`` strategy
every MIG device is advertised as ``nvidia.com/gpu`` too, and only the node's labels from
GPU feature discovery say so (``nvidia.com/mig.strategy=single``, ``nvidia.com/gpu.product``
ending in ``-MIG-<profile>``). The API server says neither which physical GPU a MIG device
is on nor which device the kubelet gave a pod, so devices are counted per node and class
and named by this source: ``k8s:<node>:<class>:<i>``, each listed as its own GPU (a MIG
device cannot be re-cut from here: MIG manager does that), and a grant is carried out as a
count of that resource on that node (``hub_spawner/kubernetes.py``).

GPU sharing (the device plugin's time-slicing or MPS) advertises each device as
``replicas`` shares, under its own name or renamed ``<resource>.shared``, and GPU feature
discovery labels the node ``<resource>.replicas`` and ``nvidia.com/gpu.sharing-strategy``.
A share is not a device of its own, so such a class is listed as its physical devices
and withheld from grants, with the reason (``ClusterView.withheld``).

What runs on a node is the requests of its bound pods that have not ended; the broker's own
pods (labelled ``gpubroker.jupyter.org/broker=<its name>``) are its grants, listed by
their ``gpubroker.jupyter.org/lease`` label, bound to a node or still pending (a lease
whose pod is gone is released; a pod whose lease has ended still holds its devices until
it stops); the rest, once bound, is work outside the broker. A cordoned (unschedulable)
or NotReady node is down with that reason; a node that left the cluster is drained by
:func:`apply_view`.

Where NVIDIA's DRA driver publishes a pool for a node (Kubernetes 1.34+), that node's
devices and what uses them are read from its ResourceSlices and the allocated
ResourceClaims instead (:mod:`.dra_inventory`), device by device; the view says which
source it read (``ClusterView.source``).
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from traitlets import Unicode

from ..broker.models import Device, Gpu, Inventory
from ..broker.shapes import WHOLE_GPU
from ..wire.profiles import CATALOG, COMPUTE_SLICES, GpuModel, profile_memory_gb
from ..wire.sizes import RESOLUTION, gb_to_mib
from ..wire.traits import Seconds
from . import ClusterView, EngineUnavailable, InventorySource
from .dra import DRIVER
from .dra_inventory import SOURCE as DRA_SOURCE
from .dra_inventory import claims_use, dra_inventory

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
STRATEGY_LABEL = "nvidia.com/mig.strategy"
PRODUCT_LABEL = "nvidia.com/gpu.product"
MEMORY_LABEL = "nvidia.com/gpu.memory"
SHARING_LABEL = "nvidia.com/gpu.sharing-strategy"
SHARED_SUFFIX = ".shared"
"""What the device plugin's ``renameByDefault`` appends to a shared resource's name."""
BROKER_LABEL = "gpubroker.jupyter.org/broker"
"""On the pods of the broker's grants: the broker's name (its hub service's name)."""
LEASE_LABEL = "gpubroker.jupyter.org/lease"
"""On the pods of the broker's grants: the lease the pod runs under."""
UUID_PREFIX = "k8s"
ENDED_PHASES = ("Succeeded", "Failed")

_SINGLE_PRODUCT = re.compile(r"-MIG-(\d+g\.\d+gb(?:[.+]me)?)")


def resource_name(device_class: str, strategy: str) -> str:
    """The extended resource a pod asks for to get one device of ``device_class`` (a MIG
    profile or ``gpu``) under the device plugin's MIG ``strategy``: ``nvidia.com/gpu`` for a
    whole GPU and for any MIG device under ``single``; ``nvidia.com/mig-<profile>`` under
    ``mixed``, where the plugin writes a profile's ``+me`` as ``.me``."""
    if device_class == WHOLE_GPU or strategy == "single":
        return GPU_RESOURCE
    return MIG_RESOURCE_PREFIX + device_class.replace("+", ".")


def _profile(name: str) -> str:
    """A MIG profile as the broker names it, from the device plugin's spelling."""
    return name[: -len(".me")] + "+me" if name.endswith(".me") else name


def device_uuid(node: str, device_class: str, index: int) -> str:
    return f"{UUID_PREFIX}:{node}:{device_class}:{index}"


def parse_device_uuid(uuid: str) -> tuple[str, str]:
    """The node and device class of a device this source named; ``ValueError`` for a name
    it did not make (a device of another engine or of one machine)."""
    parts = uuid.split(":")
    if len(parts) != 4 or parts[0] != UUID_PREFIX or not parts[3].isdigit():
        raise ValueError(f"{uuid!r} is not a Kubernetes device of the broker (k8s:NODE:CLASS:N)")
    return parts[1], parts[2]


def _norm(name: str) -> str:
    return name.replace(" ", "-").removeprefix("NVIDIA-")


def model_for_product(product: str) -> GpuModel | None:
    """The catalog's model for a ``nvidia.com/gpu.product`` label (NVML's name with dashes
    for spaces; a ``-MIG-<profile>`` or ``-SHARED`` suffix added by the plugin)."""
    base = _norm(_SINGLE_PRODUCT.split(product)[0].removesuffix("-SHARED"))
    for model in CATALOG.values():
        if base in {_norm(n) for n in model.nvml_names}:
            return model
    return None


def _count(quantity: Any) -> int:
    """An extended resource's quantity (always a whole number); anything else counts 0."""
    try:
        return int(str(quantity))
    except ValueError:
        return 0


def _gpu_resources(container: Any) -> Counter[str]:
    resources = container.resources
    wanted: Counter[str] = Counter()
    if resources is None:
        return wanted
    # Extended resources cannot be overcommitted: a request equals its limit, and a
    # limit alone sets the request.
    for amounts in (resources.limits or {}, resources.requests or {}):
        for name, q in amounts.items():
            if name == GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX):
                wanted[name] = max(wanted[name], _count(q))
    return wanted


def pod_gpu_requests(pod: Any) -> Counter[str]:
    """The GPU resources a pod holds on its node: its containers' together, or its largest
    init container's if larger (the scheduler's effective request)."""
    spec = pod.spec
    total: Counter[str] = Counter()
    for c in spec.containers or []:
        total.update(_gpu_resources(c))
    for c in spec.init_containers or []:
        for name, n in _gpu_resources(c).items():
            total[name] = max(total[name], n)
    return total


def down_reason(node: Any) -> str | None:
    """Why a node takes no pods, as Kubernetes says it: cordoned, or not Ready."""
    why = []
    if node.spec is not None and node.spec.unschedulable:
        why.append("cordoned (unschedulable)")
    conditions = (node.status.conditions if node.status else None) or []
    ready = next((c for c in conditions if c.type == "Ready"), None)
    if ready is None or ready.status != "True":
        detail = ": ".join(x for x in (ready.reason, ready.message) if x) if ready else ""
        why.append(f"NotReady ({detail})" if detail else "NotReady")
    return ", ".join(why) or None


def _node_devices(
    node: str, labels: Mapping[str, str], classes: Iterable[tuple[str, str, int]]
) -> tuple[list[Gpu], list[Device]]:
    product = labels.get(PRODUCT_LABEL, "")
    model = model_for_product(product)
    name = _SINGLE_PRODUCT.split(product)[0].removesuffix("-SHARED") or "NVIDIA GPU"
    gpus: list[Gpu] = []
    devices: list[Device] = []
    for resource, cls, n in classes:
        memory, slices, profile = _size(cls, resource, labels, model)
        for i in range(n):
            uuid = device_uuid(node, cls, i)
            index = len(gpus)
            mig = profile is not None
            key = model.key if model else None
            gpus.append(Gpu(index, uuid, name, memory, mig, key, node=node))
            devices.append(
                Device(
                    uuid,
                    "mig" if mig else "gpu",
                    index,
                    uuid,
                    memory,
                    compute_slices=slices,
                    profile=profile,
                    start=0 if mig else None,
                    node=node,
                )
            )
    return gpus, devices


def _size(
    cls: str, resource: str, labels: Mapping[str, str], model: GpuModel | None
) -> tuple[int, int, str | None]:
    """Memory (MiB), compute slices and MIG profile of one device of ``cls``: from the
    catalog when it knows the model, else from GPU feature discovery's labels, else from
    the profile's name."""
    strategy = labels.get(STRATEGY_LABEL, "none")
    if cls == WHOLE_GPU:
        memory = _count(labels.get(MEMORY_LABEL, 0)) or (model.memory_mib if model else 0)
        return memory, COMPUTE_SLICES, None
    known = model.profile(cls) if model else None
    if known is not None:
        return known.memory_mib, known.compute_slices, cls
    label = MEMORY_LABEL if strategy == "single" else f"{resource}.memory"
    memory = _count(labels.get(label, 0)) or int(gb_to_mib(profile_memory_gb(cls)))
    return memory, int(cls.split("g", 1)[0]), cls


PLUGIN_SOURCE = "the device plugin's extended resources"


def cluster_view(
    nodes: Iterable[Any],
    pods: Iterable[Any],
    broker: str,
    slices: Iterable[Any] = (),
    claims: Iterable[Any] = (),
) -> ClusterView:
    """What the API server's ``nodes`` and ``pods`` (the official client's ``V1Node`` and
    ``V1Pod``) say, and on the nodes NVIDIA's DRA driver publishes, its ``slices`` and the
    ``claims`` allocated from them: every GPU node's devices, the devices work outside
    ``broker``'s grants holds, the broker's pods by lease, the nodes that take no pods
    and the classes shared out. ``pods``: every pod not ended, bound or not."""
    nodes = sorted(nodes, key=lambda n: str(n.metadata.name))
    pods = list(pods)
    used, mine, holders = pods_use(pods, broker)
    dra = dra_inventory(slices, (str(n.metadata.name) for n in nodes))
    gpus, devices = list(dra.gpus), list(dra.devices)
    outside: dict[tuple[str, str], int] = {}
    down: dict[str, str] = {}
    withheld: dict[tuple[str, str], str] = {}
    class_of: dict[tuple[str, str], str] = {}
    plugin_nodes = 0
    for node in nodes:
        name = str(node.metadata.name)
        classes, shared = node_classes(node) if name not in dra.nodes else ([], {})
        withheld.update(shared)
        if name not in dra.nodes and not classes:
            continue  # no GPUs: not the broker's
        if classes:
            plugin_nodes += 1
            node_gpus, node_devices = _node_devices(name, node.metadata.labels or {}, classes)
            gpus += node_gpus
            devices += node_devices
        for resource, cls, n in classes:
            class_of[(name, resource)] = cls
            if used[(name, resource)] and (name, cls) not in withheld:
                outside[(name, cls)] = min(n, used[(name, resource)])
        reason = down_reason(node)
        if reason:
            down[name] = reason
    grants = {
        lease: Counter({(at[0], class_of[at]): n for at, n in held.items() if at in class_of})
        for lease, held in mine.items()
    }
    named, lease_devices = claims_use(claims, dra.names, pod_leases(pods, broker))
    return ClusterView(
        Inventory(tuple(gpus), tuple(devices)),
        outside,
        down,
        holders=holders,
        grants=grants,
        withheld=withheld,
        outside_devices=named,
        lease_devices=lease_devices,
        source=source_text(len(dra.nodes), plugin_nodes),
    )


def source_text(dra_nodes: int, plugin_nodes: int) -> str:
    """Which source the inventory is read from, as the log and the admin page say it."""
    if dra_nodes and plugin_nodes:
        return f"{DRA_SOURCE} on {_nodes(dra_nodes)}, {PLUGIN_SOURCE} on {_nodes(plugin_nodes)}"
    return DRA_SOURCE if dra_nodes else PLUGIN_SOURCE


def _nodes(n: int) -> str:
    return f"{n} node" if n == 1 else f"{n} nodes"


def pod_lease(pod: Any, broker: str) -> str | None:
    """The lease of ``broker``'s a pod carries out (``""``: the broker's pod without one;
    ``None``: not the broker's)."""
    labels = pod.metadata.labels or {}
    return labels.get(LEASE_LABEL, "") if labels.get(BROKER_LABEL) == broker else None


def pod_leases(pods: Iterable[Any], broker: str) -> dict[str, str | None]:
    """:func:`pod_lease` of each pod, by its UID."""
    return {str(pod.metadata.uid): pod_lease(pod, broker) for pod in pods}


PodsUse = tuple[Counter[tuple[str, str]], dict[str, Counter[tuple[str, str]]], dict[str, str]]
"""What pods hold: (node, resource) -> count outside the broker's grants; lease -> (node,
resource) -> count of the broker's own pods; lease -> its pod (``namespace/name``)."""


def pods_use(pods: Iterable[Any], broker: str) -> PodsUse:
    """The GPU resources ``pods`` hold on their nodes, outside ``broker``'s grants and in
    them by lease, and the broker's pods by lease (bound or not)."""
    used: Counter[tuple[str, str]] = Counter()
    mine: dict[str, Counter[tuple[str, str]]] = {}
    holders: dict[str, str] = {}
    for pod in pods:
        where = pod.spec.node_name if pod.spec else None
        phase = pod.status.phase if pod.status else None
        if phase in ENDED_PHASES:
            continue
        lease = pod_lease(pod, broker)
        if lease:
            holders[lease] = f"{pod.metadata.namespace}/{pod.metadata.name}"
        if not where or lease == "":
            continue  # not bound to a node yet, or the broker's without a lease: not counted
        held = used if lease is None else mine.setdefault(lease, Counter())
        for resource, n in pod_gpu_requests(pod).items():
            held[(where, resource)] += n
    return used, mine, holders


def node_classes(
    node: Any,
) -> tuple[list[tuple[str, str, int]], dict[tuple[str, str], str]]:
    """A node's allocatable GPU resources as (resource, device class, count), a shared
    one counted once per device, and the (node, class) of shared ones with why the
    broker grants none of them."""
    name = str(node.metadata.name)
    labels = node.metadata.labels or {}
    allocatable = (node.status.allocatable if node.status else None) or {}
    single = _SINGLE_PRODUCT.search(labels.get(PRODUCT_LABEL, ""))
    classes: list[tuple[str, str, int]] = []
    withheld: dict[tuple[str, str], str] = {}
    for resource, q in sorted(allocatable.items()):
        base = resource.removesuffix(SHARED_SUFFIX)
        if base == GPU_RESOURCE:
            strategy = labels.get(STRATEGY_LABEL)
            cls = _profile(single.group(1)) if single and strategy == "single" else WHOLE_GPU
        elif base.startswith(MIG_RESOURCE_PREFIX):
            cls = _profile(base.removeprefix(MIG_RESOURCE_PREFIX))
        else:
            continue
        n = _count(q)
        replicas = max(1, _count(labels.get(f"{base}.replicas", 1)))
        if replicas > 1 or base != resource:
            n = max(1, n // replicas) if n else 0
            withheld[(name, cls)] = _shared_reason(cls, replicas, labels)
        if n > 0:
            classes.append((base, cls, n))
    return classes, withheld


def _shared_reason(cls: str, replicas: int, labels: Mapping[str, str]) -> str:
    """Why a shared class is withheld, and what the admin can do about it."""
    how = labels.get(SHARING_LABEL, "")
    how = f" ({how})" if how and how != "none" else ""
    ways = f" {replicas} ways" if replicas > 1 else ""
    return (
        f"the device plugin shares each {cls}{ways}{how}, so a pod there gets a share, not a "
        f"{cls} of its own: the broker grants none of them (give the node a device plugin "
        "config without sharing to schedule it)"
    )


class KubernetesInventory(InventorySource):
    """The broker's inventory from a Kubernetes cluster (``c.GPUBroker`` engine
    ``"kubernetes"``): nodes and pods listed from the API server on every tick, in the
    cluster with the service account's token, else with ``$KUBECONFIG``."""

    name = "kubernetes"
    work = "pod"

    broker_name = Unicode(
        "gpubroker",
        help="The gpubroker.jupyter.org/broker label of this broker's own pods (the hub "
        "service's name, which GPUBrokerKubeSpawner writes there): their GPUs are the "
        "broker's grants, not work outside it.",
    ).tag(config=True)
    node_selector = Unicode(
        "",
        help="A label selector for the nodes the broker hands out, e.g. "
        "'nvidia.com/gpu.present=true,pool=notebooks'; empty: every node with GPUs.",
    ).tag(config=True)
    kubeconfig = Unicode(
        "",
        help="A kubeconfig file for a broker outside the cluster; empty: the pod's service "
        "account inside a cluster, else $KUBECONFIG or ~/.kube/config.",
    ).tag(config=True)
    request_timeout = Seconds(
        10.0, RESOLUTION, 3600.0, help="Seconds the API server has to answer one list call."
    ).tag(config=True)

    _configuration: Any = None

    async def _configured(self) -> Any:
        """The client's configuration (server, credentials), loaded once."""
        from kubernetes_asyncio import client, config

        if self._configuration is None:
            configuration = client.Configuration()
            try:
                if self.kubeconfig:
                    raise config.ConfigException("a kubeconfig is configured")
                config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            except config.ConfigException:
                try:
                    await config.load_kube_config(
                        config_file=self.kubeconfig or None, client_configuration=configuration
                    )
                except (config.ConfigException, OSError) as e:
                    raise EngineUnavailable(
                        f"no Kubernetes API server configured ({e}): run the broker in the "
                        "cluster with a service account, or set KUBECONFIG or "
                        "c.KubernetesInventory.kubeconfig"
                    ) from None
            self._configuration = configuration
        return self._configuration

    async def read(self) -> ClusterView:
        """One reading, on a client of its own: its connections belong to the event loop
        it runs on (the broker's first reading runs on one of its own)."""
        from kubernetes_asyncio.client import ApiClient

        async with ApiClient(await self._configured()) as api_client:
            return await self._read(api_client)

    async def _read(self, api_client: Any) -> ClusterView:
        from kubernetes_asyncio.client import CoreV1Api, ResourceV1Api

        core, dra = CoreV1Api(api_client), ResourceV1Api(api_client)
        # resource_version "0": served from the API server's watch cache, not from etcd
        listed = {"resource_version": "0", "_request_timeout": self.request_timeout}
        answers = await asyncio.gather(
            core.list_node(label_selector=self.node_selector, **listed),
            core.list_pod_for_all_namespaces(
                field_selector="status.phase!=Succeeded,status.phase!=Failed", **listed
            ),
            dra.list_resource_slice(field_selector=f"spec.driver={DRIVER}", **listed),
            dra.list_resource_claim_for_all_namespaces(**listed),
            return_exceptions=True,
        )
        nodes, pods, slices, claims = (
            _items(a, what, api_client.configuration.host)
            for a, what in zip(answers, LISTED, strict=True)
        )
        return cluster_view(nodes, pods, self.broker_name, slices, claims)


LISTED = ("nodes", "pods", "resourceslices", "resourceclaims")
"""What each reading lists, in order."""
RBAC_HINTS = {
    "nodes": "grant the broker's service account list on nodes and pods "
    "(a ClusterRole and its binding)",
    "resourceslices": "grant the broker's service account list on resourceslices and "
    "resourceclaims (add to its ClusterRole the rule apiGroups: [resource.k8s.io], "
    "resources: [resourceslices, resourceclaims], verbs: [list])",
}


def _items(answer: Any, what: str, host: str) -> list[Any]:
    """A list call's items, or why the broker cannot read the cluster. A cluster that
    serves no ``resource.k8s.io/v1`` (Kubernetes before 1.34) has no DRA to read."""
    from aiohttp import ClientError
    from kubernetes_asyncio.client import ApiException

    if isinstance(answer, ApiException):
        dra = what in LISTED[2:]
        if dra and answer.status == 404:
            return []
        listed = "nodes and pods" if not dra else what
        hint = (
            RBAC_HINTS["resourceslices" if dra else "nodes"]
            if answer.status in (401, 403)
            else "the broker keeps its queue and its last view until it answers"
        )
        raise EngineUnavailable(
            f"the Kubernetes API server refused to list {listed} ({answer.status} "
            f"{answer.reason}): {hint}"
        )
    if isinstance(answer, (ClientError, OSError, asyncio.TimeoutError)):
        raise EngineUnavailable(
            f"the Kubernetes API server at {host} does not answer "
            f"({answer or type(answer).__name__}): the broker keeps its queue and its last view"
        )
    if isinstance(answer, BaseException):
        raise answer
    return list(answer.items)
