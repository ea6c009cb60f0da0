"""The replay drives the server's own broker core, on a virtual clock."""

from __future__ import annotations

import time

import pytest
from replay_helpers import trace_of

from jupyter_gpubroker.broker import core
from jupyter_gpubroker.broker.policy import BrokerPolicy
from jupyter_gpubroker.replay import driver, replay
from jupyter_gpubroker.replay.traces import Job
from jupyter_gpubroker.runtime import gpubroker

WEEK = 7 * 86400.0


def test_the_replay_uses_the_broker_class_the_server_runs(monkeypatch):
    assert driver.Broker is core.Broker is gpubroker.Broker
    calls = {"schedule": 0, "release": 0}
    for name in calls:
        real = getattr(core.Broker, name)

        def spy(self, *args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(core.Broker, name, spy)
    run = replay(trace_of(Job(0, 60, 1, "a"), Job(5, 60, 1, "b")), inventory="dgx-h100:1")
    assert calls == {"schedule": run.decisions, "release": 2}
    assert run.policy == "broker"


def test_a_week_long_trace_replays_without_sleeping():
    jobs = [Job(i * 3600.0, 7200.0, 1, f"u{i % 3}") for i in range(168)]
    t0 = time.perf_counter()
    run = replay(trace_of(*jobs), "slurm", inventory="dgx-h100:1")
    assert time.perf_counter() - t0 < 5
    assert len(run.outcomes) == 168
    assert max(o.end_s for o in run.outcomes) - min(o.submit_s for o in run.outcomes) > WEEK
    # one GPU, a 2-hour job every hour: each job waits an hour more than the one before
    assert sorted(o.wait_s for o in run.outcomes)[-1] == pytest.approx(167 * 3600)


def test_compression_divides_the_gaps_between_submissions_only():
    trace = trace_of(Job(1000, 50, 1, "a"), Job(1100, 50, 1, "b"))
    run = replay(trace, "fcfs", inventory="dgx-h100:2", compress=4)
    assert sorted((o.submit_s, o.end_s - o.start_s) for o in run.outcomes) == [
        (1000, 50),
        (1025, 50),
    ]
    with pytest.raises(ValueError, match="compression factor must be positive"):
        replay(trace, compress=0)


def test_jobs_the_inventory_cannot_host_are_skipped_and_counted():
    trace = trace_of(Job(0, 10, 8, "a"), Job(0, 10, 1, "b"), Job(1, 10, 0.4, "c"))
    run = replay(trace, "fcfs", inventory="dgx-h100-mig:2", dynamic_mig=False)
    refused = "jobs refused: no GPU here offers MIG profile '{}'; available profiles: 1g.10gb"
    assert run.skipped == {
        "jobs needing 8 whole GPUs (the inventory has fewer)": 1,
        refused.format("7g.80gb"): 1,
        refused.format("3g.40gb"): 1,
    }
    assert run.outcomes == [] and not run.dynamic_mig


def test_dynamic_mig_recuts_idle_gpus_for_the_profiles_jobs_need():
    trace = trace_of(Job(0, 10, 1, "a"), Job(0, 10, 0.4, "b"), Job(1, 10, 0.1, "c"))
    run = replay(trace, BrokerPolicy(), inventory="dgx-h100-mig:2")
    assert run.dynamic_mig and run.skipped == {}
    assert sorted(o.gpu_equivalents for o in run.outcomes) == pytest.approx([1 / 7, 3 / 7, 1])
    assert max(o.wait_s for o in run.outcomes) == 0
