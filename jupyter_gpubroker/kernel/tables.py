"""The ``%gpu queue`` table and the ``%gpu usage`` chart: widgets that list, each with
the same rows as text (see ``widgets``)."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from ipywidgets import HTML
from traitlets import Float, Int

from ..wire.text import duration, eta_text, gpu_hours, size_text
from .session import PLACE, Session
from .widgets import CARD, GpuWidget, bar, esc, table_row, when

# ------------------------------------------------------------------------ the queue


QUEUE_HEADER = ("#", "user", "class", "size", "waiting", "ETA")


def queue_rows(queue: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    now = time.time()
    return [
        (
            str(e["position"]),
            e["user"] + (" (you)" if e.get("mine") else ""),
            e["job_class"],
            size_text(e),
            duration(now - when(e["submitted_at"])),
            eta_text(e),
        )
        for e in queue
    ]


def queue_text(queue: list[dict[str, Any]]) -> str:
    if not queue:
        return "The GPU queue is empty."
    rows = [QUEUE_HEADER, *queue_rows(queue)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(QUEUE_HEADER))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return f"GPU queue: {len(queue)} waiting\n" + "\n".join(line.rstrip() for line in lines)


def queue_html(queue: list[dict[str, Any]]) -> str:
    if not queue:
        return f'<div style="{CARD}">The GPU queue is empty.</div>'
    cell = "padding:2px 10px 2px 0;text-align:left"
    head = "".join(f'<th style="{cell}">{esc(h)}</th>' for h in QUEUE_HEADER)
    body = "".join(
        f'<tr style="font-weight:{600 if e.get("mine") else 400}">'
        + "".join(f'<td style="{cell}">{esc(c)}</td>' for c in row)
        + "</tr>"
        for e, row in zip(queue, queue_rows(queue), strict=True)
    )
    return (
        f'<div style="{CARD}"><div style="font-weight:600">GPU queue: {len(queue)} waiting'
        f'</div><table style="border-collapse:collapse"><tr>{head}</tr>{body}</table></div>'
    )


class QueueTable(GpuWidget):
    """The whole queue, as the events bring it: a user's stream sends the whole queue with
    each ``positions``; a kernel token's sends its own requests' places only, which move
    in place (the rest as the table was read)."""

    length = Int().tag(sync=True)

    def __init__(self, session: Session, queue: list[dict[str, Any]]) -> None:
        self.session, self.queue = session, queue
        self._html = HTML()
        super().__init__(children=[self._html])
        self._show(queue)
        self._stops.append(session.feed.subscribe(self._on_event))

    def text(self) -> str:
        return queue_text(self.queue)

    async def _on_event(self, event: dict[str, Any]) -> None:
        if event["type"] not in ("hello", "positions"):
            return
        data = event["data"]
        if "queue" in data:
            self._show(data["queue"])
            return
        moved = {r["id"]: r for r in data["requests"]}
        self._show(
            [
                {**e, **{k: moved[e["id"]].get(k) for k in PLACE if k != "place"}}
                if e.get("id") in moved
                else e
                for e in self.queue
            ]
        )

    def _show(self, queue: list[dict[str, Any]]) -> None:
        self.queue = queue
        with self.hold_sync():
            self.length = len(queue)
            self._html.value = queue_html(queue)


# ------------------------------------------------------------------------- my usage


USAGE_SCALE_MIN_H = 1.0
"""The GPU-hours a full usage bar stands for at least (one GPU for an hour), so that a
few minutes on a slice draw as a sliver, not as a full bar."""


def usage_rows(days: list[dict[str, Any]]) -> list[tuple[str, float]]:
    return [(datetime.fromisoformat(d["date"]).strftime("%a %d %b"), d["gpu_hours"]) for d in days]


def usage_scale(days: list[dict[str, Any]]) -> float:
    """The GPU-hours of a full bar: the busiest day's, or :data:`USAGE_SCALE_MIN_H`."""
    return max([USAGE_SCALE_MIN_H, *(float(d["gpu_hours"]) for d in days)])


def usage_text(days: list[dict[str, Any]]) -> str:
    top = usage_scale(days)
    rows = usage_rows(days)
    lines = [f"{day}  {'█' * round(20 * h / top):<20}  {gpu_hours(h)}" for day, h in rows]
    total = sum(d["gpu_hours"] for d in days)
    return f"My GPU-hours, last {len(days)} days: {gpu_hours(total)}\n" + "\n".join(lines)


def usage_html(days: list[dict[str, Any]]) -> str:
    top = usage_scale(days)
    rows = "".join(
        table_row(day, bar(100 * h / top, "var(--jp-brand-color1,#1976d2)", False), gpu_hours(h))
        for day, h in usage_rows(days)
    )
    total = sum(d["gpu_hours"] for d in days)
    return (
        f'<div style="{CARD}"><div style="font-weight:600">My GPU-hours, last {len(days)} '
        f'days: {gpu_hours(total)}</div><table style="border-collapse:collapse">{rows}</table>'
        "</div>"
    )


class UsageChart(GpuWidget):
    """My GPU-hours per day, as bars."""

    total = Float().tag(sync=True)

    def __init__(self, days: list[dict[str, Any]]) -> None:
        self.days = days
        super().__init__(children=[HTML(usage_html(days))])
        self.total = sum(d["gpu_hours"] for d in days)

    def text(self) -> str:
        return usage_text(self.days)
