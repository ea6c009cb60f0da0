"""The admin page's "What if": the API's ``whatif`` state as the page says it: the replay
running now, and the last one's figures as a small table beside what really happened,
with what changed and what it did in sentences, and its days as two of the page's bar
charts (``macros.chart``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date
from typing import Any

from jupyter_gpubroker.wire.text import duration, gpu_hours

COLUMNS = {
    "recorded": "What really happened",
    "replayed": "Replayed as it was",
    "what_if": "Replayed with the change",
}


def _count(n: int | None) -> str:
    return "not replayed" if n is None else f"{n:,}"


def _times(x: float | None) -> str:
    return "not recorded" if x is None else f"{x:.2f} times"


ROWS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("requests", "Requests granted", _count),
    ("mean_wait_s", "Mean wait", duration),
    ("p95_wait_s", "Wait that 95 in 100 stayed under", duration),
    ("gpu_hours_held", "GPU-hours held", gpu_hours),
    ("held_over_used", "Held for each GPU-hour kernels were busy", _times),
    ("kernels_lost", "Kernels lost (reclaimed)", _count),
    ("kernels_suspended", "Kernels suspended when idle", _count),
    ("refused", "Refused (too large for the machine or a quota)", _count),
    ("cost", "Cost", lambda c: f"{c:,.2f}"),
)


def _gpus(n: int) -> str:
    many = "GPU" if abs(n) == 1 else "GPUs"
    return f"{n} more {many}" if n > 0 else f"{-n} {many} fewer"


CHANGES: dict[str, Callable[[Any], str]] = {
    "gpus": _gpus,
    "machine": lambda m: f"a {m} machine instead",
    "policy": lambda p: f"the {p} policy",
    "dynamic_mig": lambda on: "MIG re-cutting " + ("on" if on else "off"),
    "quotas": lambda q: "other quotas and shares",
    "windows": lambda w: "other time-of-day windows",
    "timezone": lambda tz: f"windows read in {tz}",
    "prices_if": lambda p: "other prices",
    "idle_timeout": lambda s: f"an idle timeout of {duration(s)}" if s else "no idle reclaim",
    "grace": lambda s: f"a grace of {duration(s)}",
    "reclaim_action": lambda a: "idle kernels " + ("suspended" if a == "suspend" else "shut down"),
}
"""Each field of a what-if as a phrase (any other: its name and value)."""


def _named(name: str, value: Any) -> str:
    """A field with no phrase of its own: "idle timeout 10 min", "reclaim action suspend"."""
    if name.endswith("_s") and isinstance(value, (int, float)):
        return f"{name[:-2].replace('_', ' ')} {duration(value)}"
    return f"{name.replace('_', ' ')} {value}"


def changes_text(asked: dict[str, Any]) -> str:
    """What a what-if changed, as the end of "With ...": "4 more GPUs and the fcfs policy"."""
    said = [
        CHANGES[name](value) if name in CHANGES else _named(name, value)
        for name, value in asked.items()
        if name != "prices" and value not in (None, []) and not (name == "gpus" and value == 0)
    ]
    return " and ".join(", ".join(said).rsplit(", ", 1)) if said else ""


def result_text(done: dict[str, Any]) -> list[str]:
    """The last what-if's outcome in sentences."""
    real, again = done["recorded"], done["replayed"]
    fidelity = (
        f"Replayed as it was, the {done['requests']:,} recorded requests waited "
        f"{duration(again['mean_wait_s'])} on average, against "
        f"{duration(real['mean_wait_s'])} in fact: that is how closely the replay follows "
        "this broker."
    )
    lines = []
    change = changes_text(done["asked"])
    if "what_if" in done and change:
        then = done["what_if"]
        most = (
            f"95 in 100 requests would have waited under {duration(then['p95_wait_s'])} "
            f"instead of {duration(again['p95_wait_s'])}"
            if then["max_wait_s"] > 0
            else "no request would have waited at all"
        )
        lines.append(
            f"With {change}, the mean wait would have been {duration(then['mean_wait_s'])} "
            f"instead of {duration(again['mean_wait_s'])}, and {most}."
        )
    else:
        lines.append("Nothing was changed: the replay as it was stands beside what happened.")
    lines.append(fidelity)
    if done["left_out"]:
        lines.append(
            f"{done['left_out']:,} request(s) never granted are left out: they held nothing."
        )
    return lines


def table(done: dict[str, Any]) -> dict[str, Any]:
    """The figures of each run, one column each, rows as the page names them (cost only
    where there were prices)."""
    runs = [r for r in COLUMNS if r in done]
    rows = [
        {"label": label, "cells": [say(done[r][key]) for r in runs]}
        for key, label, say in ROWS
        if key != "cost" or any(done[r]["cost"] is not None for r in runs)
    ]
    return {"columns": [COLUMNS[r] for r in runs], "rows": rows}


PLOT_DAYS = 31
"""The most days the charts show: the last month of the replayed history."""

BARS = {"what_if": "with the change", "replayed": "replayed as it was"}
"""What a chart's bars are: the what-if where something changed, else the plain replay."""


def _day(iso: str) -> str:
    d = date.fromisoformat(iso)
    return f"{d:%a} {d.day} {d:%b}"


def plot(done: dict[str, Any]) -> dict[str, Any]:
    """Each day's mean wait and GPU-hours held as ``macros.chart`` rows: the bar the run
    of ``BARS``, the mark what really happened that day; the last ``PLOT_DAYS`` days."""
    bar = "what_if" if "what_if" in done else "replayed"
    real = {d["day"]: d for d in done["recorded"]["days"]}
    days = done[bar]["days"][-PLOT_DAYS:]
    charts: dict[str, Any] = {"bar": BARS[bar], "days": len(done[bar]["days"]), "shown": len(days)}
    for key, say in (("mean_wait_s", duration), ("gpu_hours_held", gpu_hours)):
        facts = [real.get(d["day"], {}).get(key, 0.0) for d in days]
        top = max([d[key] for d in days] + facts, default=0.0) or 1.0
        charts[key] = [
            {
                "key": _day(d["day"]),
                "value": d[key],
                "pct": 100.0 * d[key] / top,
                "mark_pct": 100.0 * fact / top,
                "text": say(d[key]),
                "title": f"{say(d[key])} {BARS[bar]}, {say(fact)} in fact",
            }
            for d, fact in zip(days, facts, strict=True)
        ]
    return charts


def whatif_view(state: dict[str, Any], now: float) -> dict[str, Any]:
    """What the admin page's What if section shows (``looked``: when, in whole seconds)."""
    running, done = state["running"], state["last"]
    progress = ""
    if running is not None:
        n = running["requests"]
        progress = (
            f"Replaying {n:,} recorded requests…"
            if n is not None
            else "Reading the recorded requests…"
        )
    view: dict[str, Any] = {
        "progress": progress,
        "policies": state["policies"],
        "looked": int(now),
        "asked": {},
    }
    if done is not None and "error" in done:
        view["error"] = f"The last what-if could not run: {done['error']}."
    elif done is not None:
        view.update(by=done["by"], at=done["at"], lines=result_text(done), table=table(done))
        view["plot"] = plot(done)
    if done is not None:
        view["asked"] = done["asked"]  # the form shows what was asked last
    return view
