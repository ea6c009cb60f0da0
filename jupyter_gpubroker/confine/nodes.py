"""Which NVIDIA device nodes a grant needs, as the driver numbers them.

A process reaches a GPU through character devices: ``/dev/nvidiactl`` (195:255) and
``/dev/nvidia-uvm`` for every CUDA program, ``/dev/nvidia<N>`` (195:N, N the GPU's minor
number) for the GPU, and for a MIG slice also the ``/dev/nvidia-caps/nvidia-cap<M>`` nodes
of its GPU instance and compute instance, whose minors the driver lists in
``/proc/driver/nvidia-caps/mig-minors`` (``gpu0/gi1/access 12``, ``gpu0/gi1/ci0/access 13``;
NVIDIA's MIG user guide, "Device Nodes and Capabilities"). The majors of ``nvidia-uvm`` and
``nvidia-caps`` are dynamic: ``/proc/devices`` names them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NVIDIA_MAJOR = 195
"""The GPUs' and nvidiactl's major, fixed by the driver (``nvidia-frontend`` or ``nvidia``
in /proc/devices)."""
CTL_MINOR = 255
UVM_MINOR = 0
"""``/dev/nvidia-uvm``; minor 1 is ``nvidia-uvm-tools`` (profilers), never granted."""


class ConfinementError(RuntimeError):
    """A grant's device nodes cannot be worked out, or a cgroup cannot be set."""


@dataclass(frozen=True, order=True)
class Node:
    """One character device a confined process may open."""

    major: int
    minor: int

    @property
    def rule(self) -> str:
        """The node in the cgroup devices controller's syntax (read, write, mknod)."""
        return f"c {self.major}:{self.minor} rwm"


@dataclass(frozen=True)
class Address:
    """Where a granted device sits among the driver's nodes: its GPU's minor number and,
    for a MIG slice, its GPU instance and compute instance ids."""

    gpu_minor: int
    gpu_instance: int | None = None
    compute_instance: int | None = None


@dataclass(frozen=True)
class DriverNodes:
    """The driver's numbering on one machine: the NVIDIA majors and the MIG cap minors."""

    majors: dict[str, int]
    """Every character major whose /proc/devices name starts with ``nvidia``."""
    mig_minors: dict[str, int]

    @classmethod
    def parse(cls, proc_devices: str, mig_minors: str = "") -> DriverNodes:
        """From the text of ``/proc/devices`` and of ``mig-minors`` (empty: no MIG)."""
        majors: dict[str, int] = {}
        chars = proc_devices.split("Block devices:")[0]
        for line in chars.splitlines():
            number, _, name = line.strip().partition(" ")
            if name.startswith("nvidia") and number.isdigit():
                majors[name] = int(number)
        minors: dict[str, int] = {}
        for n, line in enumerate(mig_minors.splitlines(), 1):
            if not line.strip():
                continue
            name, _, minor = line.strip().rpartition(" ")
            if not name or not minor.isdigit():
                raise ConfinementError(f"mig-minors line {n} is not '<capability> <minor>'")
            minors[name] = int(minor)
        return cls(majors, minors)

    @property
    def nvidia_majors(self) -> frozenset[int]:
        """The majors no confined process may open beyond its grant (195 always)."""
        return frozenset({NVIDIA_MAJOR, *self.majors.values()})

    def always(self) -> set[Node]:
        """What every CUDA program opens: nvidiactl, and nvidia-uvm where it is loaded."""
        nodes = {Node(NVIDIA_MAJOR, CTL_MINOR)}
        if "nvidia-uvm" in self.majors:
            nodes.add(Node(self.majors["nvidia-uvm"], UVM_MINOR))
        return nodes

    def nodes(self, address: Address) -> set[Node]:
        """The nodes of one granted device (without those of :meth:`always`)."""
        nodes = {Node(NVIDIA_MAJOR, address.gpu_minor)}
        if address.gpu_instance is None:
            return nodes
        caps = self.majors.get("nvidia-caps")
        gi = f"gpu{address.gpu_minor}/gi{address.gpu_instance}"
        names = [f"{gi}/access", f"{gi}/ci{address.compute_instance}/access"]
        if caps is None or any(name not in self.mig_minors for name in names):
            raise ConfinementError(
                f"the driver lists no nvidia-caps nodes for MIG device {gi}/"
                f"ci{address.compute_instance} (/proc/devices, mig-minors)"
            )
        return nodes | {Node(caps, self.mig_minors[name]) for name in names}


def nvml_address(handle: Any) -> Address:
    """The address of a GPU or MIG device from its NVML handle."""
    import pynvml

    if not pynvml.nvmlDeviceIsMigDeviceHandle(handle):
        return Address(pynvml.nvmlDeviceGetMinorNumber(handle))
    parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
    return Address(
        pynvml.nvmlDeviceGetMinorNumber(parent),
        pynvml.nvmlDeviceGetGpuInstanceId(handle),
        pynvml.nvmlDeviceGetComputeInstanceId(handle),
    )
