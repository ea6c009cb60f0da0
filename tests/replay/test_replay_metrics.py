"""Metrics on tiny traces whose every figure is worked out by hand."""

from __future__ import annotations

import math

import pytest
from replay_helpers import trace_of

from jupyter_gpubroker.broker.models import JobClass
from jupyter_gpubroker.replay import replay, summarize
from jupyter_gpubroker.replay.metrics import jain, percentile
from jupyter_gpubroker.replay.traces import Job


def test_percentile_interpolates_between_ranks():
    assert percentile([0, 90, 130], 0.5) == 90
    assert percentile([0, 90, 130], 0.95) == pytest.approx(126)  # 90 + 0.9 * 40
    assert percentile([7], 0.95) == 7
    assert math.isnan(percentile([], 0.5))


def test_jain_index():
    assert jain([0.5, 0.5, 0.5]) == pytest.approx(1)
    assert jain([1, 0]) == pytest.approx(0.5)
    assert math.isnan(jain([0, 0]))


def test_one_gpu_three_jobs_under_fcfs():
    """a runs 0-100; b (submitted at 10) runs 100-150; c (at 20) runs 150-160."""
    trace = trace_of(
        Job(0, 100, 1, "a"),
        Job(10, 50, 1, "b", job_class=JobClass.INTERACTIVE),
        Job(20, 10, 1, "b"),
    )
    s = summarize(replay(trace, "fcfs", inventory="dgx-h100:1"), starve_after_s=100)
    assert s["jobs"] == 3
    assert s["mean_wait_s"] == pytest.approx(220 / 3)  # waits 0, 90, 130
    assert (s["median_wait_s"], s["max_wait_s"]) == (90, 130)
    assert s["p95_wait_s"] == pytest.approx(126)
    assert s["mean_jct_s"] == pytest.approx(380 / 3)  # 100, 140, 140
    assert s["utilization_busy"] == 1.0  # the GPU was held from 0 to 160
    assert s["utilization_queued"] == 1.0 and s["queued_time_share"] == pytest.approx(140 / 160)
    assert s["fragmentation"] == 0.0
    # user a ran all its time in the system (1); b ran 60 of its 280 s (3/14)
    assert s["jain"] == pytest.approx(289 / 410)
    assert (s["tenants"], s["starved"]) == (2, 1)  # c waited 130 s > 100 s
    assert s["by_class"]["interactive"]["mean_wait_s"] == 90
    assert s["by_class"]["batch"]["jobs"] == 2 and s["by_class"]["batch"]["max_wait_s"] == 130
    assert s["decisions"] == 6  # one pass per instant: 0, 10, 20, 100, 150, 160
    assert s["cpu_ms_per_decision"] > 0


def test_fcfs_waits_where_slurm_backfills():
    """Two GPUs: x holds one until 100, y needs both, z (50 s) fits before y can start."""
    trace = trace_of(Job(0, 100, 1, "x"), Job(1, 10, 2, "y"), Job(2, 50, 1, "z"))

    def waits(policy: str) -> list[float]:
        run = replay(trace, policy, inventory="dgx-h100:2")
        return [o.wait_s for o in sorted(run.outcomes, key=lambda o: o.submit_s)]

    assert waits("fcfs") == [0, 99, 108]  # strict: z queues behind y
    assert waits("slurm") == [0, 99, 0]  # EASY backfill: z is done by 52, before y's start
    # queued from 1 to 110: one GPU of two held until 100, both while y runs
    fcfs = summarize(replay(trace, "fcfs", inventory="dgx-h100:2"))
    assert fcfs["utilization_queued"] == pytest.approx((99 * 1 + 10 * 2) / (2 * 109))


def test_free_slices_too_small_for_the_waiting_request_are_fragmentation(tmp_path):
    """One H100 cut 4g + 2g + 1g: a second 4g job waits while 3/7 of the GPU sits free."""
    topology = tmp_path / "split.yaml"
    topology.write_text(
        "version: v1\n"
        "simulate: {gpu-model: H100-80GB, gpu-count: 1}\n"
        "mig-configs:\n"
        "  split:\n"
        "    - devices: all\n"
        "      mig-enabled: true\n"
        '      mig-devices: {"4g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}\n'
    )
    trace = trace_of(Job(0, 100, 0.5, "a"), Job(10, 10, 0.5, "b"))
    run = replay(trace, "slurm", inventory=str(topology), dynamic_mig=False)
    s = summarize(run)
    assert s["max_wait_s"] == 90
    assert s["utilization_queued"] == pytest.approx(4 / 7)
    assert s["fragmentation"] == pytest.approx(3 / 7)
    assert s["utilization_busy"] == pytest.approx(4 / 7)
    assert [o.gpu_equivalents for o in run.outcomes] == pytest.approx([4 / 7, 4 / 7])
