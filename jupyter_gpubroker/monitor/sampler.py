"""One sampling pass: read every GPU and MIG slice, record, judge health and leases.

The host (``GPUBroker``) runs a pass every ``sample_interval`` seconds: :meth:`Sampler.read`
(NVML only, so it may run on a worker thread), then :meth:`Sampler.apply` on the
broker's thread, which records the samples, drains or recovers GPUs as the
``HealthJudge`` decides, starts and ends health alerts as the ``AlertJudge`` decides
(each change handed to ``on_alert``: the host publishes it), observes each lease (its
devices' readings and, through a ``KernelSource``, its kernel), lets the
``Reclaimer`` warn and reclaim, and records when each lease's kernel was busy
(``recorded.Activity``). It returns the reclaimer's decisions for the host to carry out
on the kernels.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from ..broker.alerts import AlertChange, AlertJudge
from ..broker.core import Broker
from ..broker.health import HealthJudge
from ..broker.models import DeviceEvent, DeviceReading, Inventory, Lease, ProcessInfo, ShareUse
from ..broker.reclaim import Decision, KernelState, Observation, Reclaimer
from ..broker.recorded import Activity
from .outside import OutsideWatch, Proc
from .samples import SampleStore


class Reader(Protocol):
    """What the sampler reads through: an ``NvmlBackend``."""

    def read_all(self, inventory: Inventory | None = None) -> dict[str, DeviceReading]: ...

    def poll_events(self) -> list[DeviceEvent]: ...


class KernelSource(Protocol):
    """The kernels behind leases, as the host sees them (``server.reclaimer``)."""

    def observe(self, holders: Iterable[str]) -> dict[str, KernelState]:
        """The state of each holder that is a kernel the host knows; it may forget others."""
        ...


class KernelActions(KernelSource, Protocol):
    """A ``KernelSource`` that also acts on the kernel of a reclaimed lease."""

    async def act(self, kernel_id: str, action: str) -> None:
        """``shutdown`` the kernel of a reclaimed lease; ``revoke``: interrupt it;
        ``suspend``: nothing (the broker suspended it, it runs on)."""
        ...

    def handles(self, kernel_id: str) -> bool:
        """Whether the host starts, restarts or shuts down the kernel now, or runs it."""
        ...

    def running(self) -> list[tuple[str, str]]:
        """The host's kernels that run now, each (its user, its id), where the user is
        known: their tokens live on (``runtime.tokens``)."""
        ...

    def user_of(self, kernel_id: str) -> str | None:
        """The user a kernel of the host's own (its kernel manager's, in any state) is
        charged to; None: not the host's, or its user is not known."""
        ...


