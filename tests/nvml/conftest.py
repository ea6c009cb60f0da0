"""Fixtures that put simulated NVML libraries under pynvml and always take them away."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pynvml
import pytest

from jupyter_gpubroker.nvml import (
    NvmlBackend,
    SimulatedNvml,
    Topology,
    install,
    load_topology,
)
from jupyter_gpubroker.nvml.presets import gpu_spec

Spec = str | Topology


def _topology(spec: Spec) -> Topology:
    return load_topology(spec) if isinstance(spec, str) else spec


@pytest.fixture(autouse=True)
def _pynvml_left_clean() -> Iterator[None]:
    assert pynvml.nvmlLib is None
    yield
    assert pynvml.nvmlLib is None, "a test left a simulated NVML installed"


@pytest.fixture
def empty_h100() -> Topology:
    """GPU 0: an H100 with MIG on and no instances; GPU 1: an H100 with MIG off."""
    return Topology("empty-h100", (gpu_spec("H100-80GB", {}), gpu_spec("H100-80GB")))


@pytest.fixture
def simulate() -> Iterator[Callable[[Spec], SimulatedNvml]]:
    """Install a simulated library for a topology and initialise pynvml on it."""
    installed: list[SimulatedNvml] = []

    def start(spec: Spec) -> SimulatedNvml:
        sim = install(_topology(spec))
        installed.append(sim)
        pynvml.nvmlInit()
        return sim

    yield start
    for sim in reversed(installed):
        sim.uninstall()


@pytest.fixture
def open_sim() -> Iterator[Callable[[Spec], NvmlBackend]]:
    """Open a backend over a simulated topology; closed after the test."""
    opened: list[NvmlBackend] = []

    def start(spec: Spec) -> NvmlBackend:
        backend = NvmlBackend(SimulatedNvml(_topology(spec))).open()
        opened.append(backend)
        return backend

    yield start
    for backend in reversed(opened):
        backend.close()
