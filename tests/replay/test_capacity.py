"""Capacity policies in the replay (``replay.capacity``): the GPU-hours each keeps up and
the waits it costs, on a small periodic trace made here: 16 one-GPU jobs at 09:00 each
day, two hours long, for eight days."""

from __future__ import annotations

import bisect
from pathlib import Path

import pytest
from replay_helpers import benchmark, trace_of

from jupyter_gpubroker.nvml import open_backend
from jupyter_gpubroker.replay import replay
from jupyter_gpubroker.replay.capacity import (
    START_DELAY_S,
    Capacity,
    ForecastAhead,
    Reactive,
    peak_demand,
)
from jupyter_gpubroker.replay.driver import Replay
from jupyter_gpubroker.replay.sizing import Sizer
from jupyter_gpubroker.replay.traces import Job, Trace

DAY, HOUR = 86400.0, 3600.0
DAYS = 8
INVENTORY = "dgx-h100:16"
"""Two nodes of 8 GPUs: the trace's peak."""
DATA = Path(__file__).parent / "data"


def daily_bursts(days: int = DAYS) -> Trace:
    return trace_of(
        *(Job(d * DAY + 9 * HOUR, 2 * HOUR, 1, f"u{k % 4}") for d in range(days) for k in range(16))
    )


def run(cap: Capacity, trace: Trace | None = None) -> tuple[Replay, Trace]:
    trace = trace or daily_bursts()
    return replay(trace, inventory=INVENTORY, capacity=cap), trace


def window(trace: Trace) -> tuple[float, float]:
    return trace.jobs[0].submit_s, trace.jobs[-1].submit_s + 3 * HOUR


def mean_wait(result: Replay) -> float:
    return sum(o.wait_s for o in result.outcomes) / len(result.outcomes)


def kept_gpus(cap: Capacity, t: float) -> int:
    """GPUs kept up at ``t`` from the policy's steps."""
    k = bisect.bisect_right([since for since, _ in cap.steps], t) - 1
    return cap.steps[k][1] * cap.node_gpus if k >= 0 else 0


def test_the_peak_counts_an_end_and_a_start_at_one_instant_once() -> None:
    trace = trace_of(Job(0, 10, 2, "ann"), Job(10, 10, 2, "bob"), Job(15, 10, 1, "cy"))
    with open_backend("dgx-h100:8") as backend:
        assert peak_demand(trace, Sizer(backend.inventory())) == 3
        assert peak_demand(daily_bursts(), Sizer(backend.inventory())) == 16


def test_static_peak_keeps_the_peak_up_all_along_and_nobody_waits() -> None:
    cap = Capacity(2)
    result, trace = run(cap)
    start, end = window(trace)
    assert cap.gpu_hours(start, end) == pytest.approx(16 * (end - start) / HOUR)
    assert max(o.wait_s for o in result.outcomes) == 0


def test_reactive_waits_the_start_delay_for_each_burst_and_keeps_fewer_gpu_hours() -> None:
    cap = Reactive(2)
    result, trace = run(cap)
    assert len(result.outcomes) == 16 * DAYS
    assert min(o.wait_s for o in result.outcomes) >= START_DELAY_S  # every day: nodes off
    start, end = window(trace)
    assert cap.gpu_hours(start, end) < 0.2 * Capacity(2).nodes * 8 * (end - start) / HOUR
    # each day: up from 09:00 (asked) to ten minutes after the jobs end at 11:05
    days = DAYS - 1  # the last day's nodes are still up when the replay ends
    assert cap.gpu_hours(start, start + days * DAY) == pytest.approx(days * 16 * (2 + 15 / 60))


def test_forecast_ahead_on_a_periodic_trace_keeps_fewer_gpu_hours_and_waits_less() -> None:
    static, reactive, ahead = Capacity(2), Reactive(2), ForecastAhead(2)
    waits = {}
    for cap in (static, reactive, ahead):
        result, trace = run(cap)
        waits[cap.name] = mean_wait(result)
    start, end = window(trace)
    assert ahead.gpu_hours(start, end) < 0.3 * static.gpu_hours(start, end)
    assert waits["forecast-ahead"] * 2 < waits["reactive"]
    # a day of history is needed: the first two bursts wait, the later six do not
    assert waits["forecast-ahead"] == pytest.approx(waits["reactive"] * 2 / DAYS)
    error = ahead.error(start + 2 * DAY, end)
    assert error["hours"] > 0 and error["p90_covered"] == 1.0 and error["p50_error"] < 0.05


@pytest.mark.parametrize("kind", [Reactive, ForecastAhead])
def test_no_policy_keeps_fewer_gpus_up_than_are_held(kind: type[Reactive]) -> None:
    long_job = Job(3 * DAY + 10 * HOUR, 30 * HOUR, 8, "long")  # held through the troughs
    trace = trace_of(*daily_bursts(5).jobs, long_job)
    cap = kind(3)
    result = replay(trace, inventory="dgx-h100:24", capacity=cap)
    t = result.timeline
    assert all(t.allocated[i] <= kept_gpus(cap, at) for i, at in enumerate(t.at))
    assert all(o.end_s - o.start_s == 30 * HOUR for o in result.outcomes if o.user == "long")


def test_a_machine_that_is_not_the_policys_nodes_is_refused() -> None:
    with pytest.raises(ValueError, match="the machine has 16 GPUs, not 3 nodes of 8"):
        run(Capacity(3))
    with pytest.raises(ValueError, match="quantiles are p50 and p90"):
        ForecastAhead(2, quantile="p99")


bench = benchmark("capacity")


def test_the_fit_takes_the_cheapest_candidate_that_meets_both_targets() -> None:
    rows = [
        {"quantile": "p50", "headroom": 0.0, "gpu_hours": 50.0, "mean_wait_s": 40.0},
        {"quantile": "p90", "headroom": 0.25, "gpu_hours": 60.0, "mean_wait_s": 20.0},
        {"quantile": "p90", "headroom": 1.0, "gpu_hours": 69.0, "mean_wait_s": 5.0},
        {"quantile": "p90", "headroom": 2.0, "gpu_hours": 90.0, "mean_wait_s": 0.0},
    ]
    assert bench.choose(rows, static_h=100.0, reactive_wait_s=40.0) == ("p90", 0.25)
    assert bench.choose(rows, static_h=100.0, reactive_wait_s=5.0) == ("p90", 1.0)
    assert bench.choose(rows, static_h=60.0, reactive_wait_s=5.0) == ("p50", 0.0)


def test_the_notebook_cells_are_the_trace_s_gpu_cells() -> None:
    trace = bench.cells(DATA / "adobe-sensei-first10.json")
    assert trace.jobs and all(j.gpus >= 1 for j in trace.jobs)
    assert [j.submit_s for j in trace.jobs] == sorted(j.submit_s for j in trace.jobs)
