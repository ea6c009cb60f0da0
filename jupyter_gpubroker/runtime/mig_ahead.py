"""MIG slices cut ahead of the forecast (``c.GPUBroker.mig_ahead``, off by default): when
nobody waits and the forecast of this hour and the next asks MIG profiles the idle GPUs
are not cut to, idle slices are re-cut to them (``broker/ahead.py``), so the requests the
forecast expects are granted at once instead of each waiting for its own re-cut. Held
slices and drained GPUs are never touched. Each re-cut is audited with its reason."""

from __future__ import annotations

import logging
from typing import Any

from traitlets import Bool

from ..broker.ahead import next_cut, slices_wanted
from ..broker.core import Broker
from ..broker.forecast import ahead
from ..wire.text import count
from .forecasting import ActsAhead, acting_line

HEAD = "MIG slices cut ahead of the forecast"
"""How the admin page names it."""
MAX_CUTS = 8
"""Re-cuts in one pass at most: a pass runs inside a tick."""


class MigAhead(ActsAhead):
    mig_ahead = Bool(
        False,
        help="Before an hour whose requests the forecast expects in other MIG profiles "
        "than the idle GPUs are cut to, re-cut idle capacity to those profiles (never a "
        "held slice). Needs dynamic_mig. Each re-cut is audited with its reason.",
    ).tag(config=True)

    _said_no_partitioner = False

    def mig_ahead_state(self, core: Broker) -> dict[str, Any]:
        """Whether it acts, as the admin page says it."""
        why_not = None if core.devices.partitioner is not None else "it needs dynamic_mig"
        return acting_line("mig_ahead", HEAD, self.mig_ahead, why_not)

    def cut_ahead(self, core: Broker, log: logging.Logger) -> None:
        """One pass: as many re-cuts towards the forecast's profiles as idle capacity allows."""
        if not self.mig_ahead or core.book.waiting:
            return
        if core.devices.partitioner is None:
            if not self._said_no_partitioner:
                self._said_no_partitioner = True
                log.warning(
                    "GPU broker: mig_ahead does nothing without dynamic_mig, which lets "
                    "the broker re-cut MIG GPUs"
                )
            return
        now = core.clock.now()
        found = self.read_forecast(core, now)
        if not found.ready:
            return
        _, *hours = ahead(found, now)
        wanted = slices_wanted(hours)
        if not wanted:
            return
        reason = (
            "forecast: "
            + ", ".join(count(n, f"{profile} slice") for profile, n in sorted(wanted.items()))
            + f" asked at once {hours[0].label} or {hours[1].label} (median)"
        )
        for _ in range(MAX_CUTS):
            plan = next_cut(core.placer, wanted)
            if plan is None:
                return
            created = core.devices.repartition(plan)[0]
            detail: dict[str, Any] = {
                "destroyed": [d.uuid for d in plan.destroy],
                "created": created.uuid,
                "profile": plan.profile.name,
                "reason": f"{reason}; cut a {plan.profile.name} slice from idle capacity",
            }
            self.audit_ahead(core, "mig_cut_ahead", plan.gpu.uuid, detail)
