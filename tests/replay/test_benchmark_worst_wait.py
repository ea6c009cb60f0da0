"""benchmarks/worst_wait.py's tables: each limit setting's columns against the baselines
of the same setting (the full run needs the public traces)."""

from __future__ import annotations

from replay_helpers import benchmark

bench = benchmark("worst_wait")


def row(limits, policy, mean_wait_s, max_wait_s, eta=None):
    return {
        "scenario": "philly",
        "limits": limits,
        "policy": policy,
        "mean_wait_s": mean_wait_s,
        "max_wait_s": max_wait_s,
        "starved": 0,
        "cut_at_limit": None if limits == "none" else 2,
        "extended_at_limit": None if limits == "none" else 5,
        "eta": eta,
    }


ETA = {
    "all": {
        "estimates": 1200,
        "bounded": 0.5,
        "bound_held": 1.0,
        "median_rel_error": 0.25,
        "coverage": 0.8,
        "squeue_median_rel_error": 6.5,
    }
}
ROWS = [
    row("none", "fcfs", 4000.0, 36000.0),
    row("none", "slurm", 2000.0, 72000.0),
    row("none", "broker", 1000.0, 54000.0),
    row("tsafrir", "fcfs", 4000.0, 18000.0),
    row("tsafrir", "slurm", 4000.0, 72000.0),
    row("tsafrir", "broker", 3000.0, 27000.0, ETA),
]


def test_each_setting_is_compared_with_the_baselines_run_with_the_same_limits():
    lines = bench.table(ROWS).splitlines()
    assert lines[4] == "| philly | none | broker | 1,000 s | 0.50x | 15.0 h | 1.50x | 0 | - | - |"
    assert lines[7] == "| philly | tsafrir | broker | 3,000 s | 0.75x | 7.5 h | 1.50x | 0 | 2 | 5 |"


def test_the_estimates_table_has_a_row_per_setting_the_broker_measured():
    lines = bench.eta_table(ROWS).splitlines()
    assert lines[2:] == ["| philly | tsafrir | 1,200 | 50.0% | 100.0% | 0.250 | 80.0% | 6.500 |"]
