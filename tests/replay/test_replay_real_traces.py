"""The two public traces load whole as documented, and a slice of each replays
under every policy (the full replays are in benchmarks/replay.py)."""

from __future__ import annotations

import pytest

from jupyter_gpubroker.replay import DEFAULT_COMPRESS, DEFAULT_INVENTORY, load, replay, summarize


def test_openb_loads_with_the_documented_counts(traces_dir):
    trace = load(traces_dir / "openb_pod_list_default.csv", "openb")
    assert len(trace.jobs) == 7064  # 8,152 tasks less 1,088 CPU-only ones
    assert trace.skipped == {"CPU-only tasks (num_gpu 0)": 1088}
    assert sum(1 for j in trace.jobs if j.gpus < 1) == 3078
    assert len({j.user for j in trace.jobs}) == 32


def test_philly_loads_every_job_with_its_real_tenant(traces_dir):
    trace = load(traces_dir / "philly_vc_jobs.csv", "philly")
    assert len(trace.jobs) == 82247
    assert len({j.group for j in trace.jobs}) == 15
    assert all(j.user == j.group for j in trace.jobs)


@pytest.mark.parametrize(
    ("fmt", "file", "jobs"),
    [("openb", "openb_pod_list_default.csv", 2500), ("philly", "philly_vc_jobs.csv", 4000)],
)
def test_a_slice_replays_under_every_policy(traces_dir, fmt, file, jobs):
    trace = load(traces_dir / file, fmt).head(jobs)
    for policy in ("fcfs", "slurm", "broker"):
        run = replay(
            trace, policy, inventory=DEFAULT_INVENTORY[fmt], compress=DEFAULT_COMPRESS[fmt]
        )
        s = summarize(run)
        assert s["jobs"] + sum(run.skipped.values()) == jobs
        assert 0 <= s["median_wait_s"] <= s["p95_wait_s"] <= s["max_wait_s"]
        assert 0 < s["utilization_busy"] <= 1
        assert 0 < s["jain"] <= 1
