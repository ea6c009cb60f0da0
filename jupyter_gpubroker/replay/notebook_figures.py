"""The figures of a notebook-session replay (:mod:`.notebooks`): GPU-hours held against
those used, how long GPU cells waited, and what reclaim cost the users."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .notebooks import NotebookReplay, SessionResult

NO_WAIT_S = 1.0
"""A GPU cell that waited less than this started without waiting (a modelled restore
of the trace's largest memory takes 0.6 s at the bound used)."""


SOON_S = 10.0
"""A GPU cell that waited less than this started about when its user asked (the issue's
10 s: a restore's fixed cost is about that long)."""


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank: a wait some cell really had); 0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(math.ceil(q / 100 * len(ordered)) - 1, 0)]


def summarize(result: NotebookReplay) -> dict[str, float]:
    """The figures of one policy on one cluster. GPU-hours held are set against those of
    the cells that ran: a cell that never ran used nothing (against all of the trace's,
    a busy cluster that leaves cells unrun would seem to hold less than its cells use)."""
    rs = result.sessions
    ran_s = sum(r.ran_gpu_s for r in rs)
    return {
        "held_ratio": sum(r.held_s for r in rs) / ran_s if ran_s else 0.0,
        "held_gpu_h": sum(r.held_s for r in rs) / 3600,
        "cell_gpu_h": ran_s / 3600,
        "trace_cell_gpu_h": result.cell_gpu_s / 3600,
        **wait_figures(rs),
        "shutdowns": sum(r.shutdowns for r in rs),
        "sessions_shut": sum(1 for r in rs if r.shutdowns),
        "lost": sum(r.lost for r in rs),
        "lost_gpus": sum(r.lost * r.gpus for r in rs),
        "suspends": sum(r.suspends for r in rs),
        "never_granted": sum(1 for r in rs if not r.granted),
        "cells_never_ran": sum(r.never_ran for r in rs),
        "peak_gpus": result.peak_held,
    }


def wait_figures(rs: list[SessionResult]) -> dict[str, float]:
    """How long the GPU cells waited: the shares that did not wait (a cell that never ran
    waited too) or started soon, and the median and 95th percentile wait."""
    waits = [w for r in rs for w in r.waits_s]
    cells = len(waits) + sum(r.never_ran for r in rs)
    return {
        "no_wait_pct": 100 * sum(w < NO_WAIT_S for w in waits) / cells if cells else 100.0,
        "within_10s_pct": (100 * sum(w < SOON_S for w in waits) / len(waits) if waits else 100.0),
        "wait_p50_s": percentile(waits, 50),
        "wait_p95_s": percentile(waits, 95),
    }
