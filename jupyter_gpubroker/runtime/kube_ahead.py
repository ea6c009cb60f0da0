"""GPUs kept warm on Kubernetes ahead of the forecast (``c.GPUBroker.kube_ahead``, off by
default). While the forecast's p90 of this hour and the next exceeds the GPU-equivalents
held and waited for now, the engine keeps the difference warm (``OpenInventory.warm``:
placeholder pods, ``engines.kube_placeholders``); once it no longer does (the trough), they
are deleted. A placeholder takes nothing from a holder or a grant: a GPU server's pod
preempts it, and the inventory counts its GPU free. What they keep warm is capped at
``kube_ahead_max_gpu_hours`` a day (UTC): once the day's are spent, none until the next.

Each placeholder made, deleted, or found gone (preempted, or deleted by someone else) is
audited with its reason and the GPU-hours the ended ones kept that day, which a restarted
broker reads back, so a restart does not reset the cap."""

from __future__ import annotations

import asyncio
import logging
import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tornado.ioloop import PeriodicCallback
from traitlets import Bool

from ..broker.core import Broker
from ..broker.forecast import DAY_S, HOUR_S
from ..inventory import CapacityRefused, Warm, WarmCapacity
from ..wire.text import count, gpus
from ..wire.traits import Number
from .forecasting import ACTOR, REPLAN_S, ActsAhead, acting_line, p90_ahead

EVERY_S = 30.0
"""Seconds between passes: a preempted placeholder is made again within this."""
MAX_ADD = 16
"""Placeholders made in one pass at most (one API call each)."""
MADE, DELETED, GONE = "kube_placeholder_create", "kube_placeholder_delete", "kube_placeholder_gone"
GONE_REASON = (
    "it is gone: the scheduler preempted it for a pod of higher priority, or it was deleted"
)
HEAD = "GPUs kept warm on Kubernetes ahead of the forecast"


def _hours(w: Warm, day: float, end: float) -> float:
    """The GPU-hours ``w`` kept from ``day`` (its start) to ``end``."""
    return w.gpus * max(0.0, end - max(w.since, day)) / HOUR_S


def asked_now(core: Broker) -> float:
    """GPU-equivalents held and waited for now."""
    held = sum(x.gpu_equivalents for x in core.leases())
    return held + sum(core.scheduler.gpu_eq(r.size) for r in core.book.waiting)


