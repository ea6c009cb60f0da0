"""Prometheus metrics of the broker, served with the host's own (``/metrics``).

A custom collector: every value is read from the broker and the sampler's last
readings (and its active health alerts) at scrape time, so a scrape shows exactly the
state the API shows. The alerting rules and the Grafana dashboard shipped beside it
(``monitor/prometheus/alerts.yml``, ``monitor/grafana/gpubroker.json``) query these
names; a test checks each one against a live server's ``/metrics``. Grants,
reclaims and waits are counted from the broker's events since the host started,
as Prometheus counters are. Register it in the registry the host serves
(jupyter-server's ``/metrics`` serves prometheus-client's default ``REGISTRY``).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import CollectorRegistry

from ..broker.alerts import Alert
from ..broker.core import Broker, Event
from ..broker.health import HW_POWER_BRAKE, HW_SLOWDOWN, HW_THERMAL, SW_POWER_CAP, SW_THERMAL
from ..broker.models import DeviceReading, Health, JobClass, RequestState, ShareUse
from ..broker.shapes import device_class

WAIT_BUCKETS = (1.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 86400.0)
"""Upper bounds (s) of the queue-wait histogram: seconds for a free slice to a day."""
DEVICE_LABELS = ("uuid", "gpu", "profile")
GPU_LABELS = ("uuid", "gpu")
SHARE_LABELS = ("lease_id", "uuid", "gpu")
CLOCK_REASONS = {
    SW_POWER_CAP: "power_cap",
    HW_SLOWDOWN: "hw_slowdown",
    SW_THERMAL: "sw_thermal",
    HW_THERMAL: "hw_thermal",
    HW_POWER_BRAKE: "power_brake",
}
"""The clock-event reasons exported, by their nvmlClocksEventReason bit."""


class BrokerCollector:
    """Collects the broker's metrics; ``readings`` returns the latest device readings,
    ``alerts`` the active health alerts, ``hardware_errors`` the Xid and ECC events counted
    since the start by (UUID, kind), ``share_use`` each share's memory in use and
    utilization by lease."""

    def __init__(
        self,
        broker: Broker,
        readings: Callable[[], dict[str, DeviceReading]],
        alerts: Callable[[], list[Alert]] = list,
        hardware_errors: Callable[[], Mapping[tuple[str, str], int]] = dict,
        share_use: Callable[[], Mapping[str, ShareUse]] = dict,
    ) -> None:
        self.broker, self.readings = broker, readings
        self.alerts, self.hardware_errors = alerts, hardware_errors
        self.share_use = share_use
        self.grants = 0
        self.reclaims: Counter[str] = Counter()
        self.wait_counts = [0] * (len(WAIT_BUCKETS) + 1)
        self.wait_sum = 0.0
        self._unsubscribe = broker.subscribe(self._count)
        self._registry: CollectorRegistry | None = None

    def register(self, registry: CollectorRegistry) -> None:
        registry.register(self)
        self._registry = registry

    def close(self) -> None:
        """Stop counting and leave the registry."""
        self._unsubscribe()
        if self._registry is not None:
            self._registry.unregister(self)
            self._registry = None

    def _count(self, event: Event) -> None:
        if event.kind == "granted":
            self.grants += 1
            waited = float(event.detail.get("waited_s", 0.0))
            self.wait_counts[bisect.bisect_left(WAIT_BUCKETS, waited)] += 1
            self.wait_sum += waited
        elif event.kind == "reclaimed":
            self.reclaims[str(event.detail.get("cause", "admin"))] += 1

    def describe(self) -> Iterator[Metric]:
        """The metric families without values (so registering does not collect)."""
        return self._families(with_values=False)

    def collect(self) -> Iterator[Metric]:
        return self._families(with_values=True)

    def _families(self, with_values: bool) -> Iterator[Metric]:
        fams = _Families()
        if with_values:
            self._fill(fams)
        yield from fams.all()

    def _fill(self, f: _Families) -> None:
        readings = self.readings()
        self._fill_devices(f, readings)
        self._fill_gpus(f, readings)
        for (uuid, kind), n in sorted(self.hardware_errors().items()):
            f.hardware_errors.add_metric([uuid, kind], n)
        for a in self.alerts():
            f.alerts.add_metric([a.uuid, a.kind, a.severity], 1)
        self._fill_queue(f)
        self._fill_shares(f)

    def _fill_shares(self, f: _Families) -> None:
        """Each share: its memory, and what its processes use where NVML says."""
        used = self.share_use()
        for lease in self.broker.leases():
            if not lease.shared:
                continue
            uuid = lease.devices[0]
            gpu = self.broker.inventory.device(uuid)
            labels = [lease.id, uuid, str(gpu.gpu_index) if gpu is not None else ""]
            f.share_memory.add_metric(labels, lease.share_mib * 2**20)
            use = used.get(lease.id, ShareUse())
            if use.used_mib is not None:
                f.share_memory_used.add_metric(labels, use.used_mib * 2**20)
            if use.utilization is not None:
                f.share_utilization.add_metric(labels, use.utilization)

    def _fill_devices(self, f: _Families, readings: Mapping[str, DeviceReading]) -> None:
        """Each device held, drained or free (and a MIG slice's readings), and how many
        of each class are."""
        b = self.broker
        holders = b.holders()
        states: Counter[tuple[str, str]] = Counter()
        for d in b.inventory.devices:
            labels = [d.uuid, str(d.gpu_index), device_class(d)]
            held = d.uuid in holders
            f.allocated.add_metric(labels, float(held))
            drained = b.placer.is_drained(d)
            f.drained.add_metric(labels, float(drained))
            states[device_class(d), "drained" if drained else "held" if held else "free"] += 1
            r = readings.get(d.uuid)
            if r is not None and d.kind == "mig":  # a whole GPU's are its GPU's, below
                _device_readings(f, labels, r)
        for (profile, state), n in sorted(states.items()):
            f.devices.add_metric([profile, state], n)

    def _fill_gpus(self, f: _Families, readings: Mapping[str, DeviceReading]) -> None:
        """Each GPU's health, sensors and limits (and a whole GPU's readings)."""
        b = self.broker
        drained_gpus = b.drained()
        for g in b.inventory.gpus:
            labels = [g.uuid, str(g.index)]
            r = readings.get(g.uuid)
            healthy = r is not None and r.health is Health.OK and g.uuid not in drained_gpus
            f.healthy.add_metric(labels, float(healthy))
            if r is None:
                continue
            if not g.mig_enabled:
                _device_readings(f, [*labels, "gpu"], r)
            if r.temperature_c is not None:
                f.temperature.add_metric(labels, r.temperature_c)
            if r.power_mw is not None:
                f.power.add_metric(labels, r.power_mw / 1000)
            _gpu_limits(f, labels, r)

    def _fill_queue(self, f: _Families) -> None:
        """Who waits, how long the granted waited, grants and reclaims."""
        queued = [r for r in self.broker.live_requests() if r.state is RequestState.QUEUED]
        waiting = Counter(r.job_class.value for r in queued)
        for job_class in JobClass:
            f.queue.add_metric([job_class.value], waiting[job_class.value])
        cumulative, buckets = 0, []
        for bound, n in zip([*map(str, WAIT_BUCKETS), "+Inf"], self.wait_counts, strict=True):
            cumulative += n
            buckets.append((bound, cumulative))
        f.wait.add_metric([], buckets, self.wait_sum)
        f.grants.add_metric([], self.grants)
        for cause, n in sorted(self.reclaims.items()):
            f.reclaims.add_metric([cause], n)


def _device_readings(f: _Families, labels: list[str], r: DeviceReading) -> None:
    if r.utilization_gpu is not None:
        f.utilization.add_metric(labels, r.utilization_gpu)
    if r.memory_used_mib is not None:
        f.memory_used.add_metric(labels, r.memory_used_mib * 2**20)
    if r.memory_total_mib is not None:
        f.memory_total.add_metric(labels, r.memory_total_mib * 2**20)


def _gpu_limits(f: _Families, labels: list[str], r: DeviceReading) -> None:
    """A GPU's own limits and why its clocks are slowed, where NVML says."""
    if r.temperature_slowdown_c is not None:
        f.slowdown.add_metric(labels, r.temperature_slowdown_c)
    if r.temperature_shutdown_c is not None:
        f.shutdown.add_metric(labels, r.temperature_shutdown_c)
    if r.power_limit_mw is not None:
        f.power_limit.add_metric(labels, r.power_limit_mw / 1000)
    if r.clock_event_reasons is not None:
        for bit, reason in CLOCK_REASONS.items():
            f.clock_reasons.add_metric([*labels, reason], float(bool(r.clock_event_reasons & bit)))


