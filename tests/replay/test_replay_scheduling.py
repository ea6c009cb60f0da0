"""Scheduling behaviour a replay makes visible: backfill, FCFS order, starvation."""

from __future__ import annotations

import json

import pytest
from replay_helpers import trace_of

from jupyter_gpubroker.broker.policy import BrokerPolicy
from jupyter_gpubroker.cli import main
from jupyter_gpubroker.replay import replay, summarize
from jupyter_gpubroker.replay.traces import Job

HOUR = 3600.0
FOUR_JOBS = ("submit_s,duration_s,gpus,user", "0,100,2,a", "0,200,1,a", "1,10,2,b")


@pytest.mark.parametrize(
    ("policy", "last_user", "mean_wait"),
    [
        ("slurm", "c", 24.75),
        ("broker", "c", 24.75),
        ("broker", "a", 24.75),  # a's fair share is spent: b ranks first and blocks
        ("fcfs", "c", 49.25),  # strict: no backfill at all
    ],
)
def test_easy_backfill_runs_a_long_job_on_a_gpu_the_blocked_request_will_not_need(
    write_trace, capsys, policy, last_user, mean_wait
):
    # b needs 2 GPUs and starts at t=100 on a's two; the idle GPU is not needed then,
    # so the 1000 s job arriving at t=2 may run on it at once.
    path = write_trace(FOUR_JOBS[0], [*FOUR_JOBS[1:], f"2,1000,1,{last_user}"])
    args = ["replay", "--trace", str(path), "--format", "generic", "--json"]
    assert main([*args, "--policy", policy, "--inventory", "dgx-h100:4"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["mean_wait_s"], out["max_wait_s"]) == (mean_wait, 99)


def test_fcfs_order_does_not_depend_on_who_the_users_are():
    durations = (10.0, 20.0, 30.0, 40.0, 50.0)

    def outcomes(users: str) -> list[tuple[float, float, float]]:
        jobs = [Job(0, d, 1, u) for d, u in zip(durations, users, strict=True)]
        run = replay(trace_of(*jobs), "fcfs", inventory="dgx-h100:1")
        return sorted((o.end_s - o.start_s, o.start_s, o.submit_s) for o in run.outcomes)

    by_one_mapping = outcomes("vwxyz")
    assert by_one_mapping == outcomes("abcab") == outcomes("aaaaa")
    assert [start for _, start, _ in by_one_mapping] == [0, 10, 30, 60, 100]  # trace order


def test_the_oldest_first_tier_starts_before_requests_cross_max_wait():
    # One GPU, a fresh user's 1 h job every hour: the GPU never idles, and "hog", whose
    # fair share its first job spent, is always outranked. FCFS serves hog within 3 h.
    jobs = [Job(float(i), HOUR, 1, "hog") for i in range(3)]
    jobs += [Job(i * HOUR, HOUR, 1, f"fresh{i}") for i in range(40)]
    trace = trace_of(*jobs)
    fcfs = summarize(replay(trace, "fcfs", inventory="dgx-h100:1"))
    # no aging: only the tier protects hog
    broker = summarize(replay(trace, BrokerPolicy(weight_age_per_hour=0), inventory="dgx-h100:1"))
    assert fcfs["starved"] == 0 and fcfs["max_wait_s"] == 3 * HOUR
    assert broker["starved"] <= fcfs["starved"]
    assert broker["max_wait_s"] < 24 * HOUR


def waits_by_user(trace, policy: str) -> dict[str, float]:
    return {o.user: o.wait_s for o in replay(trace, policy, inventory="dgx-h100:1").outcomes}


def test_a_light_user_is_not_held_behind_a_heavy_users_aged_backlog():
    # hog queues twenty 1 h jobs at once; ann's one job arrives 10.5 h later. Waiting
    # earns nothing before the oldest-first tier, so fair share puts ann next (age
    # from submission made hog's backlog outrank her until it drained).
    jobs = [Job(float(i), HOUR, 1, "hog") for i in range(20)]
    trace = trace_of(*jobs, Job(10.5 * HOUR, HOUR, 1, "ann"))
    assert waits_by_user(trace, "fcfs")["ann"] > 9 * HOUR
    assert waits_by_user(trace, "broker")["ann"] <= HOUR


def test_once_a_request_is_past_max_wait_the_backlog_is_not_served_oldest_first():
    # One GPU held 30 h by hog, who also queued ten 1 h jobs; ann's 1 h job comes at
    # 20 h. When the GPU frees, hog's jobs have waited 30 h: no order can keep them
    # under the 24 h bound, so the tier is off and fair share puts ann first (served
    # oldest-first she would wait for all ten).
    jobs = [Job(0, 30 * HOUR, 1, "hog"), *(Job(float(i), HOUR, 1, "hog") for i in range(1, 11))]
    trace = trace_of(*jobs, Job(20 * HOUR, HOUR, 1, "ann"))
    assert waits_by_user(trace, "fcfs")["ann"] == 20 * HOUR
    assert waits_by_user(trace, "broker")["ann"] == 10 * HOUR


def test_past_the_bound_the_oldest_request_still_goes_first():
    # One GPU held 30 h by hog, whose second job queues behind it; a fresh user's 1 h
    # job arrives every hour for 100 h. At 30 h hog's job has waited past the 24 h
    # bound, so the oldest-first tier is off; fair share alone would put every fresh
    # user first for as long as they keep coming (hog waited 130 h). The oldest
    # request still goes first once it has waited 36 h: within 1.5x FCFS's longest.
    jobs = [Job(0, 30 * HOUR, 1, "hog"), Job(1, HOUR, 1, "hog")]
    jobs += [Job(i * HOUR, HOUR, 1, f"fresh{i}") for i in range(1, 101)]
    trace = trace_of(*jobs)
    fcfs = summarize(replay(trace, "fcfs", inventory="dgx-h100:1"))
    broker = replay(trace, "broker", inventory="dgx-h100:1").outcomes
    assert fcfs["max_wait_s"] <= 30 * HOUR
    assert max(o.wait_s for o in broker if o.user == "hog") <= 1.5 * fcfs["max_wait_s"]
    assert max(o.wait_s for o in broker) <= 1.5 * fcfs["max_wait_s"]
