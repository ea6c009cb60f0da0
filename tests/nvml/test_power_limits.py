"""Power management limits on the simulated NVML, through the real pynvml wrappers and
``nvml.power``: the constraints and default a board reports, the draw capped by a lower
limit, and NVML's refusals (NoPermission to anyone but root, InvalidArgument outside the
constraints, none on a MIG device handle), said as sentences."""

from __future__ import annotations

from collections.abc import Callable

import pynvml
import pytest

from jupyter_gpubroker.nvml import SimulatedNvml, Topology
from jupyter_gpubroker.nvml.power import PowerLimitRefused, power_limits, set_power_limit
from jupyter_gpubroker.nvml.presets import gpu_spec
from jupyter_gpubroker.wire.profiles import CATALOG

H100_MW = CATALOG["H100-80GB"].power_limit_mw


def as_caller(privilege: str) -> Topology:
    """GPU 0: an H100 in seven 1g.10gb slices; GPU 1: an H100 with MIG off."""
    gpus = (gpu_spec("H100-80GB", {"1g.10gb": 7}), gpu_spec("H100-80GB"))
    return Topology("h100-mig-and-whole", gpus, privilege=privilege)


def test_root_lowers_an_idle_gpus_limit_and_its_draw_stays_under_it(
    simulate: Callable[[Topology], SimulatedNvml],
) -> None:
    sim = simulate(as_caller("root"))
    handle = pynvml.nvmlDeviceGetHandleByIndex(1)  # MIG off
    uuid = pynvml.nvmlDeviceGetUUID(handle)
    limits = power_limits(handle)
    assert (limits.max_mw, limits.default_mw, limits.current_mw) == (H100_MW,) * 3
    assert limits.min_mw == H100_MW * 2 // 7  # 200 W of an H100 SXM's 700 W
    sim.set_load(uuid, utilization=100)
    assert pynvml.nvmlDeviceGetPowerUsage(handle) == H100_MW
    set_power_limit(handle, uuid, limits.min_mw)
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) == limits.min_mw
    assert power_limits(handle).current_mw == limits.min_mw
    assert pynvml.nvmlDeviceGetPowerUsage(handle) == limits.min_mw  # held at the limit
    sim.set_load(uuid, utilization=0)
    assert pynvml.nvmlDeviceGetPowerUsage(handle) == H100_MW // 10  # idle draws the same
    set_power_limit(handle, uuid, limits.default_mw)
    assert power_limits(handle).current_mw == H100_MW


def test_nvml_refuses_a_limit_outside_its_range_and_on_a_mig_device(
    simulate: Callable[[Topology], SimulatedNvml],
) -> None:
    simulate(as_caller("root"))
    handle = pynvml.nvmlDeviceGetHandleByIndex(1)
    uuid = pynvml.nvmlDeviceGetUUID(handle)
    for mw in (H100_MW * 2 // 7 - 1, H100_MW + 1):
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceSetPowerManagementLimit(handle, mw)
    with pytest.raises(PowerLimitRefused, match="takes no power limit of 100 W"):
        set_power_limit(handle, uuid, 100_000)
    assert power_limits(handle).current_mw == H100_MW  # nothing changed
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(pynvml.nvmlDeviceGetHandleByIndex(0), 0)
    with pytest.raises(pynvml.NVMLError):
        pynvml.nvmlDeviceSetPowerManagementLimit(mig, H100_MW // 2)


@pytest.mark.parametrize("privilege", ["monitor", "none"])
def test_only_root_may_set_a_power_limit_as_nvml_says(
    simulate: Callable[[Topology], SimulatedNvml], privilege: str
) -> None:
    simulate(as_caller(privilege))
    handle = pynvml.nvmlDeviceGetHandleByIndex(1)
    uuid = pynvml.nvmlDeviceGetUUID(handle)
    assert power_limits(handle).current_mw == H100_MW  # reading needs nothing
    with pytest.raises(pynvml.NVMLError_NoPermission):
        pynvml.nvmlDeviceSetPowerManagementLimit(handle, H100_MW // 2)
    with pytest.raises(PowerLimitRefused, match="only root may change the power limit"):
        set_power_limit(handle, uuid, H100_MW // 2)
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) == H100_MW
