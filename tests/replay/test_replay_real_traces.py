"""Excerpts of the two public traces (tests/replay/data, see its README) load as their
rows say and replay under every policy. Every expected figure is counted from the CSV
here, not taken from the loader. The full traces are checked by
``python benchmarks/replay.py --check`` (CI runs it when the traces are at hand)."""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import pytest

from jupyter_gpubroker.replay import DEFAULT_COMPRESS, DEFAULT_INVENTORY, load, replay, summarize

DATA = Path(__file__).parent / "data"
OPENB = DATA / "openb_pod_list_head1500.csv"
PHILLY = DATA / "philly_vc_jobs_first2000.csv"
TEMPLATE = ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "qos", "gpu_spec")
"""What makes two openb tasks the same workload, hence one synthetic user."""


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_openb_excerpt_loads_its_gpu_tasks_with_their_shares_and_classes():
    tasks = rows(OPENB)
    cpu_only = sum(t["num_gpu"] == "0" for t in tasks)
    gpu_tasks = [t for t in tasks if t["num_gpu"] != "0"]
    trace = load(OPENB, "openb")
    assert len(trace.jobs) == len(gpu_tasks) > 1000
    assert trace.skipped == {"CPU-only tasks (num_gpu 0)": cpu_only}
    shares = sorted(int(t["gpu_milli"]) / 1000 for t in gpu_tasks if int(t["gpu_milli"]) < 1000)
    assert sorted(j.gpus for j in trace.jobs if j.gpus < 1) == shares
    assert sorted(j.submit_s for j in trace.jobs) == sorted(
        float(t["creation_time"]) for t in gpu_tasks
    )
    interactive = sum(t["qos"] in ("LS", "Guaranteed") for t in gpu_tasks)
    assert sum(j.job_class == "interactive" for j in trace.jobs) == interactive


def test_openb_excerpt_gives_the_tasks_of_one_template_one_synthetic_user():
    gpu_tasks = [t for t in rows(OPENB) if t["num_gpu"] != "0"]  # in creation order
    jobs = load(OPENB, "openb").jobs
    assert [j.submit_s for j in jobs] == [float(t["creation_time"]) for t in gpu_tasks]
    users_of: dict[tuple[str, ...], set[str]] = defaultdict(set)
    for task, job in zip(gpu_tasks, jobs, strict=True):
        users_of[tuple(task[c] for c in TEMPLATE)].add(job.user)
    assert all(len(users) == 1 for users in users_of.values())
    users = {job.user for job in jobs}
    assert 1 < len(users) <= 32 and users <= {f"u{k:02d}" for k in range(32)}


def test_philly_excerpt_loads_every_job_with_its_real_tenant():
    jobs = rows(PHILLY)
    trace = load(PHILLY, "philly")
    assert len(trace.jobs) == len(jobs) == 2000
    assert {j.group for j in trace.jobs} == {r["cluster"] for r in jobs}
    assert all(j.user == j.group for j in trace.jobs)
    assert sum(j.gpus for j in trace.jobs) == sum(int(r["num_gpus"]) for r in jobs)
    assert [j.submit_s for j in trace.jobs] == sorted(j.submit_s for j in trace.jobs)


@pytest.mark.parametrize(
    ("fmt", "path", "runnable", "too_big"),
    [
        # 64 GPUs in MIG mode: a task asking for 2-8 whole GPUs fits no slice
        (
            "openb",
            OPENB,
            lambda r: r["num_gpu"] == "1",
            lambda r: int(r["num_gpu"]) > 1,
        ),
        ("philly", PHILLY, lambda r: True, lambda r: False),  # 768 whole GPUs fit every job
    ],
)
def test_an_excerpt_replays_under_every_policy(fmt, path, runnable, too_big):
    expected = sum(runnable(r) for r in rows(path))
    skipped = sum(too_big(r) for r in rows(path))
    trace = load(path, fmt)
    for policy in ("fcfs", "slurm", "broker"):
        run = replay(
            trace, policy, inventory=DEFAULT_INVENTORY[fmt], compress=DEFAULT_COMPRESS[fmt]
        )
        s = summarize(run)
        assert (s["jobs"], sum(run.skipped.values())) == (expected, skipped), policy
        assert 0 <= s["median_wait_s"] <= s["p95_wait_s"] <= s["max_wait_s"]
        assert 0 < s["utilization_busy"] <= 1
        assert 0 < s["jain"] <= 1
