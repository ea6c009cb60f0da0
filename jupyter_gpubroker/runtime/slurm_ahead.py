"""Slurm nodes woken ahead of the forecast and put to sleep in its troughs
(``c.GPUBroker.slurm_ahead``, off by default), through Slurm's own power saving: after
each read of the cluster, ``broker/node_power.py`` plans, and this wakes a node with
``scontrol update NodeName=X State=POWER_UP`` or puts one to sleep with
``State=POWER_DOWN`` (``engines/slurm_power.py``). Each change is audited with its reason.

What a wrong forecast may cost is capped (``slurm_ahead_gpu_hours``): the GPU-hours of
the nodes woken for the forecast alone, counted from the wake until a lease lands on one
of their GPUs or they sleep again, per UTC day. A node woken for a request that waits now
is not counted. The count goes on from the audit log when the broker restarts."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from traitlets import Bool

from ..broker.core import Broker
from ..broker.forecast import DAY_S, HOUR_S
from ..broker.node_power import AWAKE, WAKING, Cap, Need, NodePower, plan_for
from ..engines import EngineUnavailable
from ..engines.slurm import SlurmInventory
from ..engines.slurm_power import PowerRefused
from ..wire.text import duration, gpu_hours
from ..wire.traits import Number
from .forecasting import ACTOR, REPLAN_S, ActsAhead, acting_line
from .power_saving import gpus_needed

if TYPE_CHECKING:
    from ..engines import InventorySource

HEAD = "Slurm nodes woken and put to sleep ahead of the forecast"
"""How the admin page names it."""

WAKE, SLEEP = "slurm_power_up", "slurm_power_down"
"""The audit log's actions."""


