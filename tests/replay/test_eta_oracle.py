"""benchmarks/eta_oracle.py: the oracle bounds of the start estimate (the full run needs
the public traces; this checks its measurement on a hand-made queue)."""

from __future__ import annotations

from replay_helpers import benchmark, trace_of

from jupyter_gpubroker.replay.traces import Job

oracle = benchmark("eta_oracle")


def test_knowing_every_duration_and_arrival_the_estimate_is_exact():
    # one GPU: a queue of hour-long jobs, and later ones of a user who has used nothing
    # yet, which fair share puts ahead of those already waiting
    jobs = [Job(10.0 * i, 3600.0, 1, "ann") for i in range(4)]
    jobs += [Job(1800.0 + 3600.0 * i, 600.0, 1, "bob") for i in range(3)]
    got = oracle.figures(trace_of(*jobs), "dgx-h100:1", 1.0)
    err = {name: figures[0] for name, figures in got.items()}
    assert got["broker"][2] > 10  # estimates every 10 minutes while jobs wait
    assert err["... and the real arrivals, in real start order"] == 0
    assert err["real arrivals placed by priority, true durations"] == 0
    # without the arrivals, exact durations still leave the start too early
    assert err["true durations, no future"] > 0
    assert got["true durations, no future"][1] > 0.5
