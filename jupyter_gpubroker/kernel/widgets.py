"""The ``%gpu`` widgets: plain ipywidgets (no JavaScript of ours), each with a text form.

A widget is a ``VBox`` of HTML, plus synced traits that state in data what the HTML
shows, so a frontend or a test reads the model's state instead of scraping markup.
Updates arrive on the runner's thread (ipywidgets sends from any thread); ``close()``
stops them. Where there are no widgets (terminal IPython, ``nbconvert``), the
``text/plain`` of a widget's display bundle carries the same facts as text; both forms
are built from the same rows.
"""

from __future__ import annotations

import concurrent.futures
import html
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ipywidgets import HTML, Button, VBox
from traitlets import Dict, Float, Int, List, Unicode

from ..client import NOTICES
from ..wire.text import (
    EXTEND_BY_S,
    EXTEND_LABEL,
    count,
    duration,
    eta_text,
    gigabytes,
    limit_reason,
    limit_until,
    memory,
    reclaim_warning,
    sentence,
    size_text,
)
from ..wire.text import clock as wall_clock
from .feed import TRANSIENT, why
from .session import Activity, Session, Tracker

USER_NOTICES = ("outside_use",)
"""Events about this kernel's user, on no request, that the status widget shows."""
SUSPENSION_ENDED = "suspension_ended"
"""The event of a suspended kernel's lease once it is suspended no more, with why."""
HISTORY = 40
"""Readings kept for a status widget's sparkline."""
WAITING_HINT = "The cell waits for the grant; interrupt the kernel (■) to withdraw the request."
COLORS = {"queued": "#e6a700", "granted": "#2e9d4f"}
"""Status dot by request state; ended requests are grey."""
CARD = (
    "border:1px solid var(--jp-border-color2,#ccc);border-radius:6px;padding:8px 12px;"
    "font-family:var(--jp-ui-font-family,sans-serif);font-size:13px;"
    "color:var(--jp-ui-font-color1,#222);max-width:680px"
)
MUTED = "color:var(--jp-ui-font-color2,#666)"


class GpuWidget(VBox):
    """A VBox whose live updates end with it, and whose text/plain form says what it shows."""

    closed = False
    """Set by ``close()``: a reply that arrives after it changes nothing."""

    def __init__(self, **kwargs: Any) -> None:
        self._stops: list[Callable[[], None]] = []
        super().__init__(**kwargs)

    def text(self) -> str:
        raise NotImplementedError

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any] | None:
        bundle: dict[str, Any] | None = super()._repr_mimebundle_(**kwargs)
        if bundle is not None:
            bundle["text/plain"] = self.text()
        return bundle

    def close(self) -> None:
        self.closed = True
        while self._stops:
            self._stops.pop()()
        super().close()


# -------------------------------------------------------------- this kernel's request


@dataclass(frozen=True)
class Held:
    """A held device with its latest readings, as the status widget shows it."""

    uuid: str
    label: str
    memory_mib: int
    used_mib: int | None
    utilization: float | None
    mig: bool
    temperature_c: float | None
    """The device's, or its GPU's for a MIG slice (NVML reads it per GPU)."""
    shared: bool = False
    """A share of the GPU: its memory is the share's, its use and utilization the share's
    processes'."""

    @property
    def utilization_text(self) -> str:
        if self.utilization is not None:
            return f"{self.utilization:.0f}%"
        return "n/a on MIG" if self.mig else "n/a"

    @property
    def memory_text(self) -> str:
        used = "?" if self.used_mib is None else gigabytes(self.used_mib)
        return f"{used} / {memory(self.memory_mib)}"

    @property
    def temperature_text(self) -> str:
        return "n/a" if self.temperature_c is None else f"{self.temperature_c:.0f} °C"

    def memory_percent(self) -> float | None:
        return None if self.used_mib is None else 100 * self.used_mib / max(self.memory_mib, 1)

    def load(self) -> float | None:
        """What the sparkline follows: utilization, or memory use where NVML hides it."""
        return self.utilization if self.utilization is not None else self.memory_percent()

    def reading(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "utilization_gpu": self.utilization,
            "memory_used_mib": self.used_mib,
            "temperature_c": self.temperature_c,
        }

    def headline(self) -> str:
        """The device and its memory; a MIG slice's label names its profile already."""
        name = (
            self.label
            if self.mig
            else f"{self.label} ({'a share' if self.shared else 'whole GPU'})"
        )
        return f"{name}, {memory(self.memory_mib)}"


