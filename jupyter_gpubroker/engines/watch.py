"""The broker under an engine (Slurm, Kubernetes): the engine's view read every tick
and applied (``apply_view``), and whether the engine answers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tornado.ioloop import PeriodicCallback

from ..broker.core import Broker
from ..inventory import InventoryWatch
from ..wire.errors import InvalidRequest
from . import ClusterView, EngineUnavailable, InventorySource, apply_view, release_ended


def read_now(source: InventorySource) -> ClusterView:
    """The engine's first view, read before the broker exists (whether or not an event
    loop runs on this thread): on a thread of its own."""
    with ThreadPoolExecutor(1) as pool:
        try:
            return pool.submit(asyncio.run, source.read()).result()
        except EngineUnavailable as e:
            raise InvalidRequest(f"{e}: the broker starts once it answers") from None


class EngineWatch(InventoryWatch):
    """Reads ``source`` and makes ``core`` respect it; ``down`` is (since, why) while the
    engine does not answer, its last view standing meanwhile. ``grace_s`` says the
    current ``engine_grace`` (a setting that may change while the broker runs)."""

    def __init__(
        self,
        source: InventorySource,
        core: Broker,
        grace_s: Callable[[], float],
        log: logging.Logger,
    ) -> None:
        self.source: InventorySource = source
        self.core, self.grace_s, self.log = core, grace_s, log
        self.down: tuple[float, str] | None = None
        self.read_from: str | None = None
        """What the last view was read from, where the engine says (``ClusterView.source``)."""
        self._polling: PeriodicCallback | None = None
        self._stopped = False

    def start(self, interval_s: float) -> None:
        """Poll every ``interval_s`` on the current IOLoop."""
        self._polling = PeriodicCallback(self.poll, interval_s * 1000)
        self._polling.start()

    def stop(self) -> None:
        self._stopped = True
        if self._polling is not None:
            self._polling.stop()

    async def poll(self) -> None:
        """Read the engine and apply its view, then run ``after_poll``; an engine that does
        not answer leaves the queue and the last view as they are, and ``down`` says since
        when and why."""
        try:
            view = await self.source.read()
        except EngineUnavailable as e:
            if self.down is None:
                self.log.warning("GPU broker: %s; the queue is kept", e)
                self.down = (self.core.clock.now(), str(e))
            return
        if self._stopped:
            return  # stopped meanwhile: the store may be closed
        if self.down is not None:
            self.log.info("GPU broker: %s answers again", self.source.name)
            self.down = None
        try:
            self.apply(view)
        except Exception:
            self.log.exception("GPU broker: applying the %s view failed", self.source.name)
            return
        if self.after_poll is not None:
            try:
                await self.after_poll()
            except Exception:
                self.log.exception("GPU broker: acting on %s ahead failed", self.source.name)

    def apply(self, view: ClusterView) -> None:
        if self.read_from and view.source and view.source != self.read_from:
            self.log.info(
                "GPU broker: the %s inventory is now read from %s", self.source.name, view.source
            )
        self.read_from = view.source or None
        added = apply_view(self.core, view)
        for node in sorted({d.node for d in added}):
            count = sum(d.node == node for d in added)
            self.log.info("GPU broker: %d devices on %s joined the inventory", count, node)
        work = f"{self.source.name.capitalize()} {self.source.work}"
        for lease_id in release_ended(self.core, view, self.grace_s(), work):
            self.log.info("GPU broker: lease %s released: its %s ended", lease_id, work)

    def state(self) -> dict[str, Any]:
        """The engine's name, what it reads the inventory from, and whether it answers
        (since when it does not, and why)."""
        since, why = self.down or (None, None)
        return {
            "name": self.source.name,
            "source": self.read_from,
            "reachable": since is None,
            "since": since,
            "error": why,
        }
