"""The sampling pass's settings (``c.GPUBroker.*``): health, alerts, outside use; and
the :class:`~jupyter_gpubroker.monitor.sampler.Sampler` they make, with the reclaimer."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from traitlets import Bool, Enum, Int, List, TraitError, Unicode, validate
from traitlets import Set as SetTrait

from ..broker.alerts import AlertConfig, AlertJudge
from ..broker.core import Broker, Event
from ..broker.health import (
    CRITICAL_XIDS,
    DEFAULT_DRAIN_REASONS,
    SW_POWER_CAP,
    HealthConfig,
    HealthJudge,
)
from ..broker.reclaim import Reclaimer
from ..inventory import OpenInventory
from ..monitor.outside import POLICIES as OUTSIDE_POLICIES
from ..monitor.outside import OutsideWatch
from ..monitor.sampler import Sampler
from ..monitor.samples import SampleStore
from ..wire.errors import InvalidRequest
from ..wire.sizes import MAX_DURATION_S, RESOLUTION, number
from ..wire.traits import Number, Seconds
from .reclaim import ReclaimSettings

MAX_XID = 65535
"""The largest Xid number: NVIDIA's are far below it."""
MAX_TEMPERATURE_C = 200.0
"""Above any temperature a GPU reports: a threshold beyond it could never be reached."""


