"""ResourceSlices for the test cluster's KWOK nodes, shaped as NVIDIA's DRA driver publishes
them, so that the real kube-scheduler allocates real ResourceClaims from them.

No DRA driver runs here (no kubelet, no GPU): this module writes what its kubelet plugin
would. The shapes are read from the driver's source at v0.4.0
(https://github.com/kubernetes-sigs/dra-driver-nvidia-gpu, formerly
NVIDIA/k8s-dra-driver-gpu), with static MIG (the default; ``DynamicMIG`` is an alpha gate,
off):

- one pool per node, named after the node, in one ResourceSlice owned by the Node, named
  ``<node>-gpu.nvidia.com-<random>`` (``cmd/gpu-kubelet-plugin/driver.go``
  ``publishResources``; the slice controller of ``k8s.io/dynamic-resource-allocation``);
- a GPU with MIG off is device ``gpu-<minor>`` (``deviceinfo.go`` ``CanonicalName``) with
  attributes ``type`` ``gpu``, ``uuid``, ``productName``, ``brand``, ``architecture``, the
  versions ``cudaComputeCapability``, ``driverVersion`` and ``cudaDriverVersion``, and
  ``resource.kubernetes.io/pciBusID`` and ``pcieRoot``; capacity ``memory`` in bytes
  (``GpuInfo.Attributes``, ``fullGpuCapacity``);
- a GPU with MIG on is not published itself: each MIG device on it is
  ``gpu-<minor>-mig-<profile without dots>-<GI profile id>-<placement start>``
  (``mig.go`` ``ToCanonicalName``) with ``type`` ``mig``, ``uuid``, ``parentUUID``,
  ``profile`` and its GPU's other attributes, and capacity ``multiprocessors``,
  ``copyEngines``, ``decoders``, ``encoders``, ``jpegEngines``, ``ofaEngines``, ``memory`` and
  one ``memorySlice<i>`` of 1 per memory slice it covers (``CommonAttributesMig``,
  ``CommonCapacitiesMig``, ``MigDeviceInfo.GetDevice``);
- the DeviceClasses ``gpu.nvidia.com`` and ``mig.nvidia.com`` of its Helm chart
  (``deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-{gpu,mig}.yaml``).

A shared GPU looks like any other to the driver: sharing (time-slicing, MPS) is a claim's
configuration (``GpuConfig.sharing``), not the slice's. ``dra-l40s``'s GPU is the one the
tests mean to lend in shares (a sharing rule naming ``SHARED_MODEL``).

Functions the fixtures and other test modules use (names kept stable):
``publish()``, ``withdraw()``, ``device_classes()``, ``node_manifest(node)``,
``resource_slice(node, node_uid)``, ``devices(node)``, ``gpu_uuid(node, minor)``,
``mig_uuid(node, minor, mig)``, ``device_name(node, minor, mig)``; the layout is ``NODES``.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from kube_cluster import get, kubectl, ready, until

from jupyter_gpubroker.wire.profiles import CATALOG, COMPUTE_SLICES, GpuModel, MigProfile

DRIVER = "gpu.nvidia.com"
STANDARD = "resource.kubernetes.io/"
"""The prefix of the attributes Kubernetes defines (``k8s.io/dynamic-resource-allocation``'s
``deviceattribute``)."""
DRIVER_VERSION = "580.95.5"
"""NVML's ``580.95.05`` as the driver writes a version: semver, leading zeros dropped."""
CUDA_DRIVER_VERSION = "13.0.0"


@dataclass(frozen=True)
class Chip:
    """What NVML says of a GPU model that the catalog does not hold."""

    architecture: str
    """go-nvlib's ``GetArchitectureAsString``."""
    compute_capability: str
    brand: str = "Nvidia"
    """go-nvlib's ``GetBrandAsString`` of ``NVML_BRAND_NVIDIA`` (data-center GPUs)."""