class KubeAhead(ActsAhead):
    kube_ahead = Bool(
        False,
        help="On Kubernetes, before the hours whose forecast p90 exceeds what is held and "
        "waited for, keep the difference warm with low-priority placeholder pods (the "
        "cluster-autoscaler overprovisioning recipe), and delete them in the trough. GPU "
        "servers preempt them. Each change is audited with its reason.",
    ).tag(config=True)
    kube_ahead_max_gpu_hours = Number(
        24.0,
        0.0,
        1e6,
        help="The GPU-hours placeholder pods may keep warm in a day (midnight to midnight "
        "UTC), from each one's creation to its end, placed or waiting; once they are spent, "
        "none is made until the next day.",
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.warm: WarmCapacity | None = None
        """The engine's means to keep capacity warm (None: it has none)."""
        self.kept_warm: dict[str, Warm] = {}
        self._warm_closed: tuple[float, float] | None = None
        """(a day's start, the GPU-hours kept that day by the placeholders that ended)."""
        self._warm_refused: tuple[float, str] | None = None
        self._warm_listed = False
        self._warm_checked = False
        self._warm_busy = False
        self._warm_ticker: PeriodicCallback | None = None

    def kube_ahead_state(self, core: Broker) -> dict[str, Any] | None:
        """Whether it acts, as the admin page says it (None: neither on nor on Kubernetes)."""
        if self.warm is None and not self.kube_ahead:
            return None
        cap, spent = self.kube_ahead_max_gpu_hours, self.spent_today(core.clock.now())
        why_not = (
            "only a broker on Kubernetes can keep GPUs warm"
            if self.warm is None
            else self._warm_refused[1]
            if self._warm_refused is not None
            else f"today's {cap:g} GPU-hours are spent (more from midnight UTC)"
            if spent >= cap
            else None
        )
        now = count(sum(w.gpus for w in self.kept_warm.values()), "GPU")
        doing = f"on, {now} kept warm now, {spent:.1f} of {cap:g} GPU-hours today"
        return acting_line("kube_ahead", HEAD, self.kube_ahead, why_not, doing)

    def spent_today(self, now: float) -> float:
        """The GPU-hours placeholders kept warm since midnight UTC."""
        day = now // DAY_S * DAY_S
        closed = self._warm_closed[1] if self._warm_closed and self._warm_closed[0] == day else 0.0
        return closed + sum(_hours(w, day, now) for w in self.kept_warm.values())

    # ------------------------------------------------------------------ passes

    def start_keeping_warm(self, core: Broker, log: logging.Logger) -> None:
        """A pass every ``EVERY_S`` on the current IOLoop, where the engine has the means."""
        if self.warm is not None:
            self._warm_ticker = PeriodicCallback(lambda: self.keep_warm(core, log), EVERY_S * 1e3)
            self._warm_ticker.start()

    async def keep_warm(self, core: Broker, log: logging.Logger) -> None:
        """One pass: note the placeholders gone, then make or delete them to the target. An
        engine that refuses is asked again after ``REPLAN_S``, and its refusal is the state
        until it lets the broker act (``WarmCapacity.check``)."""
        warm, now = self.warm, core.clock.now()
        if warm is None or not self._due(now):
            return
        self._warm_busy = True
        try:
            if self.kube_ahead and (self._warm_refused is not None or not self._warm_checked):
                await warm.check()  # a refusal stands until the engine lets it act
                self._warm_checked = True
            await self._pass(core, warm, now)
        except CapacityRefused as e:
            self._warm_refusal(now, str(e), log)
        else:
            self._warm_refused = None
        finally:
            self._warm_busy = False

    def _due(self, now: float) -> bool:
        """Whether a pass is due: on, or placeholders left to delete, or a first look for
        those a broker that ended without stopping left; a refusal is asked again later."""
        needed = self.kube_ahead or self.kept_warm or not self._warm_listed
        refused = self._warm_refused is not None and now - self._warm_refused[0] < REPLAN_S
        return bool(needed) and not refused and not self._warm_busy

    def _warm_refusal(self, now: float, why: str, log: logging.Logger) -> None:
        """The engine refused: said once while on; off, the first look is given up."""
        if not self.kube_ahead:
            self._warm_listed = True
            return
        if self._warm_refused is None or self._warm_refused[1] != why:
            log.warning("GPU broker: no GPUs kept warm on Kubernetes: %s", why)
        self._warm_refused = (now, why)

    async def _pass(self, core: Broker, warm: WarmCapacity, now: float) -> None:
        kept = {w.name: w for w in await warm.kept()}
        if not self._warm_listed:
            self._warm_listed = True
            self._read_back(core, now)
        for name in self.kept_warm.keys() - kept.keys():
            self._ended(core, self.kept_warm[name], now, GONE, GONE_REASON)
        self.kept_warm = kept
        target, reason = self._target(core, now)
        have = sum(w.gpus for w in kept.values())
        # the waiting ones first, which keep nothing yet; then the newest
        for w in sorted(kept.values(), key=lambda w: (w.node is not None, -w.since)):
            if have - w.gpus < target:
                break
            await warm.remove(w.name)
            del self.kept_warm[w.name]
            have -= w.gpus
            self._ended(core, w, now, DELETED, reason)
        for _ in range(min(max(0, target - have), MAX_ADD)):
            made = await warm.add(now)
            self.kept_warm[made.name] = made
            detail = {"gpus": made.gpus, "reason": reason}
            self.audit_ahead(core, MADE, made.name, detail)

    def _target(self, core: Broker, now: float) -> tuple[int, str]:
        """The GPUs to keep warm now, and why."""
        cap = self.kube_ahead_max_gpu_hours
        if not self.kube_ahead:
            return 0, "kube_ahead is off"
        if self.spent_today(now) >= cap:
            return 0, f"today's {cap:g} GPU-hours kept warm are spent"
        ahead = p90_ahead(self.read_forecast(core, now), now)
        if ahead is None:
            return 0, "the forecast has not a day of history yet"
        p90, said = ahead
        asked = asked_now(core)
        n = max(0, math.ceil(p90 - asked - 1e-9))
        return n, f"{said}; {gpus(asked)} held or waited for now, so {count(n, 'GPU')} kept warm"

    def _ended(self, core: Broker, w: Warm, now: float, action: str, reason: str) -> None:
        """A placeholder deleted or gone: its GPU-hours today counted, and audited."""
        day = now // DAY_S * DAY_S
        closed = self._warm_closed[1] if self._warm_closed and self._warm_closed[0] == day else 0.0
        self._warm_closed = (day, closed + _hours(w, day, now))
        detail = {
            "gpus": w.gpus,
            "node": w.node,
            "gpu_hours": round(w.gpus * (now - w.since) / HOUR_S, 4),
            "ended_gpu_hours_today": self._warm_closed[1],
            "reason": reason,
        }
        self.audit_ahead(core, action, w.name, detail)

    def _read_back(self, core: Broker, now: float) -> None:
        """The GPU-hours the placeholders that ended today kept, from the audit log."""
        day, after, closed = now // DAY_S * DAY_S, 0, 0.0
        while rows := core.store.audit(since=day, actor=ACTOR, after=after, limit=500):
            for row in rows:
                if row["action"] in (DELETED, GONE):
                    closed = float(row["detail"].get("ended_gpu_hours_today", closed))
            after = rows[-1]["id"]
        self._warm_closed = (day, closed)

    def stop_keeping_warm(self, core: Broker, log: logging.Logger) -> None:
        """The broker stops: no more passes, and its placeholders deleted (on a thread of
        their own, whether or not an event loop runs here), each audited."""
        if self._warm_ticker is not None:
            self._warm_ticker.stop()
        warm, names = self.warm, list(self.kept_warm)
        if warm is None or not names:
            return

        async def remove() -> list[str]:
            done: list[str] = []
            try:
                for name in names:
                    await warm.remove(name)
                    done.append(name)
            except CapacityRefused as e:
                log.warning("GPU broker: placeholder pods left on Kubernetes: %s", e)
            return done

        with ThreadPoolExecutor(1) as pool:
            removed = pool.submit(asyncio.run, remove()).result()
        now = core.clock.now()
        for name in removed:
            self._ended(core, self.kept_warm.pop(name), now, DELETED, "the broker stops")
