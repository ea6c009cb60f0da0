"""Trace replay: real cluster traces through the real broker core, on a virtual clock.

``traces`` reads the public traces (and a generic CSV format) into jobs,
``sizing`` turns a job's GPUs into a request on the chosen inventory,
``driver`` replays them through :class:`~jupyter_gpubroker.broker.core.Broker`,
``metrics`` computes the figures and ``report`` renders them. The CLI
(``jupyter gpubroker replay``) and ``benchmarks/replay.py`` both use it.
"""

from .driver import Replay, replay
from .metrics import STARVE_AFTER_S, summarize
from .traces import DEFAULT_USERS, FORMATS, Job, Trace, TraceError, load

DEFAULT_INVENTORY = {
    "openb": "dgx-h100-mig:64",
    "philly": "dgx-h100:768",
    "generic": "dgx-h100-mig:64",
}
"""Per format: 64 H100s in MIG mode for the GPU-sharing traces; for Philly's whole
GPUs, 96 DGX H100 (768 GPUs), where its queue forms in bursts (about 6% of the time)."""
DEFAULT_COMPRESS = {"openb": 3.0, "philly": 1.0, "generic": 1.0}
"""openb never queues on its own cluster, barely at 64 GPUs (x2 gives a mean wait
of 14 s): x3 makes its busiest weeks queue for hours under FCFS."""

__all__ = [
    "DEFAULT_COMPRESS",
    "DEFAULT_INVENTORY",
    "DEFAULT_USERS",
    "FORMATS",
    "STARVE_AFTER_S",
    "Job",
    "Replay",
    "Trace",
    "TraceError",
    "load",
    "replay",
    "summarize",
]
