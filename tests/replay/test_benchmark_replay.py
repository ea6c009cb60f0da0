"""benchmarks/replay.py's train/test mode and README generation (the full run needs the
public traces; these check its choices on hand-made inputs)."""

from __future__ import annotations

from pathlib import Path

import pytest
from replay_helpers import benchmark, trace_of

from jupyter_gpubroker.replay.driver import Timeline
from jupyter_gpubroker.replay.traces import Job

bench = benchmark("replay")


def test_the_time_split_never_puts_one_instant_in_both_halves():
    trace = trace_of(*(Job(t, 10.0, 1, "ann") for t in (0, 1, 2, 2, 2, 3)))
    k = bench.split(trace)
    assert k == 2  # the median job is one of three at t=2: all of them go to the second half
    assert trace.jobs[k - 1].submit_s < trace.jobs[k].submit_s


def run_of(mean_wait_s, starved):
    return bench.Run({"mean_wait_s": mean_wait_s, "starved": starved}, Timeline(), 1)


def test_a_fit_takes_the_lowest_mean_wait_that_starves_no_more_than_fcfs():
    runs = [run_of(500.0, 0), run_of(100.0, 3), run_of(300.0, 1)]
    chosen = bench.best(runs, fcfs=run_of(900.0, 1))
    assert chosen == bench.CANDIDATES[2]  # 100 s starves 3 where FCFS starves 1


def test_the_readme_sections_are_replaced_and_the_prose_kept(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("prose\n<!-- generated: eta -->\nold\n<!-- end: eta -->\nmore prose\n")
    assert bench.missing_sections(readme) == ["results", "train-test", "targets"]
    bench.write_readme(readme, {"eta": "| new |"})
    assert readme.read_text() == (
        "prose\n<!-- generated: eta -->\n| new |\n<!-- end: eta -->\nmore prose\n"
    )
    bench.write_readme(readme, {"eta": "| newer |"})  # again: one section, not two
    assert readme.read_text().count("| newer |") == 1 and "| new |\n" not in readme.read_text()


@pytest.mark.parametrize("name", bench.SECTIONS)
def test_the_committed_readme_has_every_generated_section(name):
    assert name not in bench.missing_sections(Path(bench.HERE) / "README.md")


def test_one_run_replays_openb_at_x4_with_the_oracle_bound_under_the_tier():
    x4 = next(s for s in bench.SCENARIOS if s.name == "openb-x4")
    assert (x4.trace, x4.compress) == ("openb_pod_list_default.csv", 4.0)
    assert [c for c, _ in x4.runs] == [*bench.COLUMNS, "oracle", "oracle+tier"]
    assert bench.FIT_ON["openb-x4"] == "philly"  # reported with Philly's fit, never its own
    oracle = bench.ORACLES["oracle+tier"]()
    assert oracle.tier_start_s == 18 * 3600  # the broker's default tier: 3/4 of 24 h


def summary(policy, mean_wait_s, jain=0.99, starved=0, eta=None):
    s = {
        "policy": policy,
        "mean_wait_s": mean_wait_s,
        "jain": jain,
        "starved": starved,
        "utilization_queued": 0.95,
    }
    if eta:
        s["eta"] = {"all": {"median_rel_error": eta[0], "coverage": eta[1]}}
    return s


def test_the_targets_table_says_which_target_each_scenario_meets():
    results = {
        "openb": {
            "summaries": [
                summary("fcfs", 1000.0, starved=2),
                summary("slurm", 500.0, jain=0.98),
                summary("broker", 400.0, jain=0.97, starved=1, eta=(0.25, 0.80)),
            ]
        },
        "openb-x4": {
            "summaries": [
                summary("fcfs", 1000.0),
                summary("slurm", 500.0),
                summary("broker", 600.0, eta=(0.5, 0.70)),
                summary("oracle+tier", 450.0),
            ]
        },
    }
    text = bench.targets_md(results)
    assert "| broker <= slurm | yes: 0.80x | no: 1.20x |" in text
    assert "| broker <= 0.7x fcfs | yes: 0.40x | yes: 0.60x |" in text
    assert "| Jain >= slurm's | no: 0.970 vs 0.980 | yes: 0.990 vs 0.990 |" in text
    assert "| starved <= fcfs's | yes: 1 vs 2 | yes: 0 vs 0 |" in text
    assert "| ETA 80% range covers 75-85% | yes: 80.0% | no: 70.0% |" in text
    assert "Median scenario: broker 1.00x slurm (target 0.85x: not met)." in text
    assert "openb-x4 0.90x slurm (oracle+tier, 0 starved)" in text
