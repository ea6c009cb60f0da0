"""Helpers of the replay tests: trace headers and hand-made traces."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from jupyter_gpubroker.replay.traces import Job, Trace

OPENB_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time"
)
PHILLY_HEADER = "timestamp,duration,num_gpus,gpu_time,cluster"


def trace_of(*jobs: Job) -> Trace:
    """A trace of hand-made jobs, sorted as a loader sorts them."""
    return Trace("hand-made", tuple(sorted(jobs, key=lambda j: j.submit_s)))


def benchmark(name: str) -> ModuleType:
    """``benchmarks/NAME.py`` imported as a module (the benchmarks are scripts)."""
    spec = importlib.util.spec_from_file_location(
        f"bench_{name}", Path(__file__).parents[2] / "benchmarks" / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module
