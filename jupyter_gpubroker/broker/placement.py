"""Where a request goes: which free devices satisfy it, and how to cut new MIG slices.

``best_fit`` packs: a MIG request takes a free slice on the GPU that is
already the busiest, and a memory request takes the smallest device that is
large enough, so whole GPUs and large slices stay free for the requests that
need them. ``first_fit`` takes the first free device in inventory order, as a
plain FCFS scheduler does.

Dynamic MIG (optional): when no free slice of a wanted profile exists, a GPU
in MIG mode may be re-cut: idle slices that overlap a valid placement are
destroyed and a new one created there. The plan picks the placement that
destroys the least compute, on the busiest GPU, at the highest start (small
profiles at the top of the GPU keep slot 0 free for the large ones).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from .models import Device, Gpu, Inventory, Size
from .profiles import CATALOG, GpuModel, MigProfile

WHOLE_GPU = "gpu"


def device_class(d: Device) -> str:
    """The free-list a device belongs to: its MIG profile, or ``gpu``."""
    return d.profile if d.profile is not None else WHOLE_GPU


@dataclass(frozen=True)
class MigPlan:
    """Re-cut ``gpu``: destroy the idle ``destroy`` slices, then create ``profile`` at ``start``."""

    gpu: Gpu
    profile: MigProfile
    start: int
    destroy: tuple[Device, ...]


class Placer:
    """The devices of an inventory, which are free, and how busy each GPU is."""

    def __init__(self, inventory: Inventory) -> None:
        self.gpus = {g.uuid: g for g in inventory.gpus}
        self.devices: dict[str, Device] = {}
        self.free: dict[str, set[str]] = defaultdict(set)
        self.busy_slices: dict[str, int] = defaultdict(int)
        """Held compute slices per GPU uuid, for packing."""
        self.held: set[str] = set()
        self.drained: set[str] = set()
        """Drained GPU or device UUIDs: never placed on, whether free or held."""
        for d in inventory.devices:
            self.add(d)

    # -- bookkeeping

    def add(self, d: Device) -> None:
        self.devices[d.uuid] = d
        if not self.is_drained(d):
            self.free[device_class(d)].add(d.uuid)

    def remove(self, uuid: str) -> None:
        d = self.devices.pop(uuid)
        self.free[device_class(d)].discard(uuid)

    def hold(self, uuids: Iterable[str]) -> None:
        for u in uuids:
            d = self.devices.get(u)
            if d is None:  # held since before a restart, gone from the inventory now
                continue
            if not self.is_drained(d):  # a drained device is in no free list
                self.free[device_class(d)].remove(u)
            self.busy_slices[d.gpu_uuid] += d.compute_slices
            self.held.add(u)

    def release(self, uuids: Iterable[str]) -> None:
        for u in uuids:
            d = self.devices.get(u)
            if d is None:  # left the inventory while held
                continue
            self.held.discard(u)
            if not self.is_drained(d):
                self.free[device_class(d)].add(u)
            self.busy_slices[d.gpu_uuid] -= d.compute_slices

    def drain(self, uuid: str) -> None:
        """Place nothing more on ``uuid``: a GPU (with every device on it) or one device."""
        self.drained.add(uuid)
        for d in self.under(uuid):
            self.free[device_class(d)].discard(d.uuid)

    def undrain(self, uuid: str) -> None:
        self.drained.discard(uuid)
        for d in self.under(uuid):
            if d.uuid not in self.held and not self.is_drained(d):
                self.free[device_class(d)].add(d.uuid)

    def is_drained(self, d: Device) -> bool:
        return d.uuid in self.drained or d.gpu_uuid in self.drained

    def under(self, uuid: str) -> list[Device]:
        """The devices a GPU UUID covers (every one on it), or the one device UUID names."""
        return [d for d in self.devices.values() if uuid in (d.uuid, d.gpu_uuid)]

    def is_free(self, uuid: str) -> bool:
        d = self.devices.get(uuid)
        return d is not None and uuid in self.free[device_class(d)]

    @property
    def total_gpu_equivalents(self) -> float:
        return sum(d.gpu_equivalents for d in self.devices.values())

    # -- questions

    def compatible(self, size: Size) -> list[Device]:
        """Every device, free or held, that could host one unit of ``size``."""
        if size.gpus is not None:
            return [d for d in self.devices.values() if d.kind == "gpu"]
        if size.profile is not None:
            return [d for d in self.devices.values() if d.profile == size.profile]
        assert size.min_memory_gb is not None
        need = size.min_memory_gb * 1024
        return [d for d in self.devices.values() if d.memory_mib >= need]

    def has_free_for(self, size: Size) -> bool:
        """Is there at least one free device this size could use? (cheap pre-check)"""
        if size.gpus is not None:
            return bool(self.free[WHOLE_GPU])
        if size.profile is not None:
            return bool(self.free[size.profile])
        need = (size.min_memory_gb or 0) * 1024
        return any(
            self.devices[u].memory_mib >= need for uuids in self.free.values() for u in uuids
        )

    def units(self, size: Size) -> int:
        return size.gpus if size.gpus is not None else 1

    def find(
        self, size: Size, strategy: str, exclude: AbstractSet[str] = frozenset()
    ) -> list[Device] | None:
        """Free devices for ``size`` (none of ``exclude``), or None if it does not fit now."""
        if size.gpus is not None:
            return self._find_gpus(size.gpus, strategy, exclude)
        if size.profile is not None:
            cands = [self.devices[u] for u in self.free[size.profile] if u not in exclude]
        else:
            need = (size.min_memory_gb or 0) * 1024
            cands = [
                self.devices[u]
                for uuids in self.free.values()
                for u in uuids
                if u not in exclude and self.devices[u].memory_mib >= need
            ]
        if not cands:
            return None
        if strategy == "first_fit":
            return [min(cands, key=lambda d: (d.gpu_index, d.start or 0))]
        return [min(cands, key=self._best_fit_key)]

    def _find_gpus(self, n: int, strategy: str, exclude: AbstractSet[str]) -> list[Device] | None:
        """``n`` free whole GPUs on one node: on the first node that has them
        (``first_fit``), or on the node with the fewest free that still fits, so whole
        nodes stay free for large requests. One machine is one node."""
        by_node: dict[str, list[Device]] = defaultdict(list)
        for u in self.free[WHOLE_GPU]:
            if u not in exclude:
                d = self.devices[u]
                by_node[d.node].append(d)
        fits = [(node, ds) for node, ds in by_node.items() if len(ds) >= n]
        if not fits:
            return None
        if strategy == "first_fit":
            _, cands = min(fits, key=lambda x: x[0])
        else:
            _, cands = min(fits, key=lambda x: (len(x[1]), x[0]))
        cands.sort(key=lambda d: d.gpu_index)
        return cands[:n]

    def _best_fit_key(self, d: Device) -> tuple[int, int, str, int, int]:
        return (d.memory_mib, -self.busy_slices[d.gpu_uuid], d.node, d.gpu_index, d.start or 0)

    def plan_mig(
        self, profile_name: str, exclude: AbstractSet[str] = frozenset()
    ) -> MigPlan | None:
        """How to cut a new ``profile_name`` slice from idle capacity, if any GPU can."""
        best: tuple[tuple[int, int, int], MigPlan] | None = None
        for gpu in self.gpus.values():
            if gpu.uuid in self.drained:
                continue
            model = CATALOG.get(gpu.model or "")
            profile = model.profile(profile_name) if model and gpu.mig_enabled else None
            if model is None or profile is None:
                continue
            slices = [
                d for d in self.devices.values() if d.gpu_uuid == gpu.uuid and d.kind == "mig"
            ]
            for start in profile.starts:
                span = set(profile.slots(start))
                overlap = [d for d in slices if span & _memory_slices(model, d)]
                if any(not self.is_free(d.uuid) or d.uuid in exclude for d in overlap):
                    continue
                kept = sum(1 for d in slices if d.profile == profile_name and d not in overlap)
                if kept >= profile.max_count:
                    continue
                cost = (sum(d.compute_slices for d in overlap), -self.busy_slices[gpu.uuid], -start)
                if best is None or cost < best[0]:
                    best = (cost, MigPlan(gpu, profile, start, tuple(overlap)))
        return best[1] if best else None


def _memory_slices(model: GpuModel, d: Device) -> set[int]:
    """The memory slices MIG slice ``d`` occupies on a GPU of ``model``."""
    p = model.profile(d.profile or "")
    return set(p.slots(d.start or 0)) if p else set()