def held_devices(tracker: Tracker, gpus: list[dict[str, Any]]) -> list[Held]:
    """The devices a granted request holds, with their readings from a ``GET devices``
    reply (none while it waits or once it ended)."""
    lease = tracker.lease
    if tracker.state != "granted" or lease is None:
        return []
    share = lease.get("share")
    if share:  # the GPU's memory, use and load are its shares' together: show this one's
        g = next((g for g in gpus if g["uuid"] in lease["devices"]), {})
        return [
            Held(
                uuid=lease["devices"][0],
                label=share["gpu"],
                memory_mib=share["memory_mib"],
                used_mib=share.get("used_mib"),
                utilization=share.get("utilization"),
                mig=False,
                temperature_c=g.get("temperature_c"),
                shared=True,
            )
        ]
    return [
        Held(
            uuid=d["uuid"],
            label=d["label"],
            memory_mib=d["memory_mib"],
            used_mib=d.get("memory_used_mib"),
            utilization=d.get("utilization_gpu"),
            mig=d["kind"] == "mig",
            temperature_c=d["temperature_c"]
            if d.get("temperature_c") is not None
            else g.get("temperature_c"),
        )
        for g in gpus
        for d in g["devices"]
        if d["uuid"] in lease["devices"]
    ]


def with_readings(gpus: list[dict[str, Any]], readings: dict[str, Any]) -> list[dict[str, Any]]:
    """A ``GET devices`` reply with a ``readings`` event's newer readings (by UUID) in
    place: a new list, so a reader on another thread never sees one half-updated."""
    return [
        {
            **g,
            **readings.get(g["uuid"], {}),
            "devices": [{**d, **readings.get(d["uuid"], {})} for d in g["devices"]],
        }
        for g in gpus
    ]


def request_facts(tracker: Tracker, activity: Activity) -> tuple[str, list[str]]:
    """A request's headline and detail lines (the devices' readings aside)."""
    r = tracker.request
    size = f"{size_text(r)} ({r['job_class']})"
    if tracker.state == "queued":
        ahead = ", ".join(f"{n} {cls}" for cls, n in sorted(tracker.ahead.items())) or "none"
        title = f"Waiting for {size}: position {r.get('position')} of {tracker.queue_length}"
        if r.get("held_back"):  # it says when it starts: no estimate from the queue
            return title, [f"{sentence(r['held_back'])} Ahead: {ahead}."]
        return title, [f"ETA {eta_text(r)} · ahead: {ahead}"]
    lease = tracker.lease
    if tracker.state == "granted" and lease is not None:
        granted_at = when(lease["granted_at"])
        details = f"held {duration(time.time() - granted_at)} · {activity.text(granted_at)}"
        if lease.get("share"):
            details = f"{lease['share']['text']} · {details}"
        if lease.get("ends_at"):
            details += f" · {limit_until(when(lease['ends_at']))}"
        warning = limit_warning(tracker)
        if warning:
            return f"Holding {size}", [details, warning]
        if lease.get("reclaim_at") and lease.get("reclaim_cause") != "time_limit":
            details += f" · reclaimed at {clock(lease['reclaim_at'])} unless used"
        return f"Holding {size}", [details]
    if lease is not None and lease.get("suspended"):
        return f"{size}: {lease['suspended']['text']}", [lease["reason"]]
    reason = lease["reason"] if lease is not None and lease.get("reason") else r.get("reason")
    return f"{size}: {tracker.state}", [reason] if reason else []


def limit_warning(tracker: Tracker) -> str:
    """The lease's time-limit warning in words, while one is pending ("" otherwise)."""
    w, lease = tracker.warning, tracker.lease
    if (
        w is None
        and lease is not None
        and lease.get("reclaim_cause") == "time_limit"
        and when(lease["reclaim_at"]) >= when(lease["ends_at"])  # not since extended
    ):  # warned before this widget listened: the lease says so, the event is gone
        end = when(lease["ends_at"])
        reason = limit_reason(when(lease["granted_at"]), end, time.time())
        w = {"cause": "time_limit", "reason": reason, "deadline": lease["reclaim_at"]}
    if tracker.state != "granted" or w is None or w.get("cause") != "time_limit":
        return ""
    return "⚠ " + sentence(reclaim_warning(w["reason"], when(w["deadline"]), "time_limit"))