class Sampler:
    def __init__(
        self,
        broker: Broker,
        reader: Reader,
        samples: SampleStore,
        health: HealthJudge,
        reclaimer: Reclaimer,
        log: logging.Logger | None = None,
        alerts: AlertJudge | None = None,
    ) -> None:
        self.broker, self.reader, self.samples = broker, reader, samples
        self.health, self.reclaimer, self.alerts = health, reclaimer, alerts
        self.on_alert: Callable[[AlertChange], None] | None = None
        self.on_drain: Callable[[str, tuple[str, ...], str], None] | None = None
        """Told each GPU its health check drains: (its UUID, the kinds of fault, why)."""
        self.hardware_errors: Counter[tuple[str, str]] = Counter()
        """Xid and ECC events since the start, by (UUID, kind): what ``/metrics`` counts."""
        self.log = log or logging.getLogger(__name__)
        self.kernels: KernelSource | None = None
        self.reported: dict[str, KernelState] = {}
        """Kernel states their holders reported with their leases' last renewal, by lease
        id: the kernels of other servers (remote mode), judged where the host has none."""
        self.latest: dict[str, DeviceReading] = {}
        """The last pass's readings, by GPU or device UUID."""
        self.outside: OutsideWatch | None = None
        """Matches NVML's processes to the leases (local GPUs only)."""
        self.procs: Mapping[int, Proc] = {}
        """The last pass's processes as the OS describes them (when outside use is watched)."""
        self.activity = Activity(broker.store)
        """Records each lease's busy spans, as the reclaimer judges them (``whatif``)."""
        gpus = {g.uuid for g in broker.inventory.gpus}
        health.adopt(broker.drained_by("health") & gpus, broker.clock.now())

    def read(self) -> tuple[dict[str, DeviceReading], list[DeviceEvent], dict[int, Proc]]:
        """Read NVML, and the OS's word on the processes it lists when outside use is
        watched (no store, no broker change: safe on a worker thread)."""
        readings = self.reader.read_all(self.broker.inventory)
        procs = {}
        if self.outside is not None:
            pids = (p.pid for r in readings.values() for p in r.processes)
            procs = self.outside.processes.read(pids)
        return readings, self.reader.poll_events(), procs

    def apply(
        self,
        readings: dict[str, DeviceReading],
        events: list[DeviceEvent],
        procs: dict[int, Proc] | None = None,
    ) -> list[Decision]:
        """Record a pass's readings, act on health and outside use, judge the leases."""
        broker, now = self.broker, self.broker.clock.now()
        self.latest, self.procs = readings, procs or {}
        self.samples.record(now, readings, events)
        for e in events:
            self.log.warning("GPU broker: %s %s on %s", e.kind, e.code or "", e.uuid)
            self.hardware_errors[e.uuid, e.kind] += 1
        inventory = broker.inventory
        gpu_of = {g.uuid: g.uuid for g in inventory.gpus} | {
            d.uuid: d.gpu_uuid for d in inventory.devices
        }
        for change in self.health.assess(now, readings, events, gpu_of):
            if change.drain:
                self.log.warning("GPU broker: draining GPU %s: %s", change.gpu_uuid, change.reason)
                broker.drain(change.gpu_uuid, change.reason, cause="health")
                if self.on_drain is not None:
                    kinds = self.health.unhealthy(change.gpu_uuid)
                    self.on_drain(change.gpu_uuid, kinds, change.reason)
            elif change.gpu_uuid in broker.drained_by("health"):
                self.log.info("GPU broker: GPU %s is back: %s", change.gpu_uuid, change.reason)
                broker.undrain(change.gpu_uuid, change.reason)
        outside = None if self.outside is None else self.outside.step(readings, procs or {})
        if self.alerts is not None:
            for alert in self.alerts.assess(now, inventory, readings, events, outside):
                log = self.log.info if alert.state == "ended" else self.log.warning
                log("GPU broker: alert %s: %s", alert.state, alert.alert.message)
                if self.on_alert is not None:
                    self.on_alert(alert)
        decisions = self.reclaimer.step(self.observe(readings))
        idle = {x.id: (x.granted_at, self.reclaimer.idle_s(x.id)) for x in broker.leases()}
        self.activity.look(now, {k: (t, s) for k, (t, s) in idle.items() if s is not None})
        return decisions

    def sample(self) -> list[Decision]:
        """A whole pass on the calling thread."""
        return self.apply(*self.read())

    def observe(self, readings: Mapping[str, DeviceReading]) -> dict[str, Observation]:
        """Each active lease's devices (and kernel, when a source knows it) right now."""
        leases = self.broker.leases()
        holders = {x.id: self.broker.request(x.request_id).holder for x in leases}
        kernels = self.kernels.observe(set(holders.values()) - {""}) if self.kernels else {}
        for ended in self.reported.keys() - holders.keys():
            del self.reported[ended]
        observed = {}
        for lease in leases:
            if lease.shared:
                kernel = kernels.get(holders[lease.id]) or self.reported.get(lease.id)
                observed[lease.id] = self._share_observation(lease, readings, kernel)
                continue
            seen = [readings[d] for d in lease.devices if d in readings]
            utilization = [r.utilization_gpu for r in seen if r.utilization_gpu is not None]
            memory = [r.memory_used_mib for r in seen if r.memory_used_mib is not None]
            observed[lease.id] = Observation(
                utilization=max(utilization) if utilization else None,
                memory_used_mib=float(sum(memory)) if memory else None,
                processes=sum(len(r.processes) for r in seen) if seen else None,
                kernel=kernels.get(holders[lease.id]) or self.reported.get(lease.id),
            )
        return observed

    def _share_observation(
        self, lease: Lease, readings: Mapping[str, DeviceReading], kernel: KernelState | None
    ) -> Observation:
        """A share's look: its own processes' memory, and how many run outside MPS (the
        GPU's utilization is its shares' together: its activity is its footprint)."""
        used = self.share_processes(lease, readings)
        if used is None:
            return Observation(kernel=kernel)
        return Observation(
            memory_used_mib=float(share_used_mib(used)),
            processes=len(used),
            outside_mps=sum(not p.mps for p in used.values()),
            kernel=kernel,
        )

    def share_processes(
        self, lease: Lease, readings: Mapping[str, DeviceReading]
    ) -> dict[int, ProcessInfo] | None:
        """A share's own processes on its GPU as NVML lists them (their memory, whether
        under MPS): those descending from its holder process, or where the holder is not
        known, its user's when the user has no other share there. None: not known."""
        reading = readings.get(lease.devices[0])
        if reading is None or self.outside is None:
            return None
        holder = self.outside.holder_pids.get(lease.id)
        mine = {}
        others = [x for x in self.broker.sharers().get(lease.devices[0], []) if x.id != lease.id]
        alone = not any(x.user == lease.user for x in others)
        for p in reading.processes:
            proc = self.procs.get(p.pid)
            if proc is None:
                continue
            if (holder is not None and holder in proc.chain) or (
                holder is None and alone and proc.user == lease.user
            ):
                mine[p.pid] = p
        return mine


def share_used_mib(processes: Mapping[int, ProcessInfo]) -> int:
    """What a share's processes use of its GPU together, in MiB."""
    return sum(p.used_memory_mib or 0 for p in processes.values())


def share_use(processes: Mapping[int, ProcessInfo] | None) -> ShareUse:
    """A share's memory in use and utilization: its processes' together (utilization at
    most 100%; None where NVML gives any of them none). None: its processes not known."""
    if processes is None:
        return ShareUse()
    loads = [p.utilization for p in processes.values()]
    utilization = None if None in loads else min(100.0, sum(x or 0.0 for x in loads))
    return ShareUse(share_used_mib(processes), utilization)
