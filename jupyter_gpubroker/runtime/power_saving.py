"""Power limits that follow the forecast (``c.GPUBroker.power_saving``, off by default):
in a trough, when the forecast p90 of this hour and the next asks fewer GPUs than the
machine has, nobody waits and a GPU is neither held nor shared, its power limit is lowered
through NVML; it is restored to its default as soon as the forecast of the next hour
needs it, a request waits, or a lease lands on it. Only root may set a limit (NVML says
NoPermission to anyone else): a broker that may not says so once and does nothing.

Each change is audited with its reason. What the lowered limits held back is counted in
W·h (the limit taken off, times the hours it was off): the most they can have saved,
since an idle GPU draws its idle power under any limit and only a load the broker did not
grant (use outside it) is capped."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from traitlets import Bool

from ..broker.core import Broker
from ..broker.forecast import HOUR_S, Forecast
from ..nvml.power import PowerLimitRefused, power_limits, set_power_limit
from ..wire.traits import Number
from .forecasting import ActsAhead, acting_line, p90_ahead

HEAD = "Power limits lowered in a forecast trough"
"""How the admin page names it."""

if TYPE_CHECKING:
    from ..nvml import NvmlBackend


@dataclass
class Lowered:
    """A GPU whose limit this broker lowered: to what, from what, and since when."""

    default_mw: int
    limit_mw: int
    since: float


def gpus_needed(found: Forecast, now: float) -> tuple[int, str]:
    """Whole GPUs the forecast's p90 asks this hour and the next, and the reason in words."""
    ahead = p90_ahead(found, now)
    if ahead is None:
        return 0, ""
    return math.ceil(ahead[0] - 1e-9), ahead[1]


class PowerSaving(ActsAhead):
    power_saving = Bool(
        False,
        help="In a forecast trough, lower the power limit of GPUs nobody holds or waits "
        "for, and restore it before the forecast needs them (root only: NVML refuses "
        "anyone else). Each change is audited with its reason.",
    ).tag(config=True)
    power_saving_fraction = Number(
        0.5,
        0.05,
        1.0,
        help="The lowered limit as a fraction of the GPU's default (never below the lowest "
        "limit NVML accepts for it).",
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lowered: dict[str, Lowered] = {}
        self.held_back_wh = 0.0
        """W·h of power limit held back so far: the most the lowered limits saved."""
        self._refused = False

    def power_saving_state(self) -> dict[str, Any]:
        """Whether it acts, as the admin page says it."""
        why_not = "NVML refuses a broker that is not root" if self._refused else None
        return acting_line("power_saving", HEAD, self.power_saving, why_not)

    def save_power(self, core: Broker, backend: NvmlBackend | None, log: logging.Logger) -> None:
        """One pass: restore what must be restored, then lower what the trough allows."""
        if backend is None or self._refused or not (self.power_saving or self.lowered):
            return
        now = core.clock.now()
        busy = self._busy(core)
        waiting = len(core.book.waiting) > 0  # the queue without its ETAs, every tick
        gpus = [g.uuid for g in core.inventory.gpus]
        if self.power_saving and not waiting:
            needed, reason = self._needed(core, now)
        else:
            needed, reason = len(gpus), "a request waits" if waiting else "power saving is off"
        for uuid in [u for u in self.lowered if u in busy]:
            self._restore(core, backend, uuid, now, "a lease holds it now")
        room = len(gpus) - needed - len(self.lowered)
        for uuid in list(self.lowered)[: max(0, -room)]:
            self._restore(core, backend, uuid, now, reason)
        idle = [u for u in gpus if u not in busy and u not in self.lowered]
        for uuid in idle[: max(0, room)]:
            if not self._lower(core, backend, uuid, now, reason, log):
                return

    def _busy(self, core: Broker) -> set[str]:
        """GPUs that a lease holds (whole or a slice of it) or shares."""
        inventory = core.inventory
        held = set(core.sharers())
        for device in core.holders():
            found = inventory.device(device)
            held.add(found.gpu_uuid if found is not None else device)
        return held

    def _needed(self, core: Broker, now: float) -> tuple[int, str]:
        """The GPUs the forecast needs now and next hour, and why."""
        return gpus_needed(self.read_forecast(core, now), now)

    def restore_all(self, core: Broker, backend: NvmlBackend | None) -> None:
        """Every lowered limit back to its default (the broker stops)."""
        if backend is not None:
            for uuid in list(self.lowered):
                self._restore(core, backend, uuid, core.clock.now(), "the broker stops")

    def _lower(
        self,
        core: Broker,
        backend: NvmlBackend,
        uuid: str,
        now: float,
        reason: str,
        log: logging.Logger,
    ) -> bool:
        handle = backend.handle(uuid)
        limits = power_limits(handle)
        target = max(limits.min_mw, round(limits.default_mw * self.power_saving_fraction))
        if target >= limits.current_mw:
            return True
        try:
            set_power_limit(handle, uuid, target)
        except PowerLimitRefused as e:
            log.warning("GPU broker power saving does nothing: %s", e)
            self._refused = True
            return False
        self.lowered[uuid] = Lowered(limits.default_mw, target, now)
        self._audit(core, "power_limit_lower", uuid, limits.default_mw, target, reason)
        return True

    def _restore(
        self, core: Broker, backend: NvmlBackend, uuid: str, now: float, reason: str
    ) -> None:
        was = self.lowered.pop(uuid)
        set_power_limit(backend.handle(uuid), uuid, was.default_mw)
        self.held_back_wh += (was.default_mw - was.limit_mw) / 1000 * (now - was.since) / HOUR_S
        self._audit(core, "power_limit_restore", uuid, was.limit_mw, was.default_mw, reason)

    def _audit(
        self, core: Broker, action: str, uuid: str, was_mw: int, now_mw: int, reason: str
    ) -> None:
        detail = {
            "from_w": was_mw / 1000,
            "to_w": now_mw / 1000,
            "held_back_wh": round(self.held_back_wh, 3),
            "reason": f"{reason}; power limit {was_mw / 1000:.0f} W to {now_mw / 1000:.0f} W",
        }
        self.audit_ahead(core, action, uuid, detail)