def request_text(tracker: Tracker, activity: Activity, held: list[Held]) -> str:
    title, lines = request_facts(tracker, activity)
    devices = [
        f"{h.headline()} ({h.uuid})\n  utilization {h.utilization_text} · memory "
        f"{h.memory_text} · {h.temperature_text}"
        for h in held
    ]
    if tracker.lease and tracker.state == "granted" and not held:
        devices = [", ".join(tracker.lease["devices"])]
    return "\n".join([title, *devices, *lines])


def request_html(
    tracker: Tracker, activity: Activity, held: list[Held], history: Iterable[float], note: str
) -> str:
    title, lines = request_facts(tracker, activity)
    dot = f'<span style="color:{COLORS.get(tracker.state, "#999")}">●</span>'
    rows = "".join(
        f'<tr><td colspan="3" style="padding-top:6px"><b>{esc(h.headline())}</b>'
        f'<div style="{MUTED};font-size:11px">{esc(h.uuid)}</div></td></tr>'
        + table_row("utilization", bar(h.utilization), h.utilization_text)
        + table_row("memory", bar(h.memory_percent()), h.memory_text)
        + table_row("temperature", "", h.temperature_text)
        for h in held
    )
    if held:
        followed = "utilization" if any(h.utilization is not None for h in held) else "memory"
        rows += table_row(f"{followed}, recent", sparkline(list(history)), "")
    return (
        f'<div style="{CARD}"><div style="font-weight:600">{dot} {esc(title)}</div>'
        f'<table style="border-collapse:collapse">{rows}</table>'
        + "".join(f'<div style="{MUTED}">{esc(line)}</div>' for line in [*lines, note] if line)
        + "</div>"
    )


