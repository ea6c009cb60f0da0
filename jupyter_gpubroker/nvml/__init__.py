"""Inventory backends over NVML: the real driver or a simulated one.

The broker asks :func:`open_backend` for an :class:`NvmlBackend`; whether it
reads a real driver or a simulated machine (a preset or a topology file, see
:mod:`.presets`) is decided here and nowhere else, so everything above runs
unchanged on both.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path

from .backend import SIMULATE_ENV, NvmlBackend, NvmlUnavailable, is_mig_device_handle
from .partitioner import MigPartitioner
from .presets import PRESET_NAMES, GpuSpec, Topology, TopologyError, load_topology
from .simulated import SimulatedNvml, install, uninstall

__all__ = [
    "PRESET_NAMES",
    "SIMULATE_ENV",
    "GpuSpec",
    "MigPartitioner",
    "NvmlBackend",
    "NvmlUnavailable",
    "SimulatedNvml",
    "Topology",
    "TopologyError",
    "install",
    "is_mig_device_handle",
    "load_topology",
    "open_backend",
    "seed_for",
    "uninstall",
]


def seed_for(state_file: str) -> str:
    """The seed of the simulated machine of the broker on ``state_file``: its own, and
    the same at every restart (none for a state kept in memory)."""
    return "" if state_file == ":memory:" else str(Path(state_file).expanduser().resolve())


def open_backend(
    simulate: str | Topology | None = None,
    log: logging.Logger | None = None,
    *,
    seed: str = "",
    privilege: str | None = None,
) -> NvmlBackend:
    """An opened backend. ``simulate`` (or, when it is None, ``$GPUBROKER_SIMULATE``)
    names a simulated topology: a preset, a topology file, either with ``:N`` GPUs (or is
    one: a state file's recorded machine, ``replay.whatif``).
    Empty means the real driver; :class:`NvmlUnavailable` says how to simulate
    when there is none. The simulator is ``backend.simulator``; ``seed`` makes its
    UUIDs those of one simulated machine of its own; ``privilege`` is the simulated
    caller's (default: see :data:`.simulated.PRIVILEGES`)."""
    spec = os.environ.get(SIMULATE_ENV, "") if simulate is None else simulate
    simulator = None
    if spec:
        topology = spec if isinstance(spec, Topology) else load_topology(spec)
        if seed:
            topology = replace(topology, seed=f"{topology.seed}@{seed}")
        simulator = SimulatedNvml(topology, privilege=privilege)
    return NvmlBackend(simulator, log=log).open()
