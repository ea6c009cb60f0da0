"""``jupyter gpubroker replay``: its arguments and command (the CLI module adds it)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from datetime import date
from pathlib import Path
from typing import Any

from ..broker.policy import POLICIES
from ..wire.errors import InvalidRequest
from . import DEFAULT_COMPRESS, DEFAULT_INVENTORY, DEFAULT_USERS, FORMATS, STARVE_AFTER_S
from .driver import replay
from .limits import LIMIT_MODELS, declare
from .metrics import summarize
from .report import json_ready, table
from .traces import TraceError, load


def add_replay(p: argparse.ArgumentParser) -> None:
    """The ``jupyter gpubroker replay`` command's options (its help is the CLI's)."""
    p.description = (
        "Replay a trace through the real broker core on a virtual clock (no "
        "sleeping) and print wait, utilization, fairness and cost figures. Formats: openb "
        "(Alibaba GPU-sharing pods), philly (Microsoft Philly jobs), generic (CSV with "
        "submit_s, duration_s, gpus and optional user, group, class)."
    )
    p.add_argument("--trace", required=True, metavar="FILE", help="the trace CSV file")
    p.add_argument("--format", choices=FORMATS, default="generic", help="default: generic")
    p.add_argument("--policy", choices=tuple(POLICIES), default="broker", help="default: broker")
    p.add_argument(
        "--inventory",
        metavar="TOPOLOGY",
        help="the simulated machine: a preset with :N GPUs or a topology file "
        f"(default per format: {_per_format(DEFAULT_INVENTORY)})",
    )
    p.add_argument(
        "--compress",
        type=float,
        metavar="X",
        help="divide the gaps between submissions by X, keeping durations "
        f"(default per format: {_per_format(DEFAULT_COMPRESS)})",
    )
    p.add_argument(
        "--users",
        type=int,
        default=DEFAULT_USERS,
        metavar="N",
        help="synthetic users for jobs the trace gives none (openb; generic without a user "
        f"column), by a hash of the job's resource template (default {DEFAULT_USERS})",
    )
    p.add_argument("--limit", type=int, metavar="N", help="replay only the first N jobs")
    p.add_argument(
        "--static-mig",
        action="store_true",
        help="never re-cut MIG GPUs (default: idle MIG GPUs are re-cut for every policy)",
    )
    p.add_argument(
        "--starve-after",
        type=float,
        default=STARVE_AFTER_S / 3600,
        metavar="HOURS",
        help="a wait longer than this counts as starved (default %(default)g)",
    )
    p.add_argument(
        "--eta-every",
        type=float,
        metavar="MINUTES",
        help="measure the start estimates: ask them at each job's submission and every "
        "MINUTES while it waits, and report their error against the real starts",
    )
    p.add_argument(
        "--limits",
        choices=LIMIT_MODELS,
        help="give every job a declared run-time limit, as Slurm's --time: exact (its run "
        "time), tsafrir (round values users pick, after Tsafrir, Etsion and Feitelson 2005) "
        "or loose (that model twice as loose); backfill and squeue --start plan with it and "
        "a job past its limit ends at it (default: none, each job states its run time)",
    )
    p.add_argument(
        "--limits-seed",
        type=int,
        default=0,
        metavar="N",
        help="the seed of the limit model's draws (default %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_replay)


def _per_format(defaults: dict[str, Any]) -> str:
    return ", ".join(f"{fmt} {value}" for fmt, value in defaults.items())


def cmd_replay(args: argparse.Namespace) -> int:
    try:
        trace = load(args.trace, args.format, args.users)
    except TraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.limit is not None:
        trace = trace.head(args.limit)
    if args.limits is not None:
        trace = declare(trace, args.limits, args.limits_seed)
    compress = args.compress if args.compress is not None else DEFAULT_COMPRESS[args.format]
    if not compress > 0 or any(v is not None and not v > 0 for v in (args.limit, args.eta_every)):
        print("error: --compress, --limit and --eta-every must be positive", file=sys.stderr)
        return 2
    run = replay(
        trace,
        args.policy,
        inventory=args.inventory or DEFAULT_INVENTORY[args.format],
        compress=compress,
        dynamic_mig=not args.static_mig,
        eta_every_s=args.eta_every * 60 if args.eta_every is not None else None,
    )
    summary = summarize(run, args.starve_after * 3600)
    if args.json:
        print(json.dumps(json_ready(summary), allow_nan=False))
    else:
        print(table([summary]))
    return 0


def add_whatif(p: argparse.ArgumentParser) -> None:
    """The ``jupyter gpubroker whatif`` command's options."""
    p.description = (
        "Replay the requests a broker's state file recorded through the real broker core, "
        "each holding its lease as long as it did, on the machine the file recorded: once "
        "as it was and once with the settings below changed. Prints waits, GPU-hours held "
        "and held over used, kernels lost and cost beside what really happened. Another idle "
        "timeout, grace or reclaim action cuts each lease at its kernel's recorded busy "
        "periods: a lease idle longer ends earlier, and the rest of its work asks again."
    )
    p.add_argument("--state", required=True, type=Path, help="the broker's state file")
    p.add_argument(
        "--gpus", type=int, default=0, metavar="N", help="add N GPUs (take away: -N) like the last"
    )
    p.add_argument(
        "--machine",
        metavar="TOPOLOGY",
        help="another machine: a preset with :N GPUs (and the machine of a file that "
        "recorded none)",
    )
    p.add_argument(
        "--policy", choices=tuple(POLICIES), help="another ordering policy (default: as recorded)"
    )
    p.add_argument(
        "--quota",
        action="append",
        default=[],
        metavar="KIND:NAME:FIELD=VALUE",
        help="a quota or share, e.g. user:alice:max_gpus=2 or group:lab:share=3 (repeatable)",
    )
    p.add_argument("--static-mig", action="store_true", help="never re-cut MIG GPUs")
    p.add_argument(
        "--windows",
        type=Path,
        help="a YAML or JSON file of time-of-day windows of the broker policy, as "
        "c.GPUBroker.windows: [{name: day, start: '08:00', end: '19:00', days: mon-fri, "
        "weights: {interactive: 2000, batch: 0}}]",
    )
    p.add_argument("--timezone", help="time zone of the windows (IANA name; default: as recorded)")
    p.add_argument(
        "--idle-timeout",
        type=float,
        metavar="SECONDS",
        help="another idle timeout, as c.GPUBroker.idle_timeout (0: no idle reclaim); it "
        "and --grace stand for the suspend's own timeout and grace too",
    )
    p.add_argument(
        "--grace",
        type=float,
        metavar="SECONDS",
        help="another time between the idle warning and the reclaim, as c.GPUBroker.grace",
    )
    p.add_argument(
        "--reclaim-action",
        metavar="ACTION",
        help="shutdown or suspend, as c.GPUBroker.reclaim_action (a suspend loses no kernel; "
        "MIG slices and shares are shut down)",
    )
    p.add_argument("--prices", type=Path, help="a prices file (as usage --prices) for the cost")
    p.add_argument(
        "--prices-if", type=Path, help="other prices for the what-if's cost (default: --prices)"
    )
    p.add_argument(
        "--plot",
        type=Path,
        metavar="PNG",
        help="also draw each day's mean wait and GPU-hours held, each run a line, into this "
        "PNG file (needs matplotlib)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_whatif)


def cmd_whatif(args: argparse.Namespace) -> int:
    import time

    from ..offline import load_prices
    from .whatif import Variation, compare, history, parse_quota, read_windows

    if not args.state.exists():
        raise InvalidRequest(f"no broker state file at {args.state}")
    if args.plot is not None:
        _plot_target(args.plot)  # refused before the replay, not after it
    variation = Variation(
        gpus=args.gpus,
        machine=args.machine,
        policy=args.policy,
        windows=read_windows(args.windows) if args.windows else None,
        timezone=args.timezone,
        quotas=tuple(parse_quota(q) for q in args.quota),
        dynamic_mig=False if args.static_mig else None,
        idle_timeout=args.idle_timeout,
        grace=args.grace,
        reclaim_action=args.reclaim_action,
    )
    prices = load_prices(args.prices) if args.prices else None
    prices_if = load_prices(args.prices_if) if args.prices_if else None
    found = history(args.state, time.time(), args.machine)
    result = compare(found, variation, prices, prices_if)
    if args.plot is not None:
        whatif_plot(result, args.plot)
    if args.json:
        print(json.dumps({**result, "left_out": found.left_out}, allow_nan=False))
        return 0
    print(whatif_table(result))
    if args.plot is not None:
        print(f"The plot of each day is in {args.plot}.")
    if not found.seen:
        print("The file records no kernel's busy periods: held over used is not known.")
    if found.left_out:
        print(f"{found.left_out} request(s) never granted are left out: they held nothing.")
    return 0


RUNS = {"recorded": "what happened", "replayed": "replayed", "what_if": "what if"}
"""Each run of a what-if as the command names it."""


def _plot_target(path: Path) -> None:
    """Refuse a plot that cannot be drawn or written, in a sentence."""
    if importlib.util.find_spec("matplotlib") is None:
        raise InvalidRequest(
            "--plot needs matplotlib, which is not installed here: pip install matplotlib"
        )
    if path.suffix.lower() != ".png":
        raise InvalidRequest(f"--plot writes a PNG file: name it .png, not {path.name}")
    if not path.parent.is_dir():
        raise InvalidRequest(f"--plot cannot write {path}: there is no folder {path.parent}")


def whatif_plot(result: dict[str, dict[str, Any]], path: Path) -> None:
    """Each day's mean wait and GPU-hours held, one line per run, in a PNG file."""
    import matplotlib  # only here: the command runs without it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (waits, held) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for run, name in RUNS.items():
        days = result.get(run, {}).get("days", [])
        at = [date.fromisoformat(d["day"]) for d in days]
        waits.plot(at, [d["mean_wait_s"] / 60 for d in days], marker=".", label=name)
        held.plot(at, [d["gpu_hours_held"] for d in days], marker=".", label=name)
    waits.set_ylabel("mean wait (min)")
    held.set_ylabel("GPU-hours held")
    waits.legend()
    waits.set_title("Each day, by the day a request was made (waits) or held (GPU-hours)")
    fig.autofmt_xdate()
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=100)
    except OSError as e:
        raise InvalidRequest(f"--plot cannot write {path}: {e.strerror or e}") from None
    finally:
        plt.close(fig)


def whatif_table(result: dict[str, dict[str, Any]]) -> str:
    """The figures side by side, one column per run."""
    cols = list(result)
    rows = [("", *(RUNS[c] for c in cols))]
    said = {
        "requests": ("requests granted", "{:.0f}"),
        "mean_wait_s": ("mean wait (s)", "{:.1f}"),
        "p95_wait_s": ("p95 wait (s)", "{:.1f}"),
        "max_wait_s": ("longest wait (s)", "{:.1f}"),
        "gpu_hours_held": ("GPU-hours held", "{:.2f}"),
        "held_over_used": ("held over used (kernels seen)", "{:.2f}"),
        "kernels_lost": ("kernels lost", "{:.0f}"),
        "kernels_suspended": ("kernels suspended", "{:.0f}"),
        "cost": ("cost", "{:.2f}"),
        "refused": ("refused (no machine or quota allows)", "{:.0f}"),
    }
    for key, (label, fmt) in said.items():
        values = [result[c][key] for c in cols]
        rows.append((label, *("-" if v is None else fmt.format(v) for v in values)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
    return "\n".join(line.rstrip() for line in lines)
