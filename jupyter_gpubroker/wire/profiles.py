"""The MIG profile catalog: which slices each GPU model can be cut into, and where.

Pure data, checked against NVIDIA's MIG user guide (see REFERENCE.md). Profile memory
is what ``nvidia-smi mig -lgip`` shows on real A100 and H100 GPUs (GiB to two decimals:
an H100's 3g.40gb shows 39.50, 40448 MiB); NVIDIA publishes only round numbers for the
H200 (18, 35, 71, 141 GB) and no capture was found, so its values are estimates. A GPU
has 8 memory slices and 7 compute slices; every GPU-instance profile occupies
``size`` consecutive memory slices starting at one of its allowed ``starts``,
and instances may not overlap. Both the simulated NVML library and the
broker's placement use this one table, so they cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

MEMORY_SLICES = 8
COMPUTE_SLICES = 7


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile of one GPU model, e.g. ``1g.10gb`` on an H100-80GB."""

    name: str
    compute_slices: int
    size: int
    """Memory slices occupied (of 8)."""
    starts: tuple[int, ...]
    """Memory-slice indexes an instance may start at."""
    memory_mib: int
    max_count: int
    nvml_profile: int
    """The ``NVML_GPU_INSTANCE_PROFILE_*`` constant that selects it."""
    profile_id: int
    """The id NVML returns in ``nvmlGpuInstanceProfileInfo_t.id``."""
    sm_count: int

    @property
    def gpu_equivalents(self) -> float:
        """Share of one whole GPU, for quotas and accounting (compute slices / 7)."""
        return self.compute_slices / COMPUTE_SLICES

    def slots(self, start: int) -> range:
        """The memory slices an instance starting at ``start`` covers."""
        return range(start, start + self.size)


@dataclass(frozen=True)
class GpuModel:
    """A GPU model the catalog knows: its NVML names and its MIG profiles."""

    key: str
    nvml_names: tuple[str, ...]
    memory_mib: int
    power_limit_mw: int
    pci_device_id: int
    sm_count: int
    profiles: tuple[MigProfile, ...]

    def profile(self, name: str) -> MigProfile | None:
        return self._by_name.get(name)

    @cached_property
    def _by_name(self) -> dict[str, MigProfile]:
        """The profiles by name: placement asks for one in each MIG plan of each GPU."""
        return {p.name: p for p in self.profiles}


# (suffix, compute slices, memory slices, starts, max count, NVML constant, NVML id)
_SHAPES = (
    ("1g", 1, 1, (0, 1, 2, 3, 4, 5, 6), 7, 0, 19),
    ("1g+me", 1, 1, (0, 1, 2, 3, 4, 5, 6), 1, 7, 20),
    ("1g-2x", 1, 2, (0, 2, 4, 6), 4, 9, 15),
    ("2g", 2, 2, (0, 2, 4), 3, 1, 14),
    ("3g", 3, 4, (0, 4), 2, 2, 9),
    ("4g", 4, 4, (0,), 1, 3, 5),
    ("7g", 7, 8, (0,), 1, 4, 0),
)


def _model(
    key: str,
    nvml_names: tuple[str, ...],
    memory_mib: int,
    power_limit_mw: int,
    pci_device_id: int,
    names: tuple[str, ...],
    mib: tuple[int, ...],
    sms: tuple[int, ...],
) -> GpuModel:
    profiles = tuple(
        MigProfile(
            name=name,
            compute_slices=c,
            size=size,
            starts=starts,
            memory_mib=m,
            max_count=count,
            nvml_profile=const,
            profile_id=pid,
            sm_count=sm,
        )
        for (_, c, size, starts, count, const, pid), name, m, sm in zip(
            _SHAPES, names, mib, sms, strict=True
        )
    )
    return GpuModel(key, nvml_names, memory_mib, power_limit_mw, pci_device_id, sms[-1], profiles)


def _without_mig(
    key: str, name: str, memory_mib: int, power_limit_mw: int, pci_device_id: int, sms: int
) -> GpuModel:
    """A GPU model without MIG (most lab GPUs): handed out whole, or shared by memory."""
    return GpuModel(key, (name,), memory_mib, power_limit_mw, pci_device_id, sms, ())


CATALOG: dict[str, GpuModel] = {
    m.key: m
    for m in (
        _model(
            "A100-40GB",
            ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"),
            40960,
            400_000,
            0x20B010DE,
            ("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
            (4864, 4864, 9856, 9856, 19968, 19968, 40192),
            (14, 14, 14, 28, 42, 56, 98),
        ),
        _model(
            "A100-80GB",
            ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"),
            81920,
            400_000,
            0x20B210DE,
            ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
            (9728, 9728, 19968, 19968, 40192, 40192, 80896),
            (14, 14, 14, 28, 42, 56, 98),
        ),
        _model(
            "H100-80GB",
            ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"),
            81559,
            700_000,
            0x233010DE,
            ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
            (9984, 9984, 20096, 20096, 40448, 40448, 81152),
            (16, 16, 26, 32, 60, 64, 132),
        ),
        _model(
            "H200-141GB",
            ("NVIDIA H200", "NVIDIA H200 NVL"),
            143771,
            700_000,
            0x233510DE,
            ("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
            (17920, 17920, 35584, 35584, 71424, 71424, 143104),
            (16, 16, 26, 32, 60, 64, 132),
        ),
        # Without MIG: memory as nvidia-smi reports it, power limit and PCI id as shipped
        _without_mig("L40S-48GB", "NVIDIA L40S", 46068, 350_000, 0x26B910DE, 142),
        _without_mig("RTXA6000-48GB", "NVIDIA RTX A6000", 49140, 300_000, 0x223010DE, 84),
        _without_mig("RTX4090-24GB", "NVIDIA GeForce RTX 4090", 24564, 450_000, 0x268410DE, 128),
    )
}

ALL_PROFILE_NAMES: frozenset[str] = frozenset(p.name for m in CATALOG.values() for p in m.profiles)


def model_for_name(nvml_name: str) -> GpuModel | None:
    """The catalog entry for a device name as NVML reports it, if known."""
    for model in CATALOG.values():
        if nvml_name in model.nvml_names:
            return model
    return None


def profile_memory_gb(name: str) -> float:
    """The nominal memory in GB a profile name announces (``3g.40gb`` -> 40)."""
    return float(name.split(".", 1)[1].split("+", 1)[0].removesuffix("gb"))


def free_starts(profile: MigProfile, occupied: set[int]) -> list[int]:
    """Starts at which ``profile`` fits on a GPU whose ``occupied`` memory slices are taken."""
    return [s for s in profile.starts if occupied.isdisjoint(profile.slots(s))]
