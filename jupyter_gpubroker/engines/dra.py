"""Names shared by the Kubernetes inventory and spawner when the cluster allocates GPUs
through Dynamic Resource Allocation (``resource.k8s.io/v1``, GA in Kubernetes 1.34).

NVIDIA's DRA driver (``gpu.nvidia.com``) publishes each node's GPUs and MIG devices in
ResourceSlices, one pool per node, each device with a ``uuid`` attribute (the GPU's
``GPU-…`` or the MIG device's ``MIG-…``). Unlike the device plugin's counts, that names the
very device: the broker calls it ``dra:<node>:<gpu|mig>:<uuid>``, and a grant's claim pins
it with a CEL selector on that attribute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DRIVER = "gpu.nvidia.com"
"""The driver of NVIDIA's GPUs and MIG devices, and the domain of their attributes."""
DEVICE_CLASSES = {"gpu": "gpu.nvidia.com", "mig": "mig.nvidia.com"}
"""The DeviceClass a claim names for each kind of device, as NVIDIA's driver installs them."""
UUID_PREFIX = "dra"

Kind = Literal["gpu", "mig"]


@dataclass(frozen=True)
class DraDevice:
    """A device the broker named from a ResourceSlice."""

    node: str
    kind: Kind
    uuid: str
    """The device's ``uuid`` attribute."""

    @property
    def device_class(self) -> str:
        return DEVICE_CLASSES[self.kind]

    @property
    def selector(self) -> str:
        """The CEL expression that matches this device alone."""
        return f'device.attributes["{DRIVER}"].uuid == "{self.uuid}"'

    def __str__(self) -> str:
        return f"{UUID_PREFIX}:{self.node}:{self.kind}:{self.uuid}"


def parse_dra_uuid(name: str) -> DraDevice:
    """The device a ``dra:<node>:<kind>:<uuid>`` name stands for; ``ValueError`` for a name
    this module did not make."""
    parts = name.split(":", 3)
    if len(parts) != 4 or parts[0] != UUID_PREFIX or parts[2] not in DEVICE_CLASSES:
        raise ValueError(f"{name!r} is not a DRA device of the broker (dra:NODE:gpu|mig:UUID)")
    if not parts[1] or not parts[3] or '"' in parts[3] or "\\" in parts[3]:
        raise ValueError(f"{name!r} names no node or no device")
    kind: Kind = "gpu" if parts[2] == "gpu" else "mig"
    return DraDevice(parts[1], kind, parts[3])
