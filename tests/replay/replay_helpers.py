"""Helpers of the replay tests: trace headers and hand-made traces."""

from __future__ import annotations

from jupyter_gpubroker.replay.traces import Job, Trace

OPENB_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time"
)
PHILLY_HEADER = "timestamp,duration,num_gpus,gpu_time,cluster"


def trace_of(*jobs: Job) -> Trace:
    """A trace of hand-made jobs, sorted as a loader sorts them."""
    return Trace("hand-made", tuple(sorted(jobs, key=lambda j: j.submit_s)))
