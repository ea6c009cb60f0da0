"""Choosing between the real driver and a simulated machine."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from jupyter_gpubroker.nvml import (
    PRESET_NAMES,
    SIMULATE_ENV,
    NvmlUnavailable,
    TopologyError,
    open_backend,
)


def test_the_environment_names_a_simulated_topology(monkeypatch):
    monkeypatch.setenv(SIMULATE_ENV, "h200-mig-balanced")
    with open_backend() as backend:
        assert backend.simulator is not None
        assert backend.simulator.topology.name == "h200-mig-balanced"
        assert len(backend.inventory().devices) == 8


def test_the_argument_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv(SIMULATE_ENV, "dgx-h100")
    with open_backend("workstation-a100:4") as backend:
        assert len(backend.inventory().gpus) == 4


def test_a_topology_file_can_be_simulated(tmp_path: Path):
    path = tmp_path / "box.yaml"
    path.write_text(
        "version: v1\n"
        "simulate: {gpu-model: A100-80GB, gpu-count: 1}\n"
        "mig-configs:\n"
        "  halves:\n"
        "    - {devices: all, mig-enabled: true, mig-devices: {3g.40gb: 2}}\n"
    )
    with open_backend(str(path)) as backend:
        assert [(d.profile, d.start) for d in backend.inventory().devices] == [
            ("3g.40gb", 0),
            ("3g.40gb", 4),
        ]


@pytest.mark.usefixtures("no_driver")
@pytest.mark.parametrize("simulate, env", [(None, None), ("", "dgx-h100")])
def test_without_a_driver_the_error_says_how_to_simulate(monkeypatch, simulate, env):
    if env is None:
        monkeypatch.delenv(SIMULATE_ENV, raising=False)
    else:
        monkeypatch.setenv(SIMULATE_ENV, env)  # an explicit "" still means the real driver
    with pytest.raises(NvmlUnavailable) as err:
        open_backend(simulate)
    message = str(err.value)
    assert "No NVIDIA driver was found" in message
    assert f"{SIMULATE_ENV}=dgx-h100-mig" in message
    assert "c.GPUBroker.simulate" in message
    assert all(name in message for name in PRESET_NAMES)
    assert isinstance(err.value.__cause__, pynvml.NVMLError_LibraryNotFound)


def test_an_unknown_topology_is_refused_before_anything_is_installed():
    with pytest.raises(TopologyError, match="unknown simulated topology 'dgx-b200'"):
        open_backend("dgx-b200")