class RequestPanel(GpuWidget):
    """This kernel's request: its place in the queue, then the lease's live readings.

    Follows the tracker (grant, end) and the event feed: the held devices are read once
    (``GET devices``, for their names and sizes) when it shows a grant and again after
    the feed (re)connects; the ``readings`` the stream brings every few seconds update
    them in place, and the session's clock redraws it while granted (time held, idle
    time, and a sample of the load for the sparkline). The Cancel button shows while
    queued if the kernel is free to handle its click (``%gpu request --no-wait``; a
    waiting cell is withdrawn by interrupting the kernel). Its time limit's end shows while
    granted; its warning, with an Extend button (an hour more), while pending: a refusal
    shows the broker's reason.
    """

    state = Unicode().tag(sync=True)
    position = Int(None, allow_none=True).tag(sync=True)
    eta = Unicode(None, allow_none=True).tag(sync=True)
    ahead = Dict().tag(sync=True)
    devices = List(Unicode()).tag(sync=True)
    readings = List(Dict()).tag(sync=True)
    ends_at = Unicode(None, allow_none=True).tag(sync=True)
    """When the lease's time limit ends (the API's time; None: no limit)."""
    limit_warning = Unicode("").tag(sync=True)
    """The time limit's pending warning, as shown."""

    def __init__(
        self, tracker: Tracker, activity: Activity, *, cancellable: bool, gpus: list[Any]
    ) -> None:
        """``gpus``: a ``GET devices`` reply (empty unless granted), so the first view is
        complete."""
        self.tracker, self.activity, self.cancellable = tracker, activity, cancellable
        self._gpus = gpus
        lease = tracker.lease
        self._read_for = lease["id"] if gpus and tracker.state == "granted" and lease else None
        """The lease whose devices ``_gpus`` holds since the feed's last (re)connect."""
        self._history: deque[float] = deque(maxlen=HISTORY)
        self._note = ""
        self._reading_share: concurrent.futures.Future[None] | None = None
        self._lock = threading.RLock()
        self._stop_clock: Callable[[], None] | None = None
        self._html = HTML()
        self.button = Button(description="Cancel request", icon="times", button_style="warning")
        self.button.on_click(self._cancel)
        self.extend_button = Button(
            description=EXTEND_LABEL,
            icon="clock-o",
            button_style="primary",
        )
        self.extend_button.on_click(self._extend)
        super().__init__(children=[self._html, self.extend_button, self.button])
        self._stops += [
            tracker.watch(self._update),
            lambda: self._follow_clock(False),
            self.session.feed.subscribe(self._on_event),
        ]
        self._update()

    @property
    def session(self) -> Session:
        return self.tracker.session

    def text(self) -> str:
        return request_text(self.tracker, self.activity, held_devices(self.tracker, self._gpus))

    def _update(self) -> None:
        with self._lock:  # the kernel's thread and the runner's both update it
            self._render()

    def _render(self) -> None:
        t, held = self.tracker, held_devices(self.tracker, self._gpus)
        waiting = t.state == "queued"
        lease = t.lease if t.state == "granted" else None
        if lease is not None and lease["id"] != self._read_for:  # a grant: name its devices
            self._read_for = lease["id"]
            self.session.runner.submit(self._read_devices())
        self._follow_clock(lease is not None)
        warning = limit_warning(t)  # its button first: a reader that sees the warning sees it
        self.extend_button.layout.display = None if warning else "none"
        with self.hold_sync():
            self.state = t.state
            self.position = t.request.get("position") if waiting else None
            self.eta = t.request.get("eta") if waiting else None
            self.ahead = dict(t.ahead) if waiting else {}
            self.devices = list(lease["devices"]) if lease else []
            self.readings = [h.reading() for h in held]
            self.ends_at = lease.get("ends_at") if lease else None
            self.limit_warning = warning
            note = self._note or (WAITING_HINT if waiting and not self.cancellable else "")
            self._html.value = request_html(t, self.activity, held, self._history, note)
        self.button.layout.display = None if waiting and self.cancellable else "none"

    def _follow_clock(self, on: bool) -> None:
        with self._lock:
            if on and self._stop_clock is None:
                self._stop_clock = self.session.clock.subscribe(self._on_tick)
            elif not on and self._stop_clock is not None:
                self._stop_clock()
                self._stop_clock = None

    async def _on_tick(self, _: float) -> None:
        with self._lock:
            loads = [h.load() for h in held_devices(self.tracker, self._gpus)]
            known = [x for x in loads if x is not None]
            if known:
                self._history.append(sum(known) / len(known))
            self._update()

    async def _read_devices(self) -> None:
        try:
            gpus = await self.session.client.devices()
        except TRANSIENT as e:  # the held devices show by UUID until the next try
            self.session.log.info("GPU broker: could not read the devices: %s", why(e))
            return
        with self._lock:
            if not self.closed:
                self._gpus = gpus
                self._update()

    def _read_share(self, changed: dict[str, Any]) -> None:
        """A share's memory in use and utilization are its own processes', which no
        reading of its GPU carries: when that GPU's reading changes, its request (and
        lease) is read again, one read at a time."""
        lease = self.tracker.lease if self.tracker.state == "granted" else None
        if not lease or not lease.get("share") or lease["devices"][0] not in changed:
            return
        if self._reading_share is None or self._reading_share.done():
            self._reading_share = self.session.runner.submit(self._refresh_share())

    async def _refresh_share(self) -> None:
        try:
            await self.tracker.refresh()
        except TRANSIENT as e:  # the last use shows until the GPU's next reading
            self.session.log.info("GPU broker: could not read the share's use: %s", why(e))

    async def _on_event(self, event: dict[str, Any]) -> None:
        """The devices' readings and, from a user's stream, the devices as a whole; after
        a (re)connect, the devices read again; a notice about this kernel's user on no
        request (its process using a GPU outside the broker, with
        ``c.GPUBroker.outside_use = "warn"``), or that its request's promised start
        cannot be kept, shown in full."""
        kind, data = event["type"], event["data"]
        with self._lock:
            if kind == "readings":
                self._gpus = with_readings(self._gpus, data["devices"])
                self._read_share(data["devices"])
            elif kind == "devices":
                self._gpus = data["gpus"]
            elif kind == "connected":
                self._read_for = None
            elif kind in USER_NOTICES and data.get("message"):
                self._note = data["message"]
            elif kind == SUSPENSION_ENDED and data.get("request_id") == self.tracker.id:
                self.tracker.update(data["request"])  # its lease: suspended no more, and why
                return
            elif kind in NOTICES and data.get("request_id") == self.tracker.id:
                self._note = data["message"]  # a broken promise; the new one comes with positions
            else:
                return
            self._update()

    def _extend(self, _: Button) -> None:
        try:
            self.session.extend(self.tracker, EXTEND_BY_S)
        except TRANSIENT as e:  # the broker's reason: a promised start, the class's limits
            self._note = why(e)
        else:
            self._note = ""
        self._update()

    def _cancel(self, _: Button) -> None:
        try:
            self.session.withdraw(self.tracker)
        except TRANSIENT as e:
            self._note = f"could not cancel: {why(e)}"
            self._update()


