"""Declared run-time limits in the replay: the model's settings and what a limit does."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from replay_helpers import trace_of

from jupyter_gpubroker.cli import main
from jupyter_gpubroker.replay import load, replay
from jupyter_gpubroker.replay.limits import MODES, SITE_MAX_S, declare
from jupyter_gpubroker.replay.traces import Job

HOUR = 3600.0
DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def philly():
    return load(DATA / "philly_vc_jobs_first2000.csv", "philly")


def test_exact_limits_are_the_run_times(philly):
    declared = declare(philly, "exact")
    assert [j.limit_s for j in declared.jobs] == [j.duration_s for j in philly.jobs]


def test_the_model_picks_round_values_at_or_above_each_run_time(philly):
    declared = declare(philly, "tsafrir")
    limits = [j.limit_s for j in declared.jobs]
    assert all(j.limit_s is not None and j.limit_s >= j.duration_s for j in declared.jobs)
    within = {j.limit_s for j in declared.jobs if j.duration_s <= SITE_MAX_S}
    assert within <= {*MODES, SITE_MAX_S}
    # a job longer than the site allows declares its run time in whole days
    assert all((j.limit_s or 0) % 86400 == 0 for j in declared.jobs if j.duration_s > SITE_MAX_S)
    # modal: a few values cover most jobs, the site maximum among the most popular
    counts = Counter(limits)
    top = [v for v, _ in counts.most_common(5)]
    assert sum(counts[v] for v in top) >= 0.6 * len(limits)
    assert SITE_MAX_S in top
    # and many jobs use a small fraction of what they declared
    used = sorted(j.duration_s / (j.limit_s or 1) for j in declared.jobs)
    assert used[len(used) // 2] < 0.5


def test_the_model_is_the_same_for_a_seed_and_for_a_slice_of_the_trace(philly):
    a, b = declare(philly, "tsafrir", seed=7), declare(philly, "tsafrir", seed=7)
    assert a.jobs == b.jobs
    assert declare(philly.head(10), "tsafrir", seed=7).jobs == a.jobs[:10]
    other = declare(philly, "tsafrir", seed=8)
    assert [j.limit_s for j in other.jobs] != [j.limit_s for j in a.jobs]


def test_loose_limits_are_never_tighter(philly):
    model = declare(philly, "tsafrir").jobs
    loose = declare(philly, "loose").jobs
    assert all((lo.limit_s or 0) >= (m.limit_s or 0) for lo, m in zip(loose, model, strict=True))
    assert sum(lo.limit_s or 0 for lo in loose) > sum(m.limit_s or 0 for m in model)


def test_an_unknown_model_is_named(philly):
    with pytest.raises(ValueError, match="unknown limit model 'vague'.*exact, tsafrir, loose"):
        declare(philly, "vague")


@pytest.mark.parametrize("policy", ["fcfs", "slurm", "broker"])
def test_a_job_past_its_limit_ends_at_it_and_is_counted(policy):
    jobs = (Job(0, 10 * HOUR, 1, "a", limit_s=2 * HOUR), Job(0, HOUR, 1, "b", limit_s=4 * HOUR))
    run = replay(trace_of(*jobs), policy, inventory="dgx-h100:1")
    held = sorted(o.end_s - o.start_s for o in run.outcomes)
    assert held == [HOUR, 2 * HOUR]
    assert run.cut_at_limit == 1


@pytest.mark.parametrize("policy", ["slurm", "broker"])
def test_a_job_past_its_limit_is_extended_by_the_broker_when_nobody_waits(policy):
    """The broker enforces the declared limit and lets its holder extend it, as a user
    would at the warning; Slurm's ``--time`` is final."""
    jobs = (Job(0, 10 * HOUR, 1, "a", limit_s=2 * HOUR), Job(11 * HOUR, HOUR, 1, "b"))
    run = replay(trace_of(*jobs), policy, inventory="dgx-h100:1")
    held = {o.user: o.end_s - o.start_s for o in run.outcomes}
    if policy == "broker":
        assert (held["a"], run.extended_at_limit, run.cut_at_limit) == (10 * HOUR, 1, 0)
    else:
        assert (held["a"], run.extended_at_limit, run.cut_at_limit) == (2 * HOUR, 0, 1)


def test_backfill_plans_with_the_declared_limit_not_the_run_time():
    # Two GPUs. "big" (2 GPUs) waits for the 1 h job on GPU 0; a 30 min job arrives.
    # Declared 30 min it backfills on the idle GPU 1; declared 4 h (its user padded
    # it) it would delay big's reservation, so it waits, as under Slurm.
    def waits(limit: float) -> dict[str, float]:
        jobs = (
            Job(0, HOUR, 1, "first", limit_s=HOUR),
            Job(1, HOUR, 2, "big", limit_s=HOUR),
            Job(2, 0.5 * HOUR, 1, "short", limit_s=limit),
        )
        run = replay(trace_of(*jobs), "slurm", inventory="dgx-h100:2")
        return {o.user: o.wait_s for o in run.outcomes}

    assert waits(0.5 * HOUR)["short"] == 0
    assert waits(4 * HOUR)["short"] > HOUR


def test_the_cli_replays_with_declared_limits(write_trace, capsys):
    path = write_trace("submit_s,duration_s,gpus,user", ["0,3600,1,a", "1,600,1,b", "2,60,1,c"])
    args = ["replay", "--trace", str(path), "--format", "generic", "--json"]
    assert main([*args, "--policy", "slurm", "--inventory", "dgx-h100:1", "--limits=tsafrir"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["jobs"] == 3 and out["cut_at_limit"] == 0
    assert any("declared limits: tsafrir" in note for note in out["notes"])
    with pytest.raises(SystemExit):
        main([*args, "--limits", "vague"])
    assert "invalid choice: 'vague'" in capsys.readouterr().err