class SlurmAhead(ActsAhead):
    slurm_ahead = Bool(
        False,
        help="On Slurm, wake sleeping nodes (Slurm's power saving) before the forecast or "
        "a waiting request needs their GPUs, and put idle ones to sleep in a forecast "
        "trough (never one with a job, a lease or a waiting request that fits it). Each "
        "change is audited with its reason.",
    ).tag(config=True)
    slurm_ahead_gpu_hours = Number(
        24.0,
        0.0,
        1_000_000.0,
        help="GPU-hours a UTC day that nodes woken for the forecast alone may stay awake "
        "before a lease uses them; once spent, none is woken ahead that day and those "
        "still unused are put to sleep.",
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.slurm_woken_ahead: dict[str, float] = {}
        """Node woken for the forecast alone, and not used yet -> its GPUs."""
        self.slurm_gpu_hours_ahead = 0.0
        """GPU-hours they stayed awake today (UTC)."""
        self._slurm_day: float | None = None
        self._slurm_counted_at: float | None = None
        self._slurm_off: str | None = None
        """Why Slurm's power saving puts no node to sleep here, or None."""
        self._slurm_refused: tuple[float, str] | None = None
        """When Slurm last refused a change and what it said; tried again after REPLAN_S."""

    def slurm_ahead_state(self, engine: InventorySource | None) -> dict[str, Any] | None:
        """Whether it acts, as the admin page says it (None: neither on nor on Slurm)."""
        if not self.slurm_ahead and not isinstance(engine, SlurmInventory):
            return None
        why = self._slurm_refused[1] if self._slurm_refused is not None else self._slurm_off
        if not isinstance(engine, SlurmInventory):
            why = "the inventory is not Slurm's"
        spent, cap = gpu_hours(self.slurm_gpu_hours_ahead), gpu_hours(self.slurm_ahead_gpu_hours)
        doing = f"on; GPUs kept awake ahead today: {spent} of the {cap} a day allowed"
        return acting_line("slurm_ahead", HEAD, self.slurm_ahead, why, doing)

    async def power_ahead(
        self, core: Broker, engine: InventorySource | None, log: logging.Logger
    ) -> None:
        """One pass, after a read of the cluster: wake and put to sleep what the plan says."""
        if not self.slurm_ahead or not isinstance(engine, SlurmInventory):
            return
        now = core.clock.now()
        if self._slurm_refused is not None and now - self._slurm_refused[0] < REPLAN_S:
            return
        try:
            config = await engine.sleep_config()
        except EngineUnavailable:
            return  # the next read says so
        self._slurm_off = config.off
        if config.off is not None:
            return
        nodes = [
            NodePower(n.name, n.power, n.state == "IDLE", config.may_sleep(n.name, n.partitions))
            for n in engine.nodes
            if n.gres and n.down is None
        ]
        self._slurm_count(core, nodes, now)
        plan = plan_for(core, nodes, self._slurm_need(core, now), self._slurm_cap())
        for node, reason in plan.up:
            if not await self._slurm_power(core, engine, node, True, reason, log):
                return
            if node in plan.ahead:
                self.slurm_woken_ahead[node] = self._node_gpus(core, node)
        for node, reason in plan.down:
            if not await self._slurm_power(core, engine, node, False, reason, log):
                return
            self.slurm_woken_ahead.pop(node, None)

    def _slurm_need(self, core: Broker, now: float) -> Need | None:
        found = self.read_forecast(core, now)
        if not found.ready:
            return None
        return Need(*gpus_needed(found, now))

    def _slurm_cap(self) -> Cap:
        cap = self.slurm_ahead_gpu_hours
        return Cap(
            self.slurm_gpu_hours_ahead >= cap,
            frozenset(self.slurm_woken_ahead),
            f"today's {gpu_hours(cap)} of GPUs kept awake ahead of the forecast are spent",
        )

    @staticmethod
    def _node_gpus(core: Broker, node: str) -> float:
        return sum(d.gpu_equivalents for d in core.placer.devices.values() if d.node == node)

    def _slurm_count(self, core: Broker, nodes: list[NodePower], now: float) -> None:
        """Add the GPU-hours the nodes woken ahead stayed awake since the last pass; forget
        those a lease used or that sleep again. A new UTC day starts from none."""
        day = math.floor(now / DAY_S)
        if self._slurm_day != day:
            first = self._slurm_day is None
            self.slurm_gpu_hours_ahead = (
                self._slurm_spent_today(core, day * DAY_S) if first else 0.0
            )
            self._slurm_day = day
        since, self._slurm_counted_at = self._slurm_counted_at, now
        power = {n.name: n.power for n in nodes}
        used = {core.placer.devices[u].node for u in core.placer.held if u in core.placer.devices}
        for node, n_gpus in list(self.slurm_woken_ahead.items()):
            if since is not None:
                self.slurm_gpu_hours_ahead += n_gpus * max(0.0, now - since) / HOUR_S
            if node in used or power.get(node) not in (AWAKE, WAKING):
                del self.slurm_woken_ahead[node]

    @staticmethod
    def _slurm_spent_today(core: Broker, day_start: float) -> float:
        """What the audit log says was spent today before this broker started."""
        rows = core.store.audit(since=day_start, actor=ACTOR, limit=1_000_000)
        spent = [r["detail"] for r in rows if r["action"] in (WAKE, SLEEP)]
        return float(spent[-1].get("gpu_hours_ahead_today", 0.0)) if spent else 0.0

    async def _slurm_power(
        self,
        core: Broker,
        engine: SlurmInventory,
        node: str,
        up: bool,
        reason: str,
        log: logging.Logger,
    ) -> bool:
        """Wake ``node`` or put it to sleep, and audit it; False when Slurm refused."""
        try:
            await engine.power(node, up)
        except (PowerRefused, EngineUnavailable) as e:
            if self._slurm_refused is None or self._slurm_refused[1] != str(e):
                log.warning("GPU broker: %s; trying again in %s", e, duration(REPLAN_S))
            self._slurm_refused = (core.clock.now(), str(e))
            return False
        self._slurm_refused = None
        detail = {
            "gpus": self._node_gpus(core, node),
            "gpu_hours_ahead_today": round(self.slurm_gpu_hours_ahead, 4),
            "reason": f"{reason}; {'woke' if up else 'put to sleep'} {node}",
        }
        self.audit_ahead(core, WAKE if up else SLEEP, node, detail)
        return True