CHIPS = {
    "H100-80GB": Chip("Hopper", "9.0.0"),
    "A100-80GB": Chip("Ampere", "8.0.0"),
    "L40S-48GB": Chip("Ada Lovelace", "8.9.0"),
}
ENGINES = {"1g.10gb": (1, 0, 0, 0), "2g.20gb": (2, 1, 0, 0), "3g.40gb": (3, 2, 0, 0)}
"""A100-80GB MIG profiles: copy engines, decoders, JPEG and OFA engines (no encoders), as
``nvidia-smi mig -lgip`` lists them (NVIDIA's MIG user guide)."""


@dataclass(frozen=True)
class Mig:
    """A MIG device made on a GPU: its profile and first memory slice."""

    profile: str
    start: int


@dataclass(frozen=True)
class Card:
    """A GPU on a node: its catalog model, and its MIG devices when MIG is on."""

    model: str
    migs: tuple[Mig, ...] = ()


SHARED_MODEL = "L40S-48GB"
"""The model of the GPU the tests' broker lends in shares (``sharing_rules``)."""
NODES: dict[str, tuple[Card, ...]] = {
    "dra-h100": (Card("H100-80GB"), Card("H100-80GB")),
    "dra-a100-mig": (
        Card("A100-80GB", (Mig("3g.40gb", 0), Mig("2g.20gb", 4), Mig("1g.10gb", 6))),
        Card("A100-80GB", tuple(Mig("1g.10gb", s) for s in range(7))),
    ),
    "dra-l40s": (Card(SHARED_MODEL),),
}
"""Whole GPUs on one node, MIG devices of two GPUs on another, the shared GPU on a third."""


def _uuid(*parts: object) -> str:
    """A stable UUID for a device of the test cluster."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "gpubroker-test/" + "/".join(map(str, parts))))


def gpu_uuid(node: str, minor: int) -> str:
    return "GPU-" + _uuid(node, minor)


def mig_uuid(node: str, minor: int, mig: Mig) -> str:
    return "MIG-" + _uuid(node, minor, mig.profile, mig.start)


def _model(card: Card) -> GpuModel:
    return CATALOG[card.model]


def _profile(card: Card, mig: Mig) -> MigProfile:
    found = _model(card).profile(mig.profile)
    assert found is not None and mig.start in found.starts, (card, mig)
    return found


def device_name(node: str, minor: int, mig: Mig | None = None) -> str:
    """The driver's name of a GPU, or of a MIG device on it (``+me`` written ``-me``)."""
    if mig is None:
        return f"gpu-{minor}"
    profile_id = _profile(NODES[node][minor], mig).profile_id
    pname = mig.profile.replace(".", "").replace("+", "-")
    return f"gpu-{minor}-mig-{pname}-{profile_id}-{mig.start}"


def binary_si(n: int) -> str:
    """A count of bytes as a Quantity made with ``resource.BinarySI`` serializes."""
    for power, suffix in ((5, "Pi"), (4, "Ti"), (3, "Gi"), (2, "Mi"), (1, "Ki")):
        if n and n % 1024**power == 0:
            return f"{n // 1024**power}{suffix}"
    return str(n)


def _common(minor: int, card: Card) -> dict[str, Any]:
    chip = CHIPS[card.model]
    bus = f"0000:{0x0F + 0x10 * minor:02x}:00.0"
    return {
        "productName": {"string": _model(card).nvml_names[0]},
        "brand": {"string": chip.brand},
        "architecture": {"string": chip.architecture},
        "cudaComputeCapability": {"version": chip.compute_capability},
        "driverVersion": {"version": DRIVER_VERSION},
        "cudaDriverVersion": {"version": CUDA_DRIVER_VERSION},
        STANDARD + "pciBusID": {"string": bus},
        STANDARD + "pcieRoot": {"string": f"pci0000:{0x0F + 0x10 * minor - 1:02x}"},
    }


def _gpu_device(node: str, minor: int, card: Card) -> dict[str, Any]:
    attributes = {"type": {"string": "gpu"}, "uuid": {"string": gpu_uuid(node, minor)}}
    return {
        "name": device_name(node, minor),
        "attributes": attributes | _common(minor, card),
        "capacity": {"memory": {"value": binary_si(_model(card).memory_mib * 2**20)}},
    }


