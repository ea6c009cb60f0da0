"""Device health: which GPUs to drain, and when a drained one may take work again.

Pure and clock-driven: each sampling pass hands its readings and the hardware
events NVML delivered to :meth:`HealthJudge.assess` with the time, which answers
with drain and recover decisions; the host applies them through
``Broker.drain`` / ``Broker.undrain``. A GPU is judged as a whole (temperature,
clocks, ECC, Xid errors and the bus are the GPU's), so its MIG slices are
drained with it. Xid and ECC errors are point events; a GPU recovers once it has
shown no fault at all for ``healthy_for_s``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..wire.errors import InvalidRequest
from .models import DeviceEvent, DeviceReading, Health

# nvmlClocksEventReason* bits (nvml.h)
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
REASON_NAMES = {
    SW_POWER_CAP: "power cap",
    HW_SLOWDOWN: "hardware slowdown",
    SW_THERMAL: "thermal slowdown",
    HW_THERMAL: "hardware thermal slowdown",
    HW_POWER_BRAKE: "power brake",
}
DEFAULT_DRAIN_REASONS = HW_SLOWDOWN | SW_THERMAL | HW_THERMAL | HW_POWER_BRAKE
"""Slowdowns that mean trouble. The software power cap is left out: a GPU at its power
limit under full load is working as designed."""

CRITICAL_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120})
"""Xids that point at the hardware rather than the program, after NVIDIA's Xid catalog:
48 double-bit ECC, 63/64 page retirement or row remapping (pending a reset, or failed),
74 NVLink, 79 fallen off the bus, 92 high single-bit ECC rate, 94/95 contained and
uncontained ECC errors, 119/120 GSP errors. Program faults (13, 31, 43, 45) drain nothing."""


@dataclass(frozen=True)
class HealthConfig:
    max_temperature_c: float | None = 85.0
    """Drain a GPU at or above this temperature (None: only its own slowdown signals)."""
    drain_clock_reasons: int = DEFAULT_DRAIN_REASONS
    """Clock-event reason bits that drain a GPU."""
    drain_xids: frozenset[int] = field(default=CRITICAL_XIDS)
    healthy_for_s: float = 300.0
    """A drained GPU recovers after showing no fault for this long."""

    def __post_init__(self) -> None:
        if not self.healthy_for_s >= 0:
            raise InvalidRequest("healthy_for_s must be zero or more")
        if self.max_temperature_c is not None and not self.max_temperature_c > 0:
            raise InvalidRequest("max_temperature_c must be positive")


@dataclass(frozen=True)
class HealthChange:
    """Drain a GPU (``drain``) or let it take work again (not ``drain``), and why."""

    gpu_uuid: str
    drain: bool
    reason: str


@dataclass
class _Unhealthy:
    last_fault_at: float
    kinds: set[str]


class HealthJudge:
    """Remembers, per GPU, which faults it showed and when it last showed one."""

    def __init__(self, config: HealthConfig | None = None) -> None:
        self.config = config or HealthConfig()
        self._unhealthy: dict[str, _Unhealthy] = {}

    def adopt(self, drained: Iterable[str], now: float) -> None:
        """After a restart: GPUs found drained stay so until healthy for ``healthy_for_s``."""
        for uuid in drained:
            self._unhealthy.setdefault(uuid, _Unhealthy(now, {"restart"}))

    def unhealthy(self, gpu_uuid: str) -> tuple[str, ...]:
        """The kinds of fault a GPU showed since it was last healthy for ``healthy_for_s``
        (empty: none): until then its health check keeps it drained."""
        state = self._unhealthy.get(gpu_uuid)
        return () if state is None else tuple(sorted(state.kinds))

    def faults(self, reading: DeviceReading | None) -> dict[str, str]:
        """What is wrong with a GPU by its reading: fault kind -> description."""
        if reading is None:
            return {}
        if reading.health is Health.LOST:
            return {"lost": "the GPU is lost (fell off the bus)"}
        if reading.health is Health.UNREACHABLE:
            return {"unreachable": f"NVML cannot read the GPU ({reading.error})"}
        found = {}
        limit, t = self.config.max_temperature_c, reading.temperature_c
        if limit is not None and t is not None and t >= limit:
            found["temperature"] = f"temperature {t} C (limit {limit:g} C)"
        bits = (reading.clock_event_reasons or 0) & self.config.drain_clock_reasons
        if bits:
            names = ", ".join(n for b, n in REASON_NAMES.items() if bits & b)
            found["throttling"] = f"clocks slowed down ({names})"
        return found

    def event_fault(self, event: DeviceEvent) -> tuple[str, str] | None:
        if event.kind == "double_bit_ecc":
            return "ecc", "uncorrectable (double-bit) ECC error"
        if event.code in self.config.drain_xids:
            return "xid", f"Xid {event.code}"
        return None

    def assess(
        self,
        now: float,
        readings: Mapping[str, DeviceReading],
        events: Iterable[DeviceEvent],
        gpu_of: Mapping[str, str],
    ) -> list[HealthChange]:
        """One pass: ``readings`` by UUID, ``events`` since the last pass, ``gpu_of``
        mapping every GPU and device UUID to its GPU's (the GPUs judged)."""
        found = {gpu: self.faults(readings.get(gpu)) for gpu in dict.fromkeys(gpu_of.values())}
        for e in events:
            fault = self.event_fault(e)
            gpu = gpu_of.get(e.uuid)
            if fault is not None and gpu is not None:
                found[gpu][fault[0]] = fault[1]
        changes = []
        for gpu, faults in found.items():
            state = self._unhealthy.get(gpu)
            if faults:
                new = set(faults) - (state.kinds if state else set())
                if state is None:
                    state = self._unhealthy[gpu] = _Unhealthy(now, set())
                state.last_fault_at = now
                state.kinds |= new
                if new:
                    changes.append(HealthChange(gpu, True, "; ".join(faults.values())))
            elif state is not None and now - state.last_fault_at >= self.config.healthy_for_s:
                del self._unhealthy[gpu]
                reason = f"no fault for {self.config.healthy_for_s:g} s"
                changes.append(HealthChange(gpu, False, reason))
        return changes
