"""Kubernetes with Dynamic Resource Allocation: the GPUs and MIG devices NVIDIA's DRA driver
publishes in ResourceSlices, and which of them allocated ResourceClaims hold.

The driver (``gpu.nvidia.com``) publishes one pool per node. A GPU with MIG off is a
device of type ``gpu``; a GPU with MIG on is not published itself, only its MIG devices
(type ``mig``, with ``profile``, ``parentUUID`` and one ``memorySlice<i>`` capacity per
memory slice they cover). Each device has its ``uuid`` and ``memory`` (bytes). So the
broker knows the very device: it names each ``dra:<node>:<gpu|mig>:<uuid>``
(:mod:`.dra`), groups MIG devices under their GPU by ``parentUUID``, and reads what a
claim holds from its allocation's (driver, pool, device). Only each pool's newest
generation counts, as the API's reference says of ResourceSlices.

A claim reserved for (or owned by) a pod of the broker's with a lease is that lease's
grant; any other allocated claim on these devices is work outside the broker.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from ..broker.models import Device, Gpu
from ..wire.profiles import COMPUTE_SLICES, model_for_name
from .dra import DRIVER, DraDevice, Kind

SOURCE = f"DRA (ResourceSlices of {DRIVER})"
"""The source's name in the broker's log and on the admin page."""

_SUFFIXES: dict[str, int | Decimal] = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "m": Decimal("0.001"),
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([KMGTPE]i|[kMGTPEm])?$")
_MEMORY_SLICE = re.compile(r"^memorySlice(\d+)$")


def quantity(text: str | None) -> int:
    """A Kubernetes quantity (``80Gi``, ``42``, ``1e3``) as a whole number; 0 for anything
    that is not one."""
    found = _QUANTITY.match(str(text or "").strip())
    if not found:
        return 0
    try:
        return int(Decimal(found[1]) * _SUFFIXES.get(found[2] or "", 1))
    except InvalidOperation:
        return 0


def _attribute(device: Any, name: str) -> str:
    value = (device.attributes or {}).get(name)
    if value is None:
        return ""
    return str(value.string or value.version or "")


def _capacity(device: Any) -> dict[str, int]:
    return {k: quantity(c.value) for k, c in (device.capacity or {}).items()}


def current_slices(slices: Iterable[Any], nodes: Iterable[str]) -> list[Any]:
    """The driver's slices of ``nodes``, each pool's newest generation only."""
    wanted = set(nodes)
    mine = [
        s
        for s in slices
        if s.spec.driver == DRIVER and s.spec.node_name in wanted and s.spec.pool is not None
    ]
    newest: dict[str, int] = {}
    for s in mine:
        newest[s.spec.pool.name] = max(newest.get(s.spec.pool.name, 0), s.spec.pool.generation)
    return [s for s in mine if s.spec.pool.generation == newest[s.spec.pool.name]]


@dataclass
class DraInventory:
    """What the ResourceSlices say: each DRA node's GPUs and devices, and which broker
    device each (pool, device name) is."""

    gpus: list[Gpu] = field(default_factory=list)
    devices: list[Device] = field(default_factory=list)
    names: dict[tuple[str, str], Device] = field(default_factory=dict)
    nodes: set[str] = field(default_factory=set)


@dataclass
class _Published:
    """One device of a slice."""

    pool: str
    name: str
    kind: Kind
    uuid: str
    parent: str
    attributes: Any
    capacity: dict[str, int]


def _published(s: Any) -> list[_Published]:
    found = []
    for d in s.spec.devices or []:
        kind: Kind = "mig" if _attribute(d, "type") == "mig" else "gpu"
        uuid = _attribute(d, "uuid")
        if _attribute(d, "type") not in ("gpu", "mig") or not uuid:
            continue  # vfio passthrough devices, or nothing to name
        parent = _attribute(d, "parentUUID") if kind == "mig" else uuid
        found.append(
            _Published(s.spec.pool.name, d.name, kind, uuid, parent or uuid, d, _capacity(d))
        )
    return found


def dra_inventory(slices: Iterable[Any], nodes: Iterable[str]) -> DraInventory:
    """The GPUs and grantable devices the driver publishes on ``nodes`` (the nodes the
    broker hands out), in each node's GPUs' order."""
    seen = DraInventory()
    by_node: dict[str, list[_Published]] = {}
    for s in current_slices(slices, nodes):
        by_node.setdefault(s.spec.node_name, []).extend(_published(s))
    for node in sorted(by_node):
        seen.nodes.add(node)
        by_gpu: dict[str, list[_Published]] = {}
        for p in sorted(by_node[node], key=lambda p: _order(p.name)):
            by_gpu.setdefault(p.parent, []).append(p)
        for index, (parent, parts) in enumerate(by_gpu.items()):
            gpu = _gpu(node, index, parent, parts)
            seen.gpus.append(gpu)
            for p in parts:
                device = _device(gpu, p)
                seen.devices.append(device)
                seen.names[(p.pool, p.name)] = device
    return seen


def _order(name: str) -> tuple[int, str]:
    """The driver's names start ``gpu-<minor>``: its GPUs in their minors' order."""
    found = re.match(r"gpu-(\d+)", name)
    return (int(found[1]) if found else 1 << 30, name)


def _gpu(node: str, index: int, parent: str, parts: list[_Published]) -> Gpu:
    first = parts[0].attributes
    product = _attribute(first, "productName") or "NVIDIA GPU"
    model = model_for_name(product)
    mig = parts[0].kind == "mig"
    if not mig:
        memory = parts[0].capacity.get("memory", 0) // 2**20
    else:
        memory = (
            model.memory_mib if model else sum(p.capacity.get("memory", 0) for p in parts) // 2**20
        )
    return Gpu(
        index,
        str(DraDevice(node, "gpu", parent)),
        product,
        memory,
        mig,
        model.key if model else None,
        pci_bus_id=_attribute(first, "resource.kubernetes.io/pciBusID"),
        node=node,
    )


def _device(gpu: Gpu, p: _Published) -> Device:
    uuid = str(DraDevice(gpu.node, p.kind, p.uuid))
    memory = p.capacity.get("memory", 0) // 2**20
    if p.kind == "gpu":
        return Device(uuid, "gpu", gpu.index, gpu.uuid, memory, node=gpu.node)
    profile = _attribute(p.attributes, "profile")
    slices = [int(m[1]) for k in p.capacity if (m := _MEMORY_SLICE.match(k))]
    compute = re.match(r"(\d+)g\.", profile)
    return Device(
        uuid,
        "mig",
        gpu.index,
        gpu.uuid,
        memory,
        compute_slices=min(int(compute[1]), COMPUTE_SLICES) if compute else 1,
        profile=profile,
        start=min(slices, default=0),
        node=gpu.node,
    )


ClaimsUse = tuple[dict[str, str], dict[str, frozenset[str]]]
"""Device UUID -> the claim outside the broker that holds it; lease id -> the devices the
claims of its pods hold."""


def claims_use(
    claims: Iterable[Any],
    names: Mapping[tuple[str, str], Device],
    leases: Mapping[str, str | None],
) -> ClaimsUse:
    """Which of the published devices allocated ``claims`` hold. ``leases``: each pod not
    ended, by UID -> the broker's lease it carries out (``""`` for a pod of the broker's
    without one, ``None`` for a pod not the broker's)."""
    outside: dict[str, str] = {}
    mine: dict[str, set[str]] = {}
    for claim in claims:
        held = _allocated(claim, names)
        if not held:
            continue
        ours = {lease for uid in _consumers(claim) if (lease := leases.get(uid)) is not None}
        if ours:
            for lease in ours - {""}:
                mine.setdefault(lease, set()).update(held)
            continue  # the broker's: its lease's, or a pod of its own not yet leased
        who = f"ResourceClaim {claim.metadata.namespace}/{claim.metadata.name}"
        for uuid in held:
            outside[uuid] = who
    return outside, {lease: frozenset(d) for lease, d in mine.items()}


def _allocated(claim: Any, names: Mapping[tuple[str, str], Device]) -> list[str]:
    """The broker devices ``claim`` was allocated."""
    allocation = claim.status.allocation if claim.status else None
    results = (allocation.devices.results if allocation and allocation.devices else None) or []
    return [
        names[(r.pool, r.device)].uuid
        for r in results
        if r.driver == DRIVER and (r.pool, r.device) in names
    ]


def _consumers(claim: Any) -> set[str]:
    """The UIDs of the pods a claim is reserved for, or that own it (a claim made from a
    pod's ResourceClaimTemplate)."""
    reserved = (claim.status.reserved_for if claim.status else None) or []
    owners = claim.metadata.owner_references or []
    return {r.uid for r in reserved if r.resource == "pods"} | {
        o.uid for o in owners if o.kind == "Pod"
    }
