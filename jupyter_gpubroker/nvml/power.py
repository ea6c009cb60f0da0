"""A GPU's power management limit through NVML: what it may be set to, what it is, and
setting it. Lowering the limit of an idle GPU in a demand trough saves what it would draw
above it; only root may set it (NVML answers NoPermission to anyone else), and only
within the board's constraints, so each refusal comes back as a sentence."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pynvml


@dataclass(frozen=True)
class PowerLimits:
    """A GPU's power limits in milliwatts, as NVML gives them."""

    min_mw: int
    max_mw: int
    default_mw: int
    current_mw: int


class PowerLimitRefused(Exception):
    """NVML would not set a power limit; the message says why in a sentence."""


def power_limits(handle: Any) -> PowerLimits:
    """The limits of the GPU of ``handle`` (a whole GPU's: a MIG device has none)."""
    low, high = pynvml.nvmlDeviceGetPowerManagementLimitConstraints(handle)
    return PowerLimits(
        int(low),
        int(high),
        int(pynvml.nvmlDeviceGetPowerManagementDefaultLimit(handle)),
        int(pynvml.nvmlDeviceGetPowerManagementLimit(handle)),
    )


def set_power_limit(handle: Any, uuid: str, mw: int) -> None:
    """Set the GPU's power limit to ``mw`` milliwatts, or say why NVML refused."""
    try:
        pynvml.nvmlDeviceSetPowerManagementLimit(handle, mw)
    except pynvml.NVMLError_NoPermission:
        raise PowerLimitRefused(
            f"only root may change the power limit of GPU {uuid}, and this broker is not root"
        ) from None
    except pynvml.NVMLError_InvalidArgument:
        raise PowerLimitRefused(
            f"GPU {uuid} takes no power limit of {mw / 1000:.0f} W: it is outside its range"
        ) from None
    except pynvml.NVMLError_NotSupported:
        raise PowerLimitRefused(f"GPU {uuid} has no power limit to set") from None
