"""Health alerts: what a person should look at on each GPU and MIG slice, as data.

Pure and clock-driven, like the health judge: each sampling pass hands its readings and
the hardware events NVML delivered to :meth:`AlertJudge.assess` with the time, which
answers with the alerts that started, escalated or ended, and writes them to the store
in one transaction (so the active ones and the history survive a restart). An alert is
one condition on one device (``kind``: over-temperature, power capping, an ECC error or
a hardware Xid, a lost or unreadable GPU, memory nearly full, use outside the broker);
it ends once its condition stayed clear for ``clear_after_s``, so a reading that hovers
at a threshold does not flap. Alerting is apart from draining (:mod:`.health`): an alert tells an
admin; a drain stops grants.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from ..wire.errors import InvalidRequest
from ..wire.text import gigabytes, memory
from .health import CRITICAL_XIDS, HW_POWER_BRAKE, SW_POWER_CAP
from .models import DeviceEvent, DeviceReading, Health, Inventory
from .store import Store

Severity = Literal["warning", "critical"]
XID_NAMES = {
    48: "a double-bit ECC error",
    63: "a page retirement or row remapping that waits for a reset",
    64: "a row remapping failure",
    74: "an NVLink error",
    79: "the GPU fell off the bus",
    92: "a high single-bit ECC error rate",
    94: "a contained ECC error",
    95: "an uncontained ECC error",
    119: "a GSP timeout",
    120: "a GSP error",
}
"""What each Xid of ``CRITICAL_XIDS`` means, after NVIDIA's Xid catalog."""


@dataclass(frozen=True)
class AlertConfig:
    temperature_warning_c: float = 85.0
    """Warn at this temperature where NVML gives no slowdown threshold for the GPU."""
    temperature_critical_c: float = 90.0
    """Critical at this temperature where NVML gives no shutdown threshold."""
    memory_full_percent: float = 95.0
    """Warn when a device's memory in use reaches this share of its memory."""
    xids: frozenset[int] = field(default=CRITICAL_XIDS)
    """Xids that raise an alert (hardware faults; a program's own faults raise none)."""
    clear_after_s: float = 60.0
    """An alert ends once its condition stayed clear this long."""
    history_kept_s: float = 90 * 86400.0
    """Ended alerts are kept this long."""

    def __post_init__(self) -> None:
        if not 0 < self.temperature_warning_c < self.temperature_critical_c:
            raise InvalidRequest(
                "the warning temperature must be positive and below the critical one, not "
                f"{self.temperature_warning_c:g} C and {self.temperature_critical_c:g} C"
            )
        if not 0 < self.memory_full_percent <= 100:
            raise InvalidRequest(
                f"memory_full_percent is a percent above 0, not {self.memory_full_percent:g}"
            )
        if not self.clear_after_s >= 0:
            raise InvalidRequest("clear_after_s must be zero or more")
        if not self.history_kept_s > 0:
            raise InvalidRequest("history_kept_s must be positive")


@dataclass(frozen=True)
class Alert:
    """One alert as stored and shown: which device, what, how bad, since when."""

    id: int
    uuid: str
    label: str
    """What a person calls the device: ``GPU 3`` or ``GPU 3 / 1g.10gb@2``."""
    kind: str
    severity: Severity
    message: str
    since: float
    ended: float | None = None

    def to_json(self) -> dict[str, Any]:
        """Its fields, times as UTC seconds (``api.shapes.alert_json`` makes them ISO)."""
        return asdict(self)


@dataclass(frozen=True)
class AlertChange:
    """An alert ``started``, ``escalated`` (warning to critical) or ``ended``."""

    state: Literal["started", "escalated", "ended"]
    alert: Alert


@dataclass(frozen=True)
class _Finding:
    severity: Severity
    message: str


@dataclass
class _Active:
    alert: Alert
    last_seen: float


