"""How a share of a GPU is held to its memory on this host, chosen per GPU and said.

Three levels, strongest first (NVIDIA's MPS documentation, release 615; see
``docs/sharing.md`` for the sources):

- ``driver``: from driver r615 (CUDA 13.4) the driver itself caps the GPU memory of a
  cgroup (cgroup v2; NVML ``nvmlDeviceSetMemoryLimits_v1``, root only, no MIG): an
  allocation past the hard limit fails with out-of-memory, whatever the process does.
  The broker puts each share's kernel in a cgroup of its own (``limits``).
- ``mps``: the MPS server holds each client to ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` and
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``; the broker runs one control daemon per shared
  GPU and user (``mps``), since one daemon serves one user's server at a time, and sets
  each client's limits in the kernel's environment. A process that leaves MPS (unsets
  its pipe directory before CUDA starts) escapes it, so the broker's watch checks MPS
  shares too (``broker.sharewatch``): a process NVML lists outside MPS, or memory over
  the share.
- ``watched``: nothing holds a share: the broker reads each share's memory from NVML's
  per-process use and treats going over like idleness (warning, grace, the action).

A GPU in exclusive-process or prohibited compute mode cannot be shared between users at
all (one process, or none, may use it): it is lent whole only (``none``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pynvml

MECHANISMS = ("driver", "mps", "watched")
"""What may hold a share, strongest first (``none``: the GPU is not shared)."""
DRIVER_FROM = 615
CUDA_FROM = 13040
"""Driver r615 and CUDA 13.4 (13040): the first to cap a cgroup's GPU memory."""
COMPUTE_MODES = {
    pynvml.NVML_COMPUTEMODE_DEFAULT: "default",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD: "exclusive-thread",
    pynvml.NVML_COMPUTEMODE_PROHIBITED: "prohibited",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: "exclusive-process",
}


@dataclass(frozen=True)
class HostFacts:
    """What this host offers, read once at the broker's start."""

    driver: str
    """The driver's version (``570.86.15``); empty where NVML could not say."""
    cuda: int
    """The CUDA version the driver supports, as NVML writes it (13040: 13.4)."""
    memory_limits: bool
    """Whether NVML exports ``nvmlDeviceSetMemoryLimits_v1``."""
    root: bool
    cgroup: str
    """The cgroup v2 directory kernels' share cgroups are made in (empty: none set)."""
    mps_control: str
    """The MPS control program (empty: none found)."""
    as_users: bool
    """Whether this broker may run a process as each share's user: it is root, or every
    kernel runs as the broker's own account."""

    @property
    def branch(self) -> int:
        head = self.driver.split(".")[0]
        return int(head) if head.isdigit() else 0


@dataclass(frozen=True)
class Enforcement:
    """What holds the shares of one GPU, and why not something stronger."""

    mechanism: str
    """``driver``, ``mps``, ``watched``, or ``none`` (the GPU is lent whole only)."""
    why: str

    @property
    def enforced(self) -> bool:
        return self.mechanism in ("driver", "mps")


def choose(
    host: HostFacts, label: str, compute_mode: int, strongest: str = "driver"
) -> Enforcement:
    """The strongest mechanism ``host`` offers for the GPU ``label`` (``GPU 2``) in
    ``compute_mode``, no stronger than ``strongest`` (the admin's cap)."""
    mode = COMPUTE_MODES.get(compute_mode, str(compute_mode))
    if mode != "default":
        return Enforcement(
            "none",
            f"{label} is in {mode} compute mode: one process at a time may use it, so it is "
            f"lent whole only (nvidia-smi -c DEFAULT makes it shareable)",
        )
    allowed = MECHANISMS[MECHANISMS.index(strongest) :]
    lacks = _driver_lacks(host)
    if "driver" in allowed and not lacks:
        return Enforcement(
            "driver", f"the driver ({host.driver}) holds each share of {label} to its memory"
        )
    lacks = lacks or "the admin chose a weaker mechanism"
    if "mps" in allowed and host.mps_control and host.as_users:
        return Enforcement(
            "mps", f"MPS holds each share of {label} to its memory; the driver does not: {lacks}"
        )
    if not host.mps_control:
        no_mps = "no nvidia-cuda-mps-control on this host"
    elif not host.as_users:
        no_mps = (
            "the broker runs as neither root nor the kernels' user, so it cannot run MPS for them"
        )
    else:
        no_mps = "the admin chose not to use MPS"
    return Enforcement(
        "watched",
        f"nothing holds a share of {label} to its memory ({lacks}; {no_mps}): the broker "
        "watches each share's memory and stops a kernel that stays over it",
    )


def _driver_lacks(host: HostFacts) -> str:
    """Why the driver cannot hold shares here ('' when it can)."""
    if host.branch < DRIVER_FROM or host.cuda < CUDA_FROM:
        driver = host.driver or "unknown"
        return f"the driver is {driver}, and r{DRIVER_FROM} with CUDA 13.4 is the first that can"
    if not host.memory_limits:
        return "its NVML sets no memory limits"
    if not host.root:
        return "setting them needs root"
    if not host.cgroup:
        return "no cgroup v2 directory is set aside for kernels (c.GPUBroker.share_cgroup)"
    return ""
