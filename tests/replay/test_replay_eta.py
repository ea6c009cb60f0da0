"""The replay measures the start estimates a waiting user would see against real starts."""

from __future__ import annotations

import json
import random

import pytest
from replay_helpers import trace_of

from jupyter_gpubroker.cli import main
from jupyter_gpubroker.replay import replay, summarize
from jupyter_gpubroker.replay.traces import Job

# one GPU, a 100 s job every 50 s: each waits behind the one before
STEADY = [Job(50.0 * i, 100.0, 1, "ann") for i in range(10)]


def test_estimates_are_recorded_at_submission_and_while_waiting_against_real_starts():
    run = replay(trace_of(*STEADY), "fcfs", inventory="dgx-h100:1", eta_every_s=60)
    assert run.etas is not None
    starts = {o.submit_s: o.start_s for o in run.outcomes}
    at_submit = [e for e in run.etas if e.at_submit]
    assert sorted(e.at for e in at_submit) == [50.0 * i for i in range(1, 10)]  # all but the first
    assert all(e.start == starts[e.at] for e in at_submit)
    assert len(run.etas) > len(at_submit)  # and again while they waited
    # before any job ended the predictor knows nothing: the first estimate says so
    first = min(run.etas, key=lambda e: e.at)
    assert first.predicted is None and first.squeue == 100
    # once one 100 s hold is known, every estimate is exact
    known = [e for e in run.etas if e.predicted is not None]
    assert known and all(e.predicted.median == e.start for e in known)


def test_the_summary_reports_error_and_coverage():
    s = summarize(replay(trace_of(*STEADY), "fcfs", inventory="dgx-h100:1", eta_every_s=60))
    eta = s["eta"]["all"]
    assert eta["median_rel_error"] == 0 and eta["coverage"] == 1
    assert eta["squeue_median_rel_error"] == 0  # the replay's limits are the true durations
    assert s["eta"]["at_submit"]["estimates"] == 9 and eta["unknown"] >= 1
    assert "eta" not in summarize(replay(trace_of(*STEADY), "fcfs", inventory="dgx-h100:1"))


def test_the_cli_prints_the_eta_rows_when_asked(write_trace, capsys):
    rows = [f"{50 * i},100,1,ann" for i in range(10)]
    path = write_trace("submit_s,duration_s,gpus,user", rows)
    args = ["replay", "--trace", str(path), "--policy", "fcfs", "--inventory", "dgx-h100:1"]
    assert main([*args, "--eta-every", "1"]) == 0
    out = capsys.readouterr().out
    assert "ETA median relative error" in out and "ETA 80% range coverage" in out
    assert main([*args, "--eta-every", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["eta"]["all"]["coverage"] == 1
    assert main([*args, "--eta-every", "0"]) == 2
    assert "--eta-every must be positive" in capsys.readouterr().err
    with pytest.raises(ValueError, match="ETA sampling interval must be positive"):
        replay(trace_of(*STEADY), eta_every_s=0)


def busy_gpus(n=400, load=0.95, seed=1):
    """Poisson arrivals of 1-GPU jobs with log-normal durations (median 400 s) from
    three users, loading 4 GPUs to ``load``: a queue that comes and goes."""
    rnd, t, jobs = random.Random(seed), 0.0, []
    for _ in range(n):
        t += rnd.expovariate(load * 4 / 660.0)
        jobs.append(Job(round(t), round(rnd.lognormvariate(6.0, 1.0)), 1, rnd.choice("abc")))
    return trace_of(*jobs)


@pytest.mark.parametrize("policy", ["fcfs", "broker"])
def test_the_stated_80_percent_range_covers_about_80_percent_of_real_starts(policy: str):
    s = summarize(replay(busy_gpus(), policy, inventory="dgx-h100:4", eta_every_s=600))
    eta = s["eta"]["all"]
    assert eta["estimates"] > 1000
    assert 0.7 <= eta["coverage"] <= 0.9
    if policy == "fcfs":  # here the predictor's own range is far too wide
        assert eta["raw_coverage"] > 0.9


def test_without_asking_at_submission_estimates_come_only_at_the_samples():
    run = replay(
        trace_of(*STEADY), "fcfs", inventory="dgx-h100:1", eta_every_s=60, eta_at_submit=False
    )
    assert run.etas
    instants = sorted({e.at for e in run.etas})
    assert all(b - a >= 60 for a, b in zip(instants, instants[1:], strict=False))
    firsts = [e for e in run.etas if e.at_submit]  # each job's first estimate, one per job
    assert len(firsts) == len({e.start for e in firsts})
