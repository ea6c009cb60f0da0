"""What idle reclaim recovers on a production notebook trace, and what it costs.

Replays the NotebookOS trace of Adobe's notebook platform (59 sessions, 48 hours) through
the real broker and reclaimer (``jupyter_gpubroker.replay.notebooks``) under each policy,
on 144 and 64 GPUs in 8-GPU nodes, prints the table, writes the plot, and checks the
figures of every contention-free run against ``plain_count``: arithmetic on each
session's idle gaps (``replay.idle``, which the what-if cuts leases with) that shares no
code with the replay.

    python benchmarks/notebooks.py   # --trace PATH: the trace, --plot PATH: the PNG

``--check`` only compares with the plain count (exit 1 on a difference over 1%).
``--shares`` replays the shares policy (each kernel asks for the memory it used) beside
the whole-GPU ones, on 64 H100s and on an 8x RTX A6000 server without MIG.
``--band`` only replays the default settings under ``auto`` on each row of ``BAND``.
``--fit`` chooses the idle timeout on the trace's first day and checks it on the second
(``fit``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from jupyter_gpubroker.broker.reclaim import ReclaimConfig
from jupyter_gpubroker.replay import idle
from jupyter_gpubroker.replay import notebooks as nb
from jupyter_gpubroker.replay.notebook_figures import summarize
from jupyter_gpubroker.runtime.reclaim import SUSPEND_GRACE_S, SUSPEND_IDLE_TIMEOUT_S
from jupyter_gpubroker.wire.profiles import CATALOG

HERE = Path(__file__).resolve().parent
TRACE = HERE.parent.parent / "shared/data/traces/notebooks/adobe-sensei-june-1-2.json"
CLUSTERS = (144, 64)
SWEEP_MIN = (5, 15, 20, 30, 60, 120)
CULLER_S = 3600.0
"""jupyterhub-idle-culler as zero-to-jupyterhub deploys it (``cull.timeout``)."""
SUSPEND_GBPS = 64.0
"""Modelled suspend: one direction of a PCIe 5.0 x16 host link (NVIDIA gives the H100's
as 128 GB/s both ways). A real checkpoint or restore is slower: this is a bound."""
BAND = (
    ("bound: 64 GB/s", 0.0, SUSPEND_GBPS),
    ("CRIU: 31 GB in 12 s", 0.0, 31 / 12),
    ("cuda-checkpoint#29: 15 s a toggle", 15.0, SUSPEND_GBPS),
    ("both", 15.0, 31 / 12),
)
"""Suspend and restore times users may see, as (row, fixed s, GB/s): the link's bound;
a CRIU restore of a 31 GB vLLM process from disk in about 12 s (llmux's LOG.md); about
15 s a `cuda-checkpoint --toggle` per GPU on 8x H100 (NVIDIA/cuda-checkpoint#29, its
fill not stated), as a fixed cost; and both at once, the band's slow edge."""
AGREE = 0.01
FIT_MIN = (5, 10, 15, 20, 30, 45, 60, 90, 120)
LOST_PRICE_H = 2.0
"""What a kernel lost (shut down under a user who comes back) costs, in hours of its
GPUs: reloading, re-running the cells that built its state, the user's time. The trace
does not say; this is the choice the shipped default rests on (``PRICES_H``: others)."""
PRICES_H = (0.5, 1.0, 2.0, 4.0)
NEAR = 0.01
"""Timeouts whose cost is within this of the lowest count as tied; the longest wins."""
SHARE_CLUSTERS = {"64 H100 80GB": ("dgx-h100", 64), "8 RTX A6000 48GB": ("rtx-a6000-8", 8)}
"""Where shares are replayed: the 64-GPU cluster, and a lab server without MIG."""


def policies(shipped: ReclaimConfig | None = None) -> list[nb.Policy]:
    shipped = shipped or ReclaimConfig()
    sweep = [
        nb.Policy(
            f"broker {m} min" + (" (shipped)" if m * 60 == shipped.idle_timeout_s else ""),
            "reclaim",
            replace(shipped, idle_timeout_s=m * 60.0),
        )
        for m in SWEEP_MIN
    ]
    return [
        nb.Policy("whole session", "session"),
        nb.Policy(
            "HTTP idle culler 60 min",
            "reclaim",
            ReclaimConfig(idle_timeout_s=CULLER_S, grace_s=0.0, stalled_timeout_s=0.0),
            gpu_blind=True,
        ),
        *sweep,
        nb.Policy("on demand", "cell"),
        nb.Policy(
            f"suspend {shipped.idle_timeout_s / 60:g} min (simulated driver)",
            "reclaim",
            shipped,
            suspend_gbps=SUSPEND_GBPS,
        ),
    ]


def share_policies() -> list[nb.Policy]:
    """The shares policy held for the session, under the shipped idle reclaim and on
    demand, beside the same three for whole GPUs: like with like."""
    shipped = ReclaimConfig()
    broker = f"broker {shipped.idle_timeout_s / 60:g} min (shipped)"
    return [
        nb.Policy("whole session", "session"),
        nb.Policy(broker, "reclaim", shipped),
        nb.Policy("on demand", "cell"),
        nb.Policy("shares, whole session", "session", shares=True),
        nb.Policy(f"shares, {broker}", "reclaim", shipped, shares=True),
        nb.Policy("shares, on demand", "cell", shares=True),
    ]


def shares_run(path: Path) -> dict[str, list[tuple[nb.Policy, dict[str, float]]]]:
    sessions = nb.load(path)
    return {
        name: [
            (p, summarize(nb.replay(sessions, p, gpus=gpus, model=model))) for p in share_policies()
        ]
        for name, (model, gpus) in SHARE_CLUSTERS.items()
    }


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table, as benchmarks/README.md holds them."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])


def shares_table(results: dict[str, list[tuple[nb.Policy, dict[str, float]]]]) -> str:
    header = ["GPUs", "policy", "GPU-hours held", "held ÷ used", "started within 10 s",
              "kernels lost", "never got GPUs", "GPU cells never run"]  # fmt: skip
    rows = [
        [
            cluster,
            p.name,
            f"{f['held_gpu_h']:,.0f}",
            f"{f['held_ratio']:.2f}x",
            f"{f['within_10s_pct']:.1f}%",
            f"{f['lost']:.0f}",
            f"{f['never_granted']:.0f}",
            f"{f['cells_never_ran']:.0f}",
        ]  # fmt: skip
        for cluster, ps in results.items()
        for p, f in ps
    ]
    return markdown_table(header, rows)


def shipped_auto() -> ReclaimConfig:
    """The default reclaim where ``auto`` suspends: its shorter idle timeout and grace."""
    return ReclaimConfig(
        suspend_idle_timeout_s=SUSPEND_IDLE_TIMEOUT_S, suspend_grace_s=SUSPEND_GRACE_S
    )


def band(path: Path) -> dict[int, list[tuple[str, dict[str, float]]]]:
    """The default settings under ``auto`` (every GPU suspends) on each row of ``BAND``."""
    sessions = nb.load(path)
    results: dict[int, list[tuple[str, dict[str, float]]]] = {}
    for gpus in CLUSTERS:
        results[gpus] = []
        for name, fixed_s, gbps in BAND:
            policy = nb.Policy(
                name, "reclaim", shipped_auto(), suspend_gbps=gbps, suspend_fixed_s=fixed_s
            )
            results[gpus].append((name, summarize(nb.replay(sessions, policy, gpus=gpus))))
    return results


def band_table(results: dict[int, list[tuple[str, dict[str, float]]]]) -> str:
    header = ["GPUs", "suspend and restore", "held ÷ used", "kernels lost",
              "GPU cells within 10 s", "p95 wait", "GPU cells never run"]  # fmt: skip
    rows = [
        [
            str(gpus),
            name,
            f"{f['held_ratio']:.2f}x",
            f"{f['lost']:.0f}",
            f"{f['within_10s_pct']:.1f}%",
            _wait(f["wait_p95_s"]),
            f"{f['cells_never_ran']:.0f}",
        ]  # fmt: skip
        for gpus, named in results.items()
        for name, f in named
    ]
    return markdown_table(header, rows)


def plain_count(path: Path, limit_s: float | None, on_demand: bool = False) -> dict[str, float]:
    """Held GPU-hours ÷ cell GPU-hours and shutdowns with no contention, from the JSON
    alone: each session's cells (CPU-only ones too) as the busy spans of ``idle.holds``
    with ``limit_s`` (idle timeout + grace); ``None``: held from its start to its stop."""
    held = cells = 0.0
    shutdowns = lost = 0
    for s in json.loads(path.read_text())["sessions"]:
        trainings = sorted(s["trainings"], key=lambda t: t["start_tick"])
        gpus = max((t["gpus"] for t in trainings), default=0)
        if not gpus:
            continue
        busy = sum(60.0 * t["duration_in_ticks"] * t["gpus"] for t in trainings)
        cells += busy
        start, stop = 60.0 * s["start_tick"], 60.0 * s["stop_tick"]
        if on_demand or limit_s is None:
            held += busy if on_demand else gpus * (stop - start)
            continue
        spans = ((60.0 * t["start_tick"], 60.0 * t["end_tick"], bool(t["gpus"])) for t in trainings)
        found = idle.holds(start, stop, spans, limit_s)
        held += gpus * sum(b - a for a, b in found.spans)
        shutdowns, lost = shutdowns + found.shutdowns, lost + found.lost
    return {"held_ratio": held / cells, "shutdowns": shutdowns, "lost": lost}


def mig_fit(sessions: list[nb.Session]) -> dict[str, int]:
    """GPU sessions whose peak memory (the ``vram`` of their largest cell) fits a slice."""
    h100 = {p.name: p for p in CATALOG["H100-80GB"].profiles}
    gpu_sessions = [s for s in sessions if s.gpus]
    fit = {"sessions": len(gpu_sessions)}
    for name in ("1g.10gb", "3g.40gb"):
        gb = h100[name].memory_mib * 2**20 / 1000**3
        fit[name] = sum(1 for s in gpu_sessions if max(c.vram_gb for c in s.cells) <= gb)
    return fit


def run(path: Path) -> dict[int, list[tuple[nb.Policy, dict[str, float]]]]:
    sessions = nb.load(path)
    return {
        gpus: [(p, summarize(nb.replay(sessions, p, gpus=gpus))) for p in policies()]
        for gpus in CLUSTERS
    }


def check(path: Path, results: dict[int, list[tuple[nb.Policy, dict[str, float]]]]) -> list[str]:
    """Differences over 1% between the replay and the plain count, on every run of the
    count's kinds (whole session, on demand, a fixed timeout) where no GPU cell waited."""
    problems = []
    for gpus, rows in results.items():
        for p, f in rows:
            if p.modelled or f["no_wait_pct"] < 100 or f["never_granted"]:
                continue
            limit = None
            if p.reclaim is not None:
                limit = p.reclaim.idle_timeout_s + p.reclaim.grace_s
            plain = plain_count(path, limit, on_demand=p.hold == "cell")
            for key, want in plain.items():
                if abs(f[key] - want) > AGREE * max(abs(want), 1):
                    problems.append(f"{gpus} GPUs, {p.name}: {key} {f[key]:.4g}, plain {want:.4g}")
    return problems


Fit = dict[str, dict[int, list[tuple[int, dict[str, float]]]]]
AUTO_FIT_S = (120, 300, 600, 1200)
"""Idle timeouts ``--fit-auto`` tries for ``auto`` (grace as shipped)."""
AUTO_GOAL = (95.0, 10.0)
"""A timeout qualifies with at least 95% of GPU cells starting within 10 s, none lost."""


def auto_fit(path: Path, gpus: int = 64) -> dict[str, list[tuple[int, dict[str, float]]]]:
    """``auto`` on the band's slow edge with each of ``AUTO_FIT_S``, on each day."""
    _, fixed_s, gbps = BAND[-1]
    out = {}
    for day, sessions in days(nb.load(path)).items():
        out[day] = [
            (
                t,
                summarize(
                    nb.replay(
                        sessions,
                        nb.Policy(
                            f"auto {t} s",
                            "reclaim",
                            replace(shipped_auto(), suspend_idle_timeout_s=float(t)),
                            suspend_gbps=gbps,
                            suspend_fixed_s=fixed_s,
                        ),
                        gpus=gpus,
                    )
                ),
            )
            for t in AUTO_FIT_S
        ]
    return out


def auto_pick(rows: list[tuple[int, dict[str, float]]]) -> int:
    """Lowest held/used among timeouts that meet ``AUTO_GOAL`` with no kernel lost; where
    none does, the highest share of GPU cells within 10 s (the shorter timeout on a tie)."""
    good = [(f["held_ratio"], t) for t, f in rows if f["within_10s_pct"] >= AUTO_GOAL[0]
            and not f["lost"]]  # fmt: skip
    if good:
        return min(good)[1]
    return max(rows, key=lambda r: (r[1]["within_10s_pct"], -r[0]))[0]


def auto_fit_report(results: dict[str, list[tuple[int, dict[str, float]]]]) -> str:
    picked = auto_pick(results["day 1"])
    shipped = int(SUSPEND_IDLE_TIMEOUT_S)
    rows = [
        [
            day,
            f"{t} s"
            + (" (shipped)" if t == shipped else "")
            + (" (day 1 picks)" if t == picked else ""),
            f"{f['held_ratio']:.2f}x",
            f"{f['lost']:.0f}",
            f"{f['within_10s_pct']:.1f}%",
            f"{f['cells_never_ran']:.0f}",
        ]  # fmt: skip
        for day, rs in results.items()
        for t, f in rs
        if day == "day 1" or t in (picked, shipped)
    ]
    header = ["day", "idle timeout", "held ÷ used", "kernels lost", "GPU cells within 10 s",
              "GPU cells never run"]  # fmt: skip
    return markdown_table(header, rows) + f"\n\nDay 1 picks {picked} s; shipped {shipped} s."


def days(sessions: list[nb.Session]) -> dict[str, list[nb.Session]]:
    """Whole sessions by the day they start: the trace's first 24 hours, and the rest."""
    t0 = min(s.start_s for s in sessions)
    return {
        "day 1": [s for s in sessions if s.start_s < t0 + 86400],
        "day 2": [s for s in sessions if s.start_s >= t0 + 86400],
    }


def one_day(path: Path, day: int) -> Path:
    """A copy of the trace holding only the sessions that start on ``day`` (as ``days``),
    so every mode, the plain count too, reads one day."""
    data = json.loads(path.read_text())
    t0 = min(s["start_tick"] for s in data["sessions"])
    first = [s["start_tick"] * 60.0 < t0 * 60.0 + 86400 for s in data["sessions"]]
    data["sessions"] = [s for s, f in zip(data["sessions"], first, strict=True) if f == (day == 1)]
    out = Path(tempfile.mkdtemp()) / f"day{day}-{path.name}"
    out.write_text(json.dumps(data))
    return out


def cost(f: dict[str, float], price_h: float) -> float:
    """GPU-hours held plus ``price_h`` hours of each lost kernel's GPUs, per GPU-hour of
    cells: the figure the idle timeout is chosen to make smallest."""
    return f["held_ratio"] + price_h * f["lost_gpus"] / f["cell_gpu_h"]


def choose(rows: list[tuple[int, dict[str, float]]], price_h: float) -> int:
    """The longest timeout (minutes) whose cost is within ``NEAR`` of the lowest: where
    the trace cannot tell them apart, the one that shuts fewer kernels down."""
    costs = {m: cost(f, price_h) for m, f in rows}
    best = min(costs.values())
    return max(m for m, c in costs.items() if c <= best * (1 + NEAR))


def fit(path: Path) -> Fit:
    """The shipped reclaim with its idle timeout swept, on each day and cluster."""
    shipped = ReclaimConfig()
    return {
        day: {
            gpus: [
                (
                    m,
                    summarize(
                        nb.replay(
                            sessions,
                            nb.Policy(
                                f"{m} min", "reclaim", replace(shipped, idle_timeout_s=m * 60.0)
                            ),
                            gpus=gpus,
                        )
                    ),
                )
                for m in FIT_MIN
            ]
            for gpus in CLUSTERS
        }
        for day, sessions in days(nb.load(path)).items()
    }


def fit_report(results: Fit) -> str:
    """Both days' tables, the timeout day 1 chooses and how it does on day 2."""
    lines = [
        f"| day | GPUs | idle timeout | held ÷ cells | kernels shut down | lost | "
        f"cost ({LOST_PRICE_H:g} h a lost kernel) |",
        "|" + "---|" * 7,
    ]
    for day, clusters in results.items():
        for gpus, rows in clusters.items():
            for m, f in rows:
                lines.append(
                    f"| {day} | {gpus} | {m} min | {f['held_ratio']:.2f}x | "
                    f"{f['shutdowns']:.0f} | {f['lost']:.0f} | {cost(f, LOST_PRICE_H):.3f} |"
                )
    shipped = ReclaimConfig().idle_timeout_s / 60
    for price in PRICES_H:
        picked = choose(results["day 1"][CLUSTERS[0]], price)
        held_out = []
        for gpus, rows in results["day 2"].items():
            costs = {m: cost(f, price) for m, f in rows}
            best = min(costs, key=costs.__getitem__)
            held_out.append(
                f"{gpus} GPUs {costs[picked]:.3f} (its best {costs[best]:.3f} at {best} min, "
                f"{shipped:g} min {costs[shipped]:.3f})"
            )
        lines.append(
            f"\nA lost kernel at {price:g} h: day 1 ({CLUSTERS[0]} GPUs) chooses {picked} min; "
            f"its cost on day 2: " + "; ".join(held_out)
        )
    return "\n".join(lines)


def _wait(s: float) -> str:
    return f"{s / 60:.0f} min" if s >= 60 else f"{s:.1f} s" if s else "0"


def table(results: dict[int, list[tuple[nb.Policy, dict[str, float]]]]) -> str:
    head = (
        "| GPUs | policy | held ÷ cells | no wait | p50 wait | p95 wait | kernels shut down "
        "(sessions) | lost | never got GPUs | GPU cells never run |"
    )
    lines = [head, "|" + "---|" * 10]
    for gpus, rows in results.items():
        for p, f in rows:
            shut = f"{f['shutdowns']:.0f} ({f['sessions_shut']:.0f})"
            if p.modelled:
                shut = f"0 ({f['suspends']:.0f} suspends)"
            lines.append(
                f"| {gpus} | {p.name} | {f['held_ratio']:.2f}x | {f['no_wait_pct']:.1f}% | "
                f"{_wait(f['wait_p50_s'])} | {_wait(f['wait_p95_s'])} | {shut} | "
                f"{f['lost']:.0f} | {f['never_granted']:.0f} | {f['cells_never_ran']:.0f} |"
            )
    return "\n".join(lines)


def plot(results: dict[int, list[tuple[nb.Policy, dict[str, float]]]], out: Path) -> None:
    import matplotlib  # only here: the tests and --check run without it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 5), sharey=True)
    for gpus, marker in zip(results, "os", strict=False):
        rows = results[gpus]
        for ax, key, scale in ((axes[0], "shutdowns", 1), (axes[1], "wait_p95_s", 1)):
            xs = [f[key] / scale for _, f in rows]
            ys = [f["held_ratio"] for _, f in rows]
            ax.scatter(xs, ys, marker=marker, label=f"{gpus} GPUs")
            for (p, _), x, y in zip(rows, xs, ys, strict=True):
                ax.annotate(p.name, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    axes[0].set_xlabel("kernels shut down (suspend: simulated driver)")
    axes[1].set_xlabel("p95 wait at a GPU cell's start (seconds)")
    axes[0].set_ylabel("GPU-hours held ÷ GPU-hours of cells")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("Notebook trace (Adobe, NotebookOS): what each policy holds and what it costs")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, default=TRACE, help="the notebook trace (JSON)")
    ap.add_argument("--plot", type=Path, default=HERE / "notebooks.png", help="PNG to write")
    ap.add_argument("--check", action="store_true", help="only compare with the plain count")
    ap.add_argument("--fit", action="store_true", help="only choose the idle timeout")
    ap.add_argument("--shares", action="store_true", help="only the shares policy's table")
    ap.add_argument("--band", action="store_true", help="only the suspend band, as shipped")
    ap.add_argument(
        "--fit-auto", action="store_true", help="only choose auto's idle timeout on day 1"
    )
    ap.add_argument(
        "--day", type=int, choices=(1, 2), help="replay only sessions starting that day"
    )
    args = ap.parse_args()
    if args.day:
        args.trace = one_day(args.trace, args.day)
    if args.fit_auto:
        print(auto_fit_report(auto_fit(args.trace)))
        return
    if args.band:
        print(band_table(band(args.trace)))
        return
    if args.fit:
        print(fit_report(fit(args.trace)))
        return
    if args.shares:
        print(shares_table(shares_run(args.trace)))
        return
    results = run(args.trace)
    problems = check(args.trace, results)
    if not args.check:
        print(table(results))
        mig: dict[str, Any] = mig_fit(nb.load(args.trace))
        print(
            f"\nPeak GPU memory of the {mig['sessions']} GPU sessions: {mig['1g.10gb']} fit a "
            f"1g.10gb slice, {mig['3g.40gb']} a 3g.40gb one.\nSuspend runs the product's path on "
            "the simulated checkpoint driver; its copies are modelled: "
            f"{SUSPEND_GBPS:g} GB/s each way (PCIe 5.0 x16), a bound on cuda-checkpoint."
        )
        plot(results, args.plot)
        print(f"plot: {args.plot}")
    for p in problems:
        print(f"differs from the plain count: {p}", file=sys.stderr)
    print("plain count: " + ("differs" if problems else "agrees within 1%"))
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