class MonitorSettings(ReclaimSettings):
    """How often the devices are read, when a GPU is unhealthy or alerting, and what is
    done about GPU use outside the broker."""

    sample_interval = Seconds(
        5.0,
        RESOLUTION,
        3600.0,
        help="Seconds between samples of every GPU and MIG slice (utilization, memory, "
        "temperature, power, clock-event reasons, Xid and ECC events), kept in the state file "
        "and driving health checks and idle reclaim.",
    ).tag(config=True)
    samples_kept = Seconds(
        365 * 86400.0,
        RESOLUTION,
        10 * MAX_DURATION_S,
        help="Seconds hourly samples are kept (raw samples are kept an hour, minute averages a "
        "week).",
    ).tag(config=True)
    healthy_for = Seconds(
        300.0,
        0.0,
        MAX_DURATION_S,
        help="Seconds a drained GPU must show no fault before it takes grants again.",
    ).tag(config=True)
    max_temperature = Number(
        85.0,
        0.0,
        MAX_TEMPERATURE_C,
        help="GPU temperature (C) at which the GPU is drained; 0: only its own thermal slowdown.",
    ).tag(config=True)
    drain_on_power_cap = Bool(
        False,
        help="Also drain GPUs slowed by their software power cap (normal under full load).",
    ).tag(config=True)
    drain_xids = List(
        Int(),
        default_value=sorted(CRITICAL_XIDS),
        help="Xid errors that drain a GPU (hardware faults; program faults such as 13, 31 or 43 "
        "are the program's). Double-bit ECC errors always drain.",
    ).tag(config=True)

    move_on_drain = Bool(
        True,
        help="Move the kernels of a GPU its health check drains (a fault, heat, throttling) to "
        "free GPUs of its model, where suspend holds there (reclaim_action 'auto' where the "
        "canary passed, or 'suspend'): suspended on the old GPU, restored on the new one, "
        "their cells paused meanwhile. Kernels that cannot move keep their GPU, told why.",
    ).tag(config=True)
    move_on_alerts = SetTrait(
        Unicode(),
        help="Alert kinds ('temperature', 'power_cap', 'ecc', 'xid', 'memory') whose start "
        "drains the GPU and moves its kernels as move_on_drain does; the drain lifts when the "
        "alert ends. Empty: alerts only tell.",
    ).tag(config=True)
    alert_temperature = Number(
        85.0,
        RESOLUTION,
        MAX_TEMPERATURE_C,
        help="GPU temperature (C) that raises a warning alert on a GPU for which NVML gives "
        "no slowdown temperature (where it does, that one is used).",
    ).tag(config=True)
    alert_temperature_critical = Number(
        90.0,
        RESOLUTION,
        MAX_TEMPERATURE_C,
        help="GPU temperature (C) that raises a critical alert on a GPU for which NVML gives "
        "no shutdown temperature (where it does, that one is used).",
    ).tag(config=True)
    alert_memory_percent = Number(
        95.0,
        RESOLUTION,
        100.0,
        help="Share of a GPU's or MIG slice's memory in use (percent) that raises a "
        "'memory nearly full' alert.",
    ).tag(config=True)
    alert_clear_after = Seconds(
        60.0,
        0.0,
        MAX_DURATION_S,
        help="Seconds an alert's condition must stay clear before the alert ends (so a "
        "reading at a threshold does not make it flap).",
    ).tag(config=True)
    alert_history_days = Number(
        90.0, RESOLUTION, 3660.0, help="Days ended alerts are kept in the state file."
    ).tag(config=True)
    outside_use = Enum(
        list(OUTSIDE_POLICIES),
        default_value="report",
        help="What the broker does about a process that uses a local GPU or MIG slice its "
        "user was not granted (found by matching NVML's processes to the leases every "
        "sampling pass; the device then takes no grants, an alert is raised, the audit log "
        "records it and its time is charged to the user as unbrokered use). 'report': only "
        "that. 'warn': also a notice on every front of that user. 'stop': warn, then after "
        "outside_use_grace send the process SIGTERM, and SIGKILL 10 s later (only a broker "
        "running as root; a lease holder's processes on its own devices are never touched).",
    ).tag(config=True)
    outside_use_grace = Seconds(
        300.0,
        0.0,
        MAX_DURATION_S,
        help="Seconds between the notice of outside use and the signal, with outside_use='stop'.",
    ).tag(config=True)

    @validate("drain_xids")
    def _check_xids(self, proposal: dict[str, Any]) -> list[int]:
        try:
            return [number(x, "an Xid", 0, MAX_XID, whole=True) for x in proposal["value"]]  # type: ignore[misc]
        except InvalidRequest as e:
            raise TraitError(f"GPUBroker.drain_xids: {e.message}") from None

    def make_sampler(
        self,
        core: Broker,
        hardware: OpenInventory,
        publish: Callable[[Event], None],
        log: logging.Logger,
        unseen: str | None = None,
    ) -> Sampler:
        """The sampling pass over the opened inventory's readings, with its first readings
        taken (so ``GET devices`` has readings at once); ``unseen``: why the processes NVML
        lists cannot be matched to leases here, so outside use is not watched."""
        health = HealthConfig(
            max_temperature_c=self.max_temperature or None,
            drain_clock_reasons=DEFAULT_DRAIN_REASONS
            | (SW_POWER_CAP if self.drain_on_power_cap else 0),
            drain_xids=frozenset(self.drain_xids),
            healthy_for_s=self.healthy_for,
        )
        alerts = AlertConfig(
            temperature_warning_c=self.alert_temperature,
            temperature_critical_c=self.alert_temperature_critical,
            memory_full_percent=self.alert_memory_percent,
            xids=frozenset(self.drain_xids),
            clear_after_s=self.alert_clear_after,
            history_kept_s=self.alert_history_days * 86400,
        )
        sampler = Sampler(
            core,
            hardware.readings,
            SampleStore(core.store, self.sample_interval, hours_kept_s=self.samples_kept),
            HealthJudge(health),
            Reclaimer(core, self.reclaim_config(), self.arbiter(log)),
            log=log,
            alerts=AlertJudge(core.store, core.clock.now(), alerts),
        )
        if hardware.nvml is not None and unseen is None:  # an engine's are the engine's
            sampler.outside = OutsideWatch(
                core, publish, self.outside_use, self.outside_use_grace, log
            )
            if self.outside_use == "stop" and not sampler.outside.may_signal:
                log.warning(
                    "GPU broker: c.GPUBroker.outside_use is 'stop' but the broker does not run "
                    "as root: it warns the users, and stops no process"
                )
        sampler.latest = hardware.readings.read_all(core.inventory)
        return sampler