def _mig_device(node: str, minor: int, card: Card, mig: Mig) -> dict[str, Any]:
    profile = _profile(card, mig)
    copy, decoders, jpeg, ofa = ENGINES[mig.profile]
    attributes = {
        "type": {"string": "mig"},
        "uuid": {"string": mig_uuid(node, minor, mig)},
        "parentUUID": {"string": gpu_uuid(node, minor)},
        "profile": {"string": mig.profile},
    }
    counts = {
        "multiprocessors": profile.sm_count,
        "copyEngines": copy,
        "decoders": decoders,
        "encoders": 0,
        "jpegEngines": jpeg,
        "ofaEngines": ofa,
        "memory": profile.memory_mib * 2**20,
    } | {f"memorySlice{i}": 1 for i in profile.slots(mig.start)}
    return {
        "name": device_name(node, minor, mig),
        "attributes": attributes | _common(minor, card),
        "capacity": {k: {"value": binary_si(v)} for k, v in counts.items()},
    }


def devices(node: str) -> list[dict[str, Any]]:
    """The devices the driver publishes for ``node``: its GPUs with MIG off, the MIG
    devices of the others."""
    found = []
    for minor, card in enumerate(NODES[node]):
        if card.migs:
            assert sum(_profile(card, m).compute_slices for m in card.migs) <= COMPUTE_SLICES
            found += [_mig_device(node, minor, card, m) for m in card.migs]
        else:
            found.append(_gpu_device(node, minor, card))
    return found


def resource_slice(node: str, node_uid: str) -> dict[str, Any]:
    """The one ResourceSlice of ``node``'s pool, owned by its Node as the driver's are."""
    owner = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "generateName": f"{node}-{DRIVER}-",
            "ownerReferences": [owner | {"controller": True}],
        },
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices(node),
        },
    }


def device_classes() -> list[dict[str, Any]]:
    """The chart's DeviceClasses on ``resource.k8s.io/v1``. ``extendedResourceName`` is an
    alpha field (``DRAExtendedResource``): an API server without that gate drops it."""

    def device_class(name: str, kind: str) -> dict[str, Any]:
        expression = (
            f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{kind}'"
        )
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expression}}]},
        }

    gpu = device_class("gpu.nvidia.com", "gpu")
    gpu["spec"]["extendedResourceName"] = "nvidia.com/gpu"
    return [gpu, device_class("mig.nvidia.com", "mig")]


def node_manifest(node: str) -> dict[str, Any]:
    """A KWOK node with no GPU extended resource: its GPUs are in its ResourceSlice."""
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    labels = {"kubernetes.io/hostname": node, "type": "kwok", "nvidia.com/gpu.present": "true"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node,
            "labels": labels,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
        },
        "status": {"capacity": resources, "allocatable": resources},
    }


def _slices() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = get(
        "resourceslices", "--field-selector", f"spec.driver={DRIVER}"
    )["items"]
    return [s for s in found if s["spec"].get("nodeName") in NODES]


def publish() -> None:
    """The DeviceClasses, the DRA nodes afresh and their ResourceSlices; returns once KWOK
    made the nodes Ready and untainted."""
    for manifest in device_classes():
        kubectl("apply", "-f", "-", input=manifest)
    withdraw()
    uids = {}
    for node in NODES:
        made = json.loads(kubectl("create", "-o", "json", "-f", "-", input=node_manifest(node)))
        uids[node] = made["metadata"]["uid"]
    for node, uid in uids.items():
        kubectl("create", "-f", "-", input=resource_slice(node, uid))

    def schedulable() -> bool:
        nodes = {n["metadata"]["name"]: n for n in get("nodes")["items"]}
        return all(
            n in nodes and ready(nodes[n]) == "True" and not nodes[n]["spec"].get("taints")
            for n in NODES
        )

    until("the DRA nodes Ready and untainted", schedulable, timeout_s=90)


def withdraw() -> None:
    """No DRA node or slice of this module's left (the DeviceClasses stay, as the chart's
    do when no node has a GPU)."""
    kubectl("delete", "node", *NODES, "--ignore-not-found")
    for s in _slices():
        kubectl("delete", "resourceslice", s["metadata"]["name"], "--ignore-not-found")
