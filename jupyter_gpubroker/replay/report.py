"""Render replay summaries: a text table with one column per policy, or JSON.

The CLI prints one policy's column; the benchmark prints three side by side
with the same function, as Markdown, so the two can never disagree.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

Row = tuple[str, Callable[[dict[str, Any]], Any], str]
"""(label, value of a summary, format): ``s`` seconds, ``%`` share, ``n`` count, ``f`` 3 digits."""

ROWS: tuple[Row, ...] = (
    ("jobs", lambda s: s["jobs"], "n"),
    ("mean wait", lambda s: s["mean_wait_s"], "s"),
    ("median wait", lambda s: s["median_wait_s"], "s"),
    ("p95 wait", lambda s: s["p95_wait_s"], "s"),
    ("max wait", lambda s: s["max_wait_s"], "s"),
    ("interactive mean wait", lambda s: _cls(s, "interactive", "mean_wait_s"), "s"),
    ("interactive p95 wait", lambda s: _cls(s, "interactive", "p95_wait_s"), "s"),
    ("batch mean wait", lambda s: _cls(s, "batch", "mean_wait_s"), "s"),
    ("batch p95 wait", lambda s: _cls(s, "batch", "p95_wait_s"), "s"),
    ("mean JCT", lambda s: s["mean_jct_s"], "s"),
    ("utilization, busy period", lambda s: s["utilization_busy"], "%"),
    ("utilization, queue non-empty", lambda s: s["utilization_queued"], "%"),
    ("fragmentation, queue non-empty", lambda s: s["fragmentation"], "%"),
    ("Jain's index (tenants)", lambda s: s["jain"], "f"),
    ("starved (wait > threshold)", lambda s: s["starved"], "n"),
    ("ended at their declared limit", lambda s: s.get("cut_at_limit"), "n"),
    ("extended at their declared limit", lambda s: s.get("extended_at_limit"), "n"),
    ("ETA median relative error", lambda s: _eta(s, "median_rel_error"), "f"),
    ("ETA 80% range coverage", lambda s: _eta(s, "coverage"), "%"),
    ("ETA unknown", lambda s: _eta(s, "unknown"), "n"),
    ("ETA with a promised start", lambda s: _eta(s, "bounded"), "%"),
    ("promised start kept", lambda s: _eta(s, "bound_held"), "%"),
    ("squeue --start median rel. error", lambda s: _eta(s, "squeue_median_rel_error"), "f"),
    ("CPU ms per decision", lambda s: s["cpu_ms_per_decision"], "f"),
    ("replay wall time", lambda s: s["wall_s"], "w"),
)


def header(s: dict[str, Any]) -> list[str]:
    """What was replayed, on what, and what of it is synthetic."""
    skipped = ", ".join(f"{n:,} {why}" for why, n in s["skipped"].items()) or "none"
    lines = [
        f"trace:     {s['trace']} ({s['jobs']:,} GPU jobs replayed; skipped: {skipped})",
        f"inventory: {s['inventory']} ({s['gpus']} GPUs, dynamic MIG "
        f"{'on' if s['dynamic_mig'] else 'off'}); time compression x{s['compress']:g} "
        "(submit gaps divided, durations kept)",
        f"starved:   waits over {s['starve_after_s'] / 3600:g} h; tenants for Jain: {s['tenants']}",
    ]
    lines += [f"note:      {n}" for n in s["notes"]]
    return lines


def table(summaries: Sequence[dict[str, Any]], markdown: bool = False) -> str:
    """The header of the first summary, then one column per summary (policy)."""
    head = ["metric", *(s["policy"] for s in summaries)]
    rows = [head] + [
        [label, *(_fmt(value(s), kind) for s in summaries)]
        for label, value, kind in ROWS
        if any(not _missing(value(s)) for s in summaries)
    ]
    if markdown:
        lines = ["| " + " | ".join(r) + " |" for r in rows]
        lines.insert(1, "|" + "|".join(["---"] + ["---:"] * len(summaries)) + "|")
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    body = [
        "  ".join(
            [r[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True))]
        )
        for r in rows
    ]
    return "\n".join([*header(summaries[0]), "", *body])


def json_ready(value: Any) -> Any:
    """NaN (a figure over an empty set, e.g. waits of a class with no jobs) becomes null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_ready(v) for v in value]
    return value


def _cls(s: dict[str, Any], job_class: str, key: str) -> Any:
    return s["by_class"].get(job_class, {}).get(key)


def _eta(s: dict[str, Any], key: str) -> Any:
    return s.get("eta", {}).get("all", {}).get(key)


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _fmt(v: Any, kind: str) -> str:
    if _missing(v):
        return "-"
    if kind == "s":
        return f"{v:,.0f} s"
    if kind == "%":
        return f"{100 * v:.1f}%"
    if kind == "n":
        return f"{v:,}"
    if kind == "w":
        return f"{v:.1f} s"
    return f"{v:.3f}"
