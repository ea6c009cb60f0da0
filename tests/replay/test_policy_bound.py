"""benchmarks/policy_bound.py: the broker's ranking with true run times (the full run
needs the public traces; this checks that its policy ranks by the truth)."""

from __future__ import annotations

from replay_helpers import benchmark, trace_of

from jupyter_gpubroker.replay import replay
from jupyter_gpubroker.replay.traces import Job

bound = benchmark("policy_bound")


def test_true_run_times_put_the_short_job_first_where_history_cannot_tell():
    # one GPU, held for 1000 s; then two new users wait, a long job first, a short one
    # after. Neither has history: the deployed broker judges both by the class's one
    # hold (1000 s) and ties, so the long job goes first; with true run times the
    # short one does.
    trace = trace_of(
        Job(0.0, 1000.0, 1, "ann"), Job(10.0, 5000.0, 1, "bob"), Job(20.0, 100.0, 1, "cat")
    )

    def waits(policy):
        run = replay(trace, policy, inventory="dgx-h100:1")
        return {o.user: o.wait_s for o in run.outcomes}

    assert waits("broker") == {"ann": 0.0, "bob": 990.0, "cat": 5980.0}
    assert waits(bound.BrokerTrue()) == {"ann": 0.0, "bob": 1090.0, "cat": 980.0}


def test_the_table_picks_the_best_weights_that_keep_slurms_jain_and_fcfs_starved():
    rows = [("s", "fcfs", (), 900.0, 0.9, 0), ("s", "slurm", (), 100.0, 0.95, 0)]
    for i, p in enumerate(bound.GRID):
        rows.append(("s", "broker", p, 80.0 + i, 0.96 if i == 4 else 0.94, 0))
        rows.append(("s", "true", p, 50.0 + i, 0.96, 1 if i < 3 else 0))
    line = bound.table(rows, ["s"]).splitlines()[-1]
    assert "| 0.84x (1000/3000) |" in line  # the only broker point at slurm's Jain
    assert "| 0.53x (1000/1000) |" in line  # the first three starve more than fcfs
    assert "| s | 1000/3000 | 0.84x, 0.9600, 0 | 0.54x, 0.9600, 0 |" in bound.grid(rows, ["s"])