# ------------------------------------------------------------- a suspended kernel


def suspended_text(lease: dict[str, Any], ended: str | None) -> str:
    """A suspended kernel's lease as ``%gpu status`` shows it; ``ended``: why it is
    suspended no more."""
    if ended is not None:
        return f"This kernel is suspended no more: {ended}."
    n = count(len(lease["devices"]), "GPU")
    return (
        f"This kernel is {lease['suspended']['text']}.\n"
        f"It held {', '.join(lease['devices'])}; its next cell asks for {n} again and waits "
        "in the queue like any request."
    )


class SuspendedPanel(GpuWidget):
    """This kernel while it is suspended: its GPU memory on the host; and why it is
    suspended no more once it is not (resumed, its memory lost), from the event feed."""

    state = Unicode("suspended").tag(sync=True)
    host_mib = Float(None, allow_none=True).tag(sync=True)

    def __init__(self, session: Session, lease: dict[str, Any]) -> None:
        self.lease = lease
        self.ended: str | None = None
        self._html = HTML()
        super().__init__(children=[self._html])
        self._stops.append(session.feed.subscribe(self._on_event))
        self._render()

    def text(self) -> str:
        return suspended_text(self.lease, self.ended)

    def _render(self) -> None:
        title, *lines = self.text().split("\n")
        dot = '<span style="color:#999">●</span>'
        with self.hold_sync():
            self.state = "suspended" if self.ended is None else "ended"
            self.host_mib = None if self.ended else self.lease["suspended"]["host_mib"]
            self._html.value = (
                f'<div style="{CARD}"><div style="font-weight:600">{dot} {esc(title)}</div>'
                + "".join(f'<div style="{MUTED}">{esc(line)}</div>' for line in lines)
                + "</div>"
            )

    async def _on_event(self, event: dict[str, Any]) -> None:
        data = event["data"]
        if event["type"] == SUSPENSION_ENDED and data.get("lease_id") == self.lease["id"]:
            self.ended = data["reason"]
            self._render()


# -------------------------------------------------------------------------- helpers


def when(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def clock(iso: str) -> str:
    """An API time as local wall-clock time."""
    return wall_clock(when(iso))


def esc(text: str) -> str:
    return html.escape(text, quote=False)


def table_row(label: str, graphic: str, value: str) -> str:
    cell = "padding:1px 10px 1px 0"
    return (
        f'<tr><td style="{cell};{MUTED}">{esc(label)}</td><td style="{cell}">{graphic}</td>'
        f'<td style="{cell}">{esc(value)}</td></tr>'
    )


def bar(percent: float | None, color: str = "#2e9d4f", track: bool = True) -> str:
    """A horizontal bar filled to ``percent`` (nothing if unknown) on a grey track, or
    on none (``track``: a chart's bars, where a grey track reads as a bar of its own)."""
    if percent is None:
        return ""
    fill = max(0.0, min(100.0, percent))
    behind = "var(--jp-layout-color3,#e0e0e0)" if track else "transparent"
    return (
        '<div style="display:inline-block;width:160px;height:10px;border-radius:3px;'
        f'vertical-align:middle;background:{behind}">'
        f'<div style="width:{fill:.1f}%;height:100%;border-radius:3px;background:{color}">'
        "</div></div>"
    )


def sparkline(values: list[float], width: int = 160, height: int = 26) -> str:
    """An inline SVG line of percentages (0-100), oldest left."""
    if len(values) < 2:
        return f'<span style="{MUTED}">collecting readings…</span>'
    step = width / (HISTORY - 1)
    x0 = width - step * (len(values) - 1)
    points = " ".join(
        f"{x0 + i * step:.1f},{height - 2 - (height - 4) * max(0.0, min(100.0, v)) / 100:.1f}"
        for i, v in enumerate(values)
    )
    return (
        f'<svg width="{width}" height="{height}" style="vertical-align:middle">'
        f'<rect width="{width}" height="{height}" rx="3" fill="var(--jp-layout-color2,#f3f3f3)"/>'
        f'<polyline points="{points}" fill="none" stroke="#2e9d4f" stroke-width="1.5"/></svg>'
    )
