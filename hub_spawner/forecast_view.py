"""The admin page's forecast: the API's ``forecast`` as rows of the page's one bar chart
(``macros.chart``), each hour's band from its p50 to its p90 with what happened marked on
it, and how far the forecast held in past weeks, in words."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from jupyter_gpubroker.wire.text import gpus, sentence

DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def band_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per recent hour: its forecast band (p50 to p90) and the demand it had, in %
    of the largest of them all, as ``macros.chart`` draws them."""
    by_hour = {h["hour_of_week"]: h["demand"] for h in data["hours"]}
    recent = data.get("recent", [])
    top = max([max(by_hour[r["hour_of_week"]]["p90"], r["demand"]) for r in recent], default=0.0)
    top = top or 1.0
    rows = []
    for r in recent:
        band = by_hour[r["hour_of_week"]]
        at = datetime.fromisoformat(r["at"])
        rows.append(
            {
                "key": f"{DAYS[at.weekday()]} {at:%H}:00",
                "value": band["p90"],
                "pct": 100.0 * band["p90"] / top,
                "low_pct": 100.0 * band["p50"] / top,
                "mark_pct": 100.0 * r["demand"] / top,
                "text": gpus(r["demand"]),
                "title": f"forecast {gpus(band['p50'])} to {gpus(band['p90'])}, "
                f"and {gpus(r['demand'])} asked",
            }
        )
    return rows


def trust_text(data: dict[str, Any]) -> str:
    """How far the forecast held over the weeks it was checked on, in a sentence (or the
    forecast's own message while it has not been checked)."""
    tests = data["backtest"]
    if not tests:
        return sentence(data["message"])
    hours = sum(t["hours"] for t in tests)
    error = sum(t["mean_abs_error"] * t["hours"] for t in tests) / hours
    actual = sum(t["mean_actual"] * t["hours"] for t in tests) / hours
    covered = sum(t["p90_covered"] * t["hours"] for t in tests) / hours
    weeks = "the last week" if len(tests) == 1 else f"the last {len(tests)} weeks"
    if error > 0:
        share = f" ({error / actual:.0%} of the demand)" if error >= 0.005 * actual else ""
        off = f"was off by {gpus(error)} an hour on average{share}"
    else:
        off = "was never off"
    return (
        f"Over {weeks}, each forecast from the weeks before it alone, the p50 {off}, and "
        f"demand stayed at or under the p90 in {covered:.0%} of hours."
    )


def forecast_view(data: dict[str, Any]) -> dict[str, Any]:
    """What the admin page's forecast section shows."""
    return {
        "ready": data["ready"],
        "message": sentence(data["message"]),
        "rows": band_rows(data) if data["ready"] else [],
        "trust": trust_text(data) if data["ready"] else "",
        "acting": [sentence(a["text"]) for a in data.get("acting", [])],
    }
