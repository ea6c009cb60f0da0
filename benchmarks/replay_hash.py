"""Fingerprint the replay's scheduling decisions: one sha256 per policy.

A refactoring of the broker core must not change a single decision. This replays the
first ``JOBS`` jobs of Microsoft's Philly trace on ``dgx-h100-mig:8`` under the broker,
slurm and fcfs policies and prints, per policy, a sha256 over every job's (id, submit,
start, end); identical hashes before and after a change mean identical decisions.

A trace job has no id of its own, so a job is named by what the trace says of it (user,
group, class, GPUs, submit time): the outcomes are sorted by that, then by start, and
the id is the position in that order. With ``--notebooks`` it also hashes the notebook
replay (``benchmarks/notebooks.py``'s runs: every policy on both clusters, each
session's held time, waits, shutdowns and grants).

    python benchmarks/replay_hash.py [--trace PATH] [--jobs N] [--notebooks] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
from pathlib import Path

from jupyter_gpubroker.replay import load, replay

HERE = Path(__file__).resolve().parent
TRACES = HERE.parent.parent / "shared" / "data" / "traces"
PHILLY = TRACES / "philly_vc_jobs.csv"
NOTEBOOKS = TRACES / "notebooks" / "adobe-sensei-june-1-2.json"
JOBS = 2000
INVENTORY = "dgx-h100-mig:8"
POLICIES = ("broker", "slurm", "fcfs")


def philly_hashes(path: Path, jobs: int) -> dict[str, str]:
    """Policy -> sha256 of every replayed job's (id, submit, start, end)."""
    trace = load(path, "philly").head(jobs)
    hashes = {}
    for policy in POLICIES:
        run = replay(trace, policy, inventory=INVENTORY)
        rows = sorted(
            (o.submit_s, o.user, o.group, o.job_class.value, o.gpu_equivalents, o.start_s, o.end_s)
            for o in run.outcomes
        )
        h = hashlib.sha256()
        for i, (submit, *_, start, end) in enumerate(rows):
            h.update(f"{i},{submit!r},{start!r},{end!r}\n".encode())
        h.update(repr(sorted(run.skipped.items())).encode())
        hashes[policy] = h.hexdigest()
    return hashes


def notebook_hashes(path: Path) -> dict[str, str]:
    """(cluster, policy) -> sha256 of each session's outcome in the notebook replay."""
    sys.path.insert(0, str(HERE))
    import notebooks as bench  # benchmarks/notebooks.py: its clusters and policies

    from jupyter_gpubroker.replay import notebooks as nb

    sessions = nb.load(path)
    hashes = {}
    for gpus in bench.CLUSTERS:
        for p in bench.policies():
            result = nb.replay(sessions, p, gpus=gpus)
            h = hashlib.sha256()
            for s in result.sessions:
                h.update(repr(dataclasses.astuple(s)).encode() + b"\n")
            h.update(f"{result.peak_held},{result.passes}".encode())
            hashes[f"{gpus} GPUs, {p.name}"] = h.hexdigest()
    return hashes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, default=PHILLY, help="the Philly trace (CSV)")
    ap.add_argument("--jobs", type=int, default=JOBS, help="replay the first N jobs")
    ap.add_argument(
        "--notebooks",
        type=Path,
        nargs="?",
        const=NOTEBOOKS,
        default=None,
        help="also hash the notebook replay (optional: its trace, JSON)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    for path in [args.trace] + ([args.notebooks] if args.notebooks else []):
        if not path.is_file():
            print(f"The trace {path} is missing: nothing was replayed.", file=sys.stderr)
            sys.exit(2)
    out = {"philly": philly_hashes(args.trace, args.jobs)}
    if args.notebooks:
        out["notebooks"] = notebook_hashes(args.notebooks)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"Philly, first {args.jobs} jobs, {INVENTORY}:")
    for policy, digest in out["philly"].items():
        print(f"  {policy:8} {digest}")
    for name, digest in out.get("notebooks", {}).items():
        print(f"  notebooks {name}: {digest}")


if __name__ == "__main__":
    main()
