"""The broker's devices, apart from who holds them: drains, vacating, re-cuts, joins.

``Devices`` keeps which GPUs and devices are drained and by whom, which devices an
ended lease's process still runs on (*vacating*: granted to nobody until it is gone),
re-cuts idle MIG GPUs to a plan and adds devices that joined the inventory. It tells
each change as events: one machine-wide, then one to each lease holding the device.
The broker (``core.Broker``) owns one, delegates to it and runs the scheduling pass
after a change that frees devices; what to do with the freed devices is not this
module's job.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from ..wire.errors import NotFound
from .clock import Clock
from .config import BrokerConfig
from .migplan import MigPlan
from .models import Device, Event, Gpu, Inventory, Lease
from .placement import Placer
from .store import Store


class Partitioner(Protocol):
    """Creates and destroys MIG slices (``jupyter_gpubroker.nvml.partitioner``)."""

    def create(self, gpu_uuid: str, profile: str, start: int) -> Device: ...

    def destroy(self, device_uuid: str) -> None: ...


class ProcessProbe(Protocol):
    """What runs on a device (``jupyter_gpubroker.nvml.NvmlBackend``): the pids of its
    compute processes, ``()`` when none or when the device cannot be asked."""

    def compute_pids(self, device_uuid: str) -> tuple[int, ...]: ...


@dataclass(frozen=True)
class Vacating:
    """A device whose lease ended while a process still ran on it: granted to nobody
    until that process is gone, drained once ``vacate_timeout_s`` has passed."""

    since: float
    lease_id: str
    """The lease that ended ("" when the device was found busy at the broker's start)."""
    pids: tuple[int, ...]


Holding = Callable[[Iterable[str]], list[Lease]]
"""The active leases that hold any of these device UUIDs, oldest grant first."""


class Devices:
    """Drains, vacating devices and inventory changes, each told as events."""

    def __init__(
        self,
        store: Store,
        inventory: Inventory,
        placer: Placer,
        clock: Clock,
        *,
        config: BrokerConfig,
        partitioner: Partitioner | None,
        processes: ProcessProbe | None,
        emit: Callable[[Event], None],
        holding: Holding,
    ) -> None:
        """``processes``: what runs on a device. Without one, a lease's devices are free
        the moment it ends (the replay, engines that enforce placement themselves)."""
        self.store, self.placer, self.clock = store, placer, clock
        self.inventory = inventory
        """The inventory as placement has it now (after re-cuts and devices that joined)."""
        self.config = config
        """Read at each look, so a changed ``vacate_timeout_s`` counts at once."""
        self.partitioner, self.processes = partitioner, processes
        self._emit, self._holding = emit, holding
        self._drains: dict[str, tuple[str, float]] = {}
        self._drain_cause: dict[str, str] = {}
        """Who drained each drained device: ``health`` lifts only its own drains."""
        self._vacating: dict[str, Vacating] = {}

    def restore(self, held: Iterable[str], now: float) -> None:
        """After a start: the drains the store has, and the devices outside ``held`` that
        a process still runs on (a lease ended before the restart, its process lingers)."""
        self._drains = self.store.drains()
        self._drain_cause = self.store.drain_causes()
        for uuid in self._drains:
            self.placer.drain(uuid)
        held = set(held)
        for uuid in [u for u in self.placer.devices if u not in held]:
            pids = self._pids(uuid)
            if pids:
                self.placer.hold([uuid])
                self._vacating[uuid] = Vacating(now, "", pids)

    # -- drains

    def drain(
        self, uuid: str, reason: str, cause: str = "admin", *, take_over: bool = False
    ) -> None:
        """``Broker.drain``."""
        if uuid not in self.placer.gpus and uuid not in self.placer.devices:
            raise NotFound(f"no GPU or device {uuid!r}")
        if not take_over and self._drain_cause.get(uuid, "health") != "health":
            cause = self._drain_cause[uuid]  # a health fault does not take an admin's drain over
        drained = self._drains.get(uuid)
        if drained is not None and (drained[0], self._drain_cause[uuid]) == (reason, cause):
            return
        now = self.clock.now()
        since = self._drains.get(uuid, (reason, now))[1]
        with self.store.transaction():
            self.store.set_drain(uuid, reason, since, cause)
        self._drains[uuid] = (reason, since)
        self._drain_cause[uuid] = cause
        self.placer.drain(uuid)
        self._device_event("drained", uuid, now, reason)

    def undrain(self, uuid: str, reason: str) -> None:
        """``Broker.undrain``, but for the scheduling pass."""
        if uuid not in self._drains:
            raise NotFound(f"{uuid!r} is not drained")
        with self.store.transaction():
            self.store.clear_drain(uuid)
        del self._drains[uuid], self._drain_cause[uuid]
        self.placer.undrain(uuid)
        self._device_event("undrained", uuid, self.clock.now(), reason)

    def drained(self) -> dict[str, tuple[str, float]]:
        return dict(self._drains)

    def drain_cause(self, uuid: str) -> str | None:
        return self._drain_cause.get(uuid)

    def drain_causes(self) -> dict[str, str]:
        return dict(self._drain_cause)

    def drained_by(self, cause: str) -> set[str]:
        return {uuid for uuid, c in self._drain_cause.items() if c == cause}

    # -- reserved for the broker's own use

    def reserve(self, uuids: Iterable[str]) -> None:
        """Grant these free devices to nobody while the broker itself uses them (the
        suspend canary, a kernel moving onto them); not kept over a restart."""
        self.placer.hold(uuids)

    def unreserve(self, uuids: Iterable[str]) -> None:
        """Devices ``reserve`` took, free again (the broker schedules next)."""
        self.placer.release(uuids)

    # -- vacating

    def vacating(self) -> dict[str, Vacating]:
        return dict(self._vacating)

    def vacate(self, lease: Lease, now: float) -> None:
        """Give an ended lease's devices back, each once no process runs on it.

        The rule: a device that the probe shows a compute process on when its lease ends
        (the previous holder's: nobody else was allowed on it) stays out of placement as
        *vacating*; ``check_vacating`` frees it once the probe shows it empty, or drains
        it, naming the process, after ``vacate_timeout_s``. A device showing nothing is
        free at once, so an ordinary release is granted again in the same pass.
        """
        busy = {d: self._pids(d) for d in lease.devices}
        self.placer.release(d for d, pids in busy.items() if not pids)
        for d, pids in busy.items():
            if pids:
                self._vacating[d] = Vacating(now, lease.id, pids)
                detail = {"device": d, "pids": list(pids)}
                self._emit(Event("vacating", now, lease.user, lease.request_id, lease.id, detail))

    def check_vacating(self, now: float) -> None:
        """Free each vacating device its process has left; drain one it has not left
        within ``vacate_timeout_s``."""
        for uuid, v in list(self._vacating.items()):
            pids = self._pids(uuid)
            if pids and now - v.since < self.config.vacate_timeout_s:
                continue
            del self._vacating[uuid]
            if pids:
                after = f"lease {v.lease_id} ended" if v.lease_id else "the broker started"
                self.drain(
                    uuid,
                    f"process {pids[0]} still ran on it {now - v.since:.0f} s after {after}; "
                    "undrain it once that process is gone",
                    cause="vacate",
                )
            self.placer.release([uuid])
            if not pids:
                self._emit(Event("vacated", now, "", lease_id=v.lease_id, detail={"device": uuid}))

    def _pids(self, uuid: str) -> tuple[int, ...]:
        if self.processes is None or uuid not in self.placer.devices:
            return ()
        return self.processes.compute_pids(uuid)

    # -- the inventory changes

    def repartition(self, plan: MigPlan) -> list[Device]:
        """Re-cut a GPU to ``plan``: its idle slices destroyed, the planned one created."""
        assert self.partitioner is not None
        for d in plan.destroy:
            self.partitioner.destroy(d.uuid)
            self.placer.remove(d.uuid)
        created = self.partitioner.create(plan.gpu.uuid, plan.profile.name, plan.start)
        self.placer.add(created)
        self._sync_inventory()
        self._emit(
            Event(
                "repartitioned",
                self.clock.now(),
                "",
                detail={
                    "gpu": plan.gpu.uuid,
                    "destroyed": [d.uuid for d in plan.destroy],
                    "created": created.uuid,
                },
            )
        )
        return [created]

    def add(self, gpus: Iterable[Gpu], devices: Iterable[Device]) -> list[Device]:
        """``Broker.add_devices``, but for the scheduling pass."""
        added = [d for d in devices if d.uuid not in self.placer.devices]
        if not added:
            return []
        for g in gpus:
            self.placer.gpus.setdefault(g.uuid, g)
        for d in added:
            self.placer.add(d)
        self._sync_inventory()
        return added

    def _sync_inventory(self) -> None:
        self.inventory = Inventory(
            tuple(self.placer.gpus.values()), tuple(self.placer.devices.values())
        )

    def _device_event(self, kind: str, uuid: str, now: float, reason: str) -> None:
        """A machine-wide event about a GPU or device, then one to each lease holding it."""
        detail = {"device": uuid, "reason": reason}
        self._emit(Event(kind, now, "", detail=detail))
        for lease in self._holding(d.uuid for d in self.placer.under(uuid)):
            self._emit(Event.of_lease(kind, self.clock.now(), lease, detail))