class _Families:
    """Every metric family the collector exposes, empty until filled."""

    def __init__(self) -> None:
        def gauge(name: str, doc: str, labels: tuple[str, ...]) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"gpubroker_{name}", doc, labels=list(labels))

        self.utilization = gauge(
            "device_utilization_percent",
            "GPU utilization of a whole GPU or MIG slice (MIG: from GPM, where supported).",
            DEVICE_LABELS,
        )
        self.memory_used = gauge("device_memory_used_bytes", "Memory in use.", DEVICE_LABELS)
        self.memory_total = gauge("device_memory_total_bytes", "Memory.", DEVICE_LABELS)
        self.allocated = gauge(
            "device_allocated", "1 while a lease holds the device, else 0.", DEVICE_LABELS
        )
        self.drained = gauge(
            "device_drained", "1 while the device takes no new grants, else 0.", DEVICE_LABELS
        )
        self.devices = gauge(
            "devices", "Grantable devices by profile and state.", ("profile", "state")
        )
        self.temperature = gauge("gpu_temperature_celsius", "GPU temperature.", GPU_LABELS)
        self.power = gauge("gpu_power_watts", "GPU power draw.", GPU_LABELS)
        self.power_limit = gauge("gpu_power_limit_watts", "GPU enforced power limit.", GPU_LABELS)
        self.slowdown = gauge(
            "gpu_temperature_slowdown_celsius",
            "Temperature at which the GPU slows down (NVML's threshold).",
            GPU_LABELS,
        )
        self.shutdown = gauge(
            "gpu_temperature_shutdown_celsius",
            "Temperature at which the GPU shuts down (NVML's threshold).",
            GPU_LABELS,
        )
        self.clock_reasons = gauge(
            "gpu_clocks_event_reason",
            "1 while this reason slows the GPU's clocks, else 0.",
            (*GPU_LABELS, "reason"),
        )
        self.healthy = gauge(
            "gpu_healthy", "1 when the GPU reads healthy and is not drained, else 0.", GPU_LABELS
        )
        self.queue = gauge("queue_length", "Requests waiting, by job class.", ("job_class",))
        self.share_memory = gauge(
            "share_memory_bytes", "A share's memory of its shared GPU.", SHARE_LABELS
        )
        self.share_memory_used = gauge(
            "share_memory_used_bytes",
            "What a share's processes use of its GPU (NVML's per-process memory).",
            SHARE_LABELS,
        )
        self.share_utilization = gauge(
            "share_utilization_percent",
            "A share's processes' SM utilization together, in percent of its GPU "
            "(NVML's per-process samples).",
            SHARE_LABELS,
        )
        self.wait = HistogramMetricFamily(
            "gpubroker_wait_seconds", "Time granted requests waited in the queue.", labels=[]
        )
        self.grants = CounterMetricFamily("gpubroker_grants", "Grants.", labels=[])
        self.reclaims = CounterMetricFamily(
            "gpubroker_reclaims", "Leases reclaimed, by cause.", labels=["cause"]
        )
        self.hardware_errors = CounterMetricFamily(
            "gpubroker_device_hardware_errors",
            "Hardware Xid and double-bit ECC errors NVML reported, by device and kind.",
            labels=["uuid", "kind"],
        )
        self.alerts = gauge(
            "alert_active", "1 for each active health alert.", ("uuid", "kind", "severity")
        )

    def all(self) -> list[Any]:
        return list(vars(self).values())