class AlertJudge:
    """The active alerts of a machine, judged pass by pass and kept in ``store``."""

    def __init__(self, store: Store, now: float, config: AlertConfig | None = None) -> None:
        """Adopt the alerts the store holds active (a restart): each ends once its
        condition has been clear for ``clear_after_s`` from now."""
        self.store = store
        self.config = config or AlertConfig()
        self._active = {
            (a.uuid, a.kind): _Active(a, now) for a in (Alert(**r) for r in store.active_alerts())
        }
        with store.transaction():
            store.purge_alerts(now - self.config.history_kept_s)

    def active(self) -> list[Alert]:
        """The active alerts, oldest first."""
        return sorted((x.alert for x in self._active.values()), key=lambda a: a.id)

    def findings(
        self,
        inventory: Inventory,
        readings: Mapping[str, DeviceReading],
        events: Iterable[DeviceEvent],
    ) -> dict[tuple[str, str], _Finding]:
        """What is wrong right now, by (device UUID, kind)."""
        found: dict[tuple[str, str], _Finding] = {}
        label = _labels(inventory)
        for gpu in inventory.gpus:
            r = readings.get(gpu.uuid)
            if r is not None:
                for kind, finding in self._gpu_findings(label[gpu.uuid], r).items():
                    found[gpu.uuid, kind] = finding
        for d in inventory.devices:  # a whole GPU's memory, or each MIG slice's
            full = self._memory(label[d.uuid], readings.get(d.uuid))
            if full is not None:
                found[d.uuid, "memory"] = full
        for e in events:
            name = label.get(e.uuid, e.uuid)
            if e.kind == "double_bit_ecc":
                found[e.uuid, "ecc"] = _Finding(
                    "critical",
                    f"{name} had an uncorrectable (double-bit) ECC error: data in its memory "
                    "may be corrupt; drain it and reset the GPU.",
                )
            elif e.code in self.config.xids:
                what = XID_NAMES.get(e.code or 0, "a hardware fault")
                found[e.uuid, "xid"] = _Finding(
                    "critical",
                    f"{name} raised Xid {e.code} ({what}): see NVIDIA's Xid catalog for what "
                    "to do; it usually needs a GPU reset.",
                )
        return found

    def _gpu_findings(self, name: str, r: DeviceReading) -> dict[str, _Finding]:
        if r.health is Health.LOST:
            return {
                "lost": _Finding(
                    "critical",
                    f"{name} is lost: it fell off the bus, its work is gone and it needs a "
                    "reset or a reboot.",
                )
            }
        if r.health is Health.UNREACHABLE:
            return {
                "unreachable": _Finding(
                    "critical", f"NVML cannot read {name} ({r.error}): check the driver."
                )
            }
        found = {}
        temperature = self._temperature(name, r)
        if temperature is not None:
            found["temperature"] = temperature
        bits = r.clock_event_reasons or 0
        if bits & HW_POWER_BRAKE:
            found["power_cap"] = _Finding(
                "critical",
                f"{name} has its clocks cut by the hardware power brake: check its power supply.",
            )
        elif bits & SW_POWER_CAP:
            limit = "" if r.power_limit_mw is None else f" of {r.power_limit_mw / 1000:g} W"
            found["power_cap"] = _Finding(
                "warning",
                f"{name} is held at its power limit{limit}, so its clocks are slowed down.",
            )
        return found

    def _temperature(self, name: str, r: DeviceReading) -> _Finding | None:
        t = r.temperature_c
        if t is None:
            return None
        cfg = self.config
        if r.temperature_shutdown_c is not None:
            critical, critical_name = float(r.temperature_shutdown_c), "its shutdown temperature"
        else:
            critical, critical_name = cfg.temperature_critical_c, "the critical alert temperature"
        if r.temperature_slowdown_c is not None:
            warning, warning_name = float(r.temperature_slowdown_c), "its slowdown temperature"
        else:
            warning, warning_name = cfg.temperature_warning_c, "the alert temperature"
        if t >= critical:
            return _Finding(
                "critical",
                f"{name} is at {t} C, at or above {critical_name} of {critical:g} C: it may "
                "switch itself off; check its cooling now.",
            )
        if t >= warning:
            return _Finding(
                "warning",
                f"{name} is at {t} C, at or above {warning_name} of {warning:g} C: it runs "
                "slower to cool down; check its cooling.",
            )
        return None

    def _memory(self, name: str, r: DeviceReading | None) -> _Finding | None:
        if r is None or r.memory_used_mib is None or not r.memory_total_mib:
            return None
        percent = 100 * r.memory_used_mib / r.memory_total_mib
        limit = self.config.memory_full_percent
        if percent < limit:
            return None
        used, total = gigabytes(r.memory_used_mib), memory(r.memory_total_mib)
        return _Finding(
            "warning",
            f"{name} has {used} of {total} of memory in use ({percent:.0f}%, alert "
            f"at {limit:g}%): its next allocation may fail.",
        )

    def assess(
        self,
        now: float,
        inventory: Inventory,
        readings: Mapping[str, DeviceReading],
        events: Iterable[DeviceEvent],
        outside: Mapping[str, str] | None = None,
    ) -> list[AlertChange]:
        """One pass: the alerts that start, escalate and end, committed in one transaction
        (none when nothing changed) before they are kept here. ``outside``: device UUID ->
        what uses it outside the broker (``monitor.outside``)."""
        found = self.findings(inventory, readings, events)
        for uuid, message in (outside or {}).items():
            found[uuid, "outside"] = _Finding("warning", message)
        label = _labels(inventory)
        changes: list[AlertChange] = []
        for (uuid, kind), finding in found.items():
            state = self._active.get((uuid, kind))
            if state is None:
                name = label.get(uuid, uuid)
                new = Alert(0, uuid, name, kind, finding.severity, finding.message, now)
                changes.append(AlertChange("started", new))
            elif finding.severity == "critical" and state.alert.severity == "warning":
                raised = replace(state.alert, severity="critical", message=finding.message)
                changes.append(AlertChange("escalated", raised))
        for key, state in self._active.items():
            if key not in found and now - state.last_seen >= self.config.clear_after_s:
                changes.append(AlertChange("ended", replace(state.alert, ended=now)))
        if changes:
            changes = self._write(changes, now)
        for key in found:
            self._active[key].last_seen = now
        return changes

    def _write(self, changes: list[AlertChange], now: float) -> list[AlertChange]:
        """Commit ``changes`` (new alerts get their ids), then keep them."""
        store, written = self.store, []
        with store.transaction():
            for c in changes:
                a = c.alert
                if c.state == "started":
                    c = AlertChange("started", replace(a, id=store.insert_alert(a.to_json())))
                elif c.state == "escalated":
                    store.escalate_alert(a.id, a.severity, a.message)
                else:
                    store.end_alert(a.id, now)
                written.append(c)
            store.purge_alerts(now - self.config.history_kept_s)
        for c in written:
            key = c.alert.uuid, c.alert.kind
            if c.state == "ended":
                del self._active[key]
            else:
                self._active[key] = _Active(c.alert, now)
        return written


def _labels(inventory: Inventory) -> dict[str, str]:
    return {g.uuid: f"GPU {g.index}" for g in inventory.gpus} | {
        d.uuid: d.label for d in inventory.devices
    }
