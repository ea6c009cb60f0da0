"""Where a request goes: which free devices satisfy it, and how to cut new MIG slices.

``best_fit`` packs: a MIG request takes a free slice on the GPU that is
already the busiest, and a memory request takes the smallest device that is
large enough, so whole GPUs and large slices stay free for the requests that
need them. ``first_fit`` takes the first free device in inventory order, as a
plain FCFS scheduler does.

Dynamic MIG's re-cuts are planned by ``migplan``; shares of GPUs are placed by
``shares``.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from ..wire.sizes import Size, gb_to_mib
from .lazyheap import LazyHeap
from .migplan import Cut, plan
from .migplan import MigPlan as MigPlan
from .models import Device, Inventory
from .shapes import WHOLE_GPU, Shape, device_class, shape
from .shares import SharePool, share_mib
from .sharing import Sharing

KTH_INDEXED = 8
"""Reservations of up to this many whole GPUs find their node from an index; larger
ones (only a machine with more GPUs per node can host them) scan the nodes."""


@dataclass(frozen=True)
class Groups:
    """The devices as a list-schedule (``eta.list_schedule``) walks them."""

    by_class: dict[str, list[str]]
    """Free-list class -> its devices (not those on ``by_gpu``'s GPUs)."""
    largest: dict[str, int]
    """Per class, the memory (MiB) of its largest device, for memory-sized requests."""
    by_gpu: dict[str, list[tuple[str, int]]]
    """A MIG GPU seen as its compute slices -> its devices and their slices."""
    drained: frozenset[str]
    """The drained devices, and the GPUs drained whole."""


class Placer:
    """The devices of an inventory, which are free, and how busy each GPU is.

    Every question a scheduling pass asks (is anything free for this size, which
    device fits best, where does the top blocked request start) is answered from
    indexes kept up to date on each hold, release and drain, so a decision costs the
    same on a cluster of thousands of GPUs as on one machine: free devices ordered
    for best fit and first fit per shape, free whole GPUs per node, and per node the
    expected free times of its devices. A GPU holding shares (``shares.SharePool``)
    is held, and one lent as shares only is in no free list, for every other size."""

    def __init__(
        self, inventory: Inventory, sharing: Sharing | None = None, now: float = 0.0
    ) -> None:
        self.sharing = sharing or Sharing()
        """The admin's rules of which GPUs are lent whole, shared or both, and when."""
        self.shares = SharePool()
        self.share_only: set[str] = set()
        """GPUs lent as ``shared`` only now: closed to whole requests, as drained ones."""
        self._now = now
        self.gpus = {g.uuid: g for g in inventory.gpus}
        self.devices: dict[str, Device] = {}
        self.free: dict[str, set[str]] = defaultdict(set)
        self.busy_slices: dict[str, int] = defaultdict(int)
        """Held compute slices per GPU uuid, for packing."""
        self.held: set[str] = set()
        self.drained: set[str] = set()
        """Drained GPU or device UUIDs: never placed on, whether free or held."""
        self.until: dict[str, float] = {}
        """Held device -> its lease's expected end (a device held without a lease,
        vacating, is idle for reservations)."""
        self._gpu_eq: float | None = None
        self._on_gpu: dict[str, dict[str, Device]] = defaultdict(dict)
        self._count: dict[Shape, int] = defaultdict(int)
        """Devices per shape, free or not, drained or not."""
        self._gpus_on_node: dict[str, int] = defaultdict(int)
        """Whole GPUs per node (free or held): the most one grant can have."""
        self._free_shape: dict[Shape, set[str]] = defaultdict(set)
        self._best: dict[Shape, LazyHeap] = defaultdict(LazyHeap)
        self._first: dict[Shape, LazyHeap] = defaultdict(LazyHeap)
        self._free_gpus: dict[str, set[str]] = defaultdict(set)
        """Node -> its free whole GPUs."""
        self._nodes_by_free: dict[int, list[str]] = defaultdict(list)
        """n -> the nodes with exactly n free whole GPUs, sorted."""
        self._ends: dict[Shape, dict[str, list[tuple[float, str]]]] = defaultdict(dict)
        """Shape -> node -> (expected free time, uuid) of its undrained devices, sorted;
        -inf for an idle device."""
        self._gpu_ends: dict[str, list[tuple[float, str]]] = {}
        """The same for the whole GPUs of each node, of every shape."""
        self._soonest: dict[Shape, LazyHeap] = defaultdict(LazyHeap)
        """Shape -> the nodes by the first expected free time of their devices."""
        self._kth: dict[int, LazyHeap] = defaultdict(LazyHeap)
        """k -> the nodes by the k-th expected free time of their whole GPUs."""
        self._indexed: dict[str, float] = {}
        """The free time each undrained device is filed under in ``_ends``."""
        self._groups: dict[bool, Groups] = {}
        """``groups``' answers until a device is added, removed, drained or undrained."""
        self._found: dict[tuple[Size, str, AbstractSet[str]], list[Device] | None] = {}
        """``find``'s answers since the last change: a pass asks the same of every
        candidate of a size that does not fit."""
        self._cuts: dict[str, dict[tuple[str, AbstractSet[str]], Cut | None]] = {}
        """GPU -> its cheapest MIG cut per (profile, excluded devices on it), until a
        device on it changes: every waiting slice asks for a re-cut in every pass, and
        a pass changes few GPUs."""
        for d in inventory.devices:
            self.add(d)

    # -- bookkeeping

    def add(self, d: Device) -> None:
        self._groups.clear()
        self.devices[d.uuid] = d
        self._on_gpu[d.gpu_uuid][d.uuid] = d
        self._count[shape(d)] += 1
        if d.kind == "gpu":
            self._gpus_on_node[d.node] += 1
        self._gpu_eq = None
        gpu = self.gpus.get(d.gpu_uuid)
        if d.kind == "gpu" and gpu is not None and self.sharing.ever_shared(gpu):
            mode = self.sharing.mode(gpu, self._now)
            self.shares.add(d, mode)
            self.shares.set_drained(d.uuid, self.is_drained(d))
            if mode == "shared":
                self.share_only.add(d.uuid)
        if not self._closed(d):
            self.free[device_class(d)].add(d.uuid)
        self._refresh(d)

    def remove(self, uuid: str) -> None:
        self._groups.clear()
        d = self.devices.pop(uuid)
        del self._on_gpu[d.gpu_uuid][uuid]
        self._count[shape(d)] -= 1
        if d.kind == "gpu":
            self._gpus_on_node[d.node] -= 1
        self._gpu_eq = None
        self.free[device_class(d)].discard(uuid)
        self.until.pop(uuid, None)
        self.shares.remove(uuid)
        self.share_only.discard(uuid)
        self._refresh(d)

    def hold(self, uuids: Iterable[str], until: float | None = None) -> None:
        """Take devices out of the free lists; ``until``: the lease's expected end."""
        for u in uuids:
            d = self.devices.get(u)
            if d is None:  # held since before a restart, gone from the inventory now
                continue
            self._take(d, until)
            self.shares.set_whole(u, -math.inf if until is None else until)

    def _take(self, d: Device, until: float | None) -> None:
        if not self._closed(d):  # a drained device is in no free list
            self.free[device_class(d)].remove(d.uuid)
        self.busy_slices[d.gpu_uuid] += d.compute_slices
        self.held.add(d.uuid)
        if until is not None:
            self.until[d.uuid] = until
        self._refresh_gpu(d)

    def expect(self, uuids: Iterable[str], until: float) -> None:
        """Held devices' lease now ends at ``until`` (its time limit was extended)."""
        for u in uuids:
            if u in self.until:
                self.until[u] = until
                self.shares.set_whole(u, until)
                self._refresh(self.devices[u])

    def ended(self, uuids: Iterable[str]) -> None:
        """Their lease ended: idle for reservations from now, freed or still vacating."""
        for u in uuids:
            if self.until.pop(u, None) is not None:
                self.shares.set_whole(u, -math.inf)
                self._refresh(self.devices[u])

    def release(self, uuids: Iterable[str]) -> None:
        for u in uuids:
            d = self.devices.get(u)
            if d is None:  # left the inventory while held
                continue
            self._give(d)
            self.shares.set_whole(u, None)

    def _give(self, d: Device) -> None:
        self.held.discard(d.uuid)
        self.until.pop(d.uuid, None)
        if not self._closed(d):
            self.free[device_class(d)].add(d.uuid)
        self.busy_slices[d.gpu_uuid] -= d.compute_slices
        self._refresh_gpu(d)

    # -- shares (``shares.SharePool``)

    def share(self, lease_id: str, uuid: str, mib: int, until: float) -> None:
        """A share of ``mib`` on GPU ``uuid``, expected to end at ``until``: the GPU is
        held (for every other size) until its last share is expected to end."""
        d = self.devices.get(uuid)
        if d is None:  # held since before a restart, gone from the inventory now
            return
        first = not self.shares.shares.get(uuid)
        self.shares.put(uuid, lease_id, mib, until)
        if first:
            self._take(d, until)
        else:
            self._expect_last(d)

    def unshare(self, lease_id: str, uuid: str) -> None:
        d = self.devices.get(uuid)
        if d is None:  # left the inventory while held
            return
        self.shares.take(uuid, lease_id)
        if self.shares.shares.get(uuid):
            self._expect_last(d)
        elif uuid in self.held:
            self._give(d)

    def expect_share(self, lease_id: str, uuid: str, until: float) -> None:
        """A share's lease now ends at ``until`` (its time limit was extended)."""
        self.shares.expect(uuid, lease_id, until)
        self._expect_last(self.devices[uuid])

    def _expect_last(self, d: Device) -> None:
        self.until[d.uuid] = self.shares.last_end(d.uuid) or -math.inf
        self._refresh(d)

    def set_time(self, now: float) -> None:
        """Lend each GPU as the sharing rules say at ``now`` (a rule's window opened or
        closed): nothing held is taken back, only new placements change."""
        self._now = now
        for uuid in list(self.shares.capacity):
            d = self.devices[uuid]
            mode = self.sharing.mode(self.gpus[d.gpu_uuid], now)
            if mode == self.shares.mode.get(uuid):
                continue
            self.shares.set_mode(uuid, mode)
            (self.share_only.add if mode == "shared" else self.share_only.discard)(uuid)
            self._groups.clear()
            free = self.free[WHOLE_GPU]
            (free.add if uuid not in self.held and not self._closed(d) else free.discard)(uuid)
            self._refresh(d)

    def _forget(self) -> None:
        """A drain changed: the groups, ``find``'s answers and every GPU's cuts no longer hold."""
        self._groups.clear()
        self._found.clear()
        self._cuts.clear()

    def drain(self, uuid: str) -> None:
        """Place nothing more on ``uuid``: a GPU (with every device on it) or one device."""
        self.drained.add(uuid)
        self._forget()  # a GPU with no slice left has no device to refresh
        for d in self.under(uuid):
            self.free[device_class(d)].discard(d.uuid)
            self.shares.set_drained(d.uuid, True)
            self._refresh(d)

    def undrain(self, uuid: str) -> None:
        self.drained.discard(uuid)
        self._forget()
        for d in self.under(uuid):
            if d.uuid not in self.held and not self._closed(d):
                self.free[device_class(d)].add(d.uuid)
            self.shares.set_drained(d.uuid, self.is_drained(d))
            self._refresh(d)

    def is_drained(self, d: Device) -> bool:
        return d.uuid in self.drained or d.gpu_uuid in self.drained

    def _closed(self, d: Device) -> bool:
        """Placed on by no whole or memory-sized request: drained, or shared only."""
        return d.uuid in self.share_only or self.is_drained(d)

    def groups(self, by_slices: bool) -> Groups:
        """The devices grouped for a list-schedule; ``by_slices``: every MIG GPU as its
        compute slices (dynamic MIG re-cuts idle ones). Kept between changes of the
        devices, since a pass list-schedules several times."""
        if by_slices not in self._groups:
            mig = {g.uuid for g in self.gpus.values() if g.mig_enabled} if by_slices else set()
            by_class: dict[str, list[str]] = defaultdict(list)
            largest: dict[str, int] = defaultdict(int)
            by_gpu: dict[str, list[tuple[str, int]]] = {g: [] for g in mig}
            for d in self.devices.values():
                if d.kind == "mig" and d.gpu_uuid in mig:
                    by_gpu[d.gpu_uuid].append((d.uuid, d.compute_slices))
                else:
                    c = device_class(d)
                    by_class[c].append(d.uuid)
                    largest[c] = max(largest[c], d.memory_mib)
            drained = {d.uuid for d in self.devices.values() if self._closed(d)}
            self._groups[by_slices] = Groups(
                dict(by_class), dict(largest), by_gpu, frozenset(drained | self.drained)
            )
        return self._groups[by_slices]

    def under(self, uuid: str) -> list[Device]:
        """The devices a GPU UUID covers (every one on it), or the one device UUID names."""
        if uuid in self._on_gpu:
            return list(self._on_gpu[uuid].values())
        d = self.devices.get(uuid)
        return [d] if d is not None else []

    def is_free(self, uuid: str) -> bool:
        d = self.devices.get(uuid)
        return d is not None and uuid in self.free[device_class(d)]

    @property
    def total_gpu_equivalents(self) -> float:
        if self._gpu_eq is None:  # summed again only after the devices change
            self._gpu_eq = sum(d.gpu_equivalents for d in self.devices.values())
        return self._gpu_eq

    def _refresh_gpu(self, changed: Device) -> None:
        """``changed`` was held or released, so its GPU's busy count changed: file it
        again, and the GPU's free devices (best fit packs by that count; nothing of a
        held or drained one depends on it)."""
        for d in self._on_gpu[changed.gpu_uuid].values():
            if d.uuid == changed.uuid or d.uuid in self.free[device_class(d)]:
                self._refresh(d)

    def _refresh(self, d: Device) -> None:
        """File ``d`` in every index as its state now is (gone when not in ``devices``)."""
        self._found.clear()
        self._cuts.pop(d.gpu_uuid, None)
        u, sh, node = d.uuid, shape(d), d.node
        present = u in self.devices
        if present and u in self.free[sh[0]]:
            self._free_shape[sh].add(u)
            pos = (d.gpu_index, d.start or 0)
            self._best[sh].set(u, (-self.busy_slices[d.gpu_uuid], node, *pos))
            self._first[sh].set(u, (node, *pos))
        else:
            self._free_shape[sh].discard(u)
            self._best[sh].discard(u)
            self._first[sh].discard(u)
        if sh[0] == WHOLE_GPU:
            self._count_free_gpus(d, present and u in self.free[WHOLE_GPU])
        end = self.until.get(u, -math.inf) if present and not self._closed(d) else None
        old = self._indexed.get(u)
        if old == end:
            return
        entries = self._ends[sh].setdefault(node, [])
        self._file(entries, u, old, end)
        if entries:
            self._soonest[sh].set(node, (entries[0][0],))
        else:
            self._soonest[sh].discard(node)
        if sh[0] == WHOLE_GPU:
            gpus = self._gpu_ends.setdefault(node, [])
            moved = self._file(gpus, u, old, end)
            for k in range(moved + 1, KTH_INDEXED + 1):  # the k-th ends before it stand
                if k <= len(gpus):
                    self._kth[k].set(node, (gpus[k - 1][0],))
                else:
                    self._kth[k].discard(node)
        if end is None:
            self._indexed.pop(u, None)
        else:
            self._indexed[u] = end

    @staticmethod
    def _file(
        entries: list[tuple[float, str]], u: str, old: float | None, new: float | None
    ) -> int:
        """Move ``u`` from ``old`` to ``new`` in the sorted ``entries``; the first position
        that changed (the entries before it are as they were)."""
        moved = len(entries)
        if old is not None:
            moved = bisect.bisect_left(entries, (old, u))
            del entries[moved]
        if new is not None:
            at = bisect.bisect_right(entries, (new, u))
            entries.insert(at, (new, u))
            moved = min(moved, at)
        return moved

    def _count_free_gpus(self, d: Device, free: bool) -> None:
        on_node = self._free_gpus[d.node]
        before = len(on_node)
        (on_node.add if free else on_node.discard)(d.uuid)
        if len(on_node) == before:
            return
        if before:
            nodes = self._nodes_by_free[before]
            del nodes[bisect.bisect_left(nodes, d.node)]
            if not nodes:  # only counts some node has are walked
                del self._nodes_by_free[before]
        if on_node:
            bisect.insort(self._nodes_by_free[len(on_node)], d.node)

    # -- questions

    def _shapes(self, size: Size) -> list[Shape]:
        """The shapes whose devices could host one unit of ``size`` (a share: none, the
        share pool places it)."""
        if size.shared:
            return []
        if size.gpus is not None:
            return [s for s in self._count if s[0] == WHOLE_GPU]
        if size.profile is not None:
            return [s for s in self._count if s[0] == size.profile]
        need = gb_to_mib(size.min_memory_gb or 0)
        return [s for s in self._count if s[1] >= need]

    def _of_model(self, d: Device, model: str | None) -> bool:
        """Whether ``d`` is a GPU of ``model`` (None: of any)."""
        return model is None or self.gpus[d.gpu_uuid].model == model

    def _other_models(self, size: Size) -> set[str]:
        """The free whole GPUs a size that names a model may not have."""
        if size.model is None:
            return set()
        free = self.free[WHOLE_GPU]
        return {u for u in free if not self._of_model(self.devices[u], size.model)}

    def compatible(self, size: Size) -> list[Device]:
        """Every device, free or held, that could host one unit of ``size``."""
        if size.gpus is not None:
            return [
                d
                for d in self.devices.values()
                if d.kind == "gpu" and self._of_model(d, size.model)
            ]
        if size.profile is not None:
            return [d for d in self.devices.values() if d.profile == size.profile]
        if size.shared:
            mib, pool = share_mib(size), self.shares.capacity
            return [self.devices[u] for u, room in pool.items() if room >= mib]
        assert size.min_memory_gb is not None
        need = gb_to_mib(size.min_memory_gb)
        return [d for d in self.devices.values() if d.memory_mib >= need]

    def nodes(self) -> set[str]:
        """The nodes that have whole GPUs (``{""}`` on one machine)."""
        return {node for node, n in self._gpus_on_node.items() if n > 0}

    def count_compatible(self, size: Size) -> int:
        """How many devices, free or held, could host one unit of ``size``; for whole
        GPUs the most on one node, since a grant never spans two."""
        if size.gpus is not None and size.model is not None:
            on_node = Counter(d.node for d in self.compatible(size))
            return max(on_node.values(), default=0)
        if size.gpus is not None:
            return max(self._gpus_on_node.values(), default=0)
        if size.shared:
            return len(self.compatible(size))
        return sum(self._count[s] for s in self._shapes(size))

    def has_free_for(self, size: Size) -> bool:
        """Is there at least one free device this size could use? (cheap pre-check)"""
        if size.gpus is not None and size.model is not None:
            return len(self.free[WHOLE_GPU]) > len(self._other_models(size))
        if size.gpus is not None:
            return bool(self.free[WHOLE_GPU])
        if size.profile is not None:
            return bool(self.free[size.profile])
        if size.shared:
            return self.shares.fits_now(share_mib(size))
        return any(self._free_shape[s] for s in self._shapes(size))

    def units(self, size: Size) -> int:
        return size.gpus if size.gpus is not None else 1

    def find(
        self, size: Size, strategy: str, exclude: AbstractSet[str] = frozenset()
    ) -> list[Device] | None:
        """Free devices for ``size`` (none of ``exclude``), or None if it does not fit now.

        Best fit: the smallest device large enough, on the busiest GPU, then by node,
        GPU and start; first fit: by node, GPU and start (inventory order)."""
        asked = (size, strategy, frozenset(exclude))
        if asked not in self._found:
            self._found[asked] = self._find(size, strategy, exclude)
        return self._found[asked]

    def _find(self, size: Size, strategy: str, exclude: AbstractSet[str]) -> list[Device] | None:
        if size.gpus is not None:
            if size.model is not None:
                exclude = {*exclude, *self._other_models(size)}
            return self._find_gpus(size.gpus, strategy, exclude)
        if size.shared:
            gpu = self.shares.find(share_mib(size), strategy, exclude)
            return None if gpu is None else [self.devices[gpu]]
        orders = self._best if strategy == "best_fit" else self._first
        best: tuple[tuple[Any, ...], str] | None = None
        for s in self._shapes(size):
            if not self._free_shape[s]:
                continue
            found = orders[s].first(exclude)
            if found is not None:
                key = (s[1], *found[0]) if strategy == "best_fit" else found[0]
                if best is None or key < best[0]:
                    best = (key, found[1])
        return None if best is None else [self.devices[best[1]]]

    def _find_gpus(self, n: int, strategy: str, exclude: AbstractSet[str]) -> list[Device] | None:
        """``n`` free whole GPUs on one node: on the first node that has them
        (``first_fit``), or on the node with the fewest free that still fits, so whole
        nodes stay free for large requests. One machine is one node."""
        short: dict[str, int] = defaultdict(int)
        """Nodes with excluded free GPUs -> how many are excluded."""
        for u in exclude:
            d = self.devices.get(u)
            if d is not None and u in self._free_gpus.get(d.node, ()):
                short[d.node] += 1
        fits = [
            (len(self._free_gpus[node]) - k, node)
            for node, k in short.items()
            if len(self._free_gpus[node]) - k >= n
        ]
        for count in sorted(c for c in self._nodes_by_free if c >= n):
            node = next((x for x in self._nodes_by_free[count] if x not in short), None)
            if node is not None:
                fits.append((count, node))
                if strategy == "best_fit":
                    break  # the fewest free that fit: no larger count does better
        if not fits:
            return None
        if strategy == "first_fit":
            _, node = min(fits, key=lambda x: x[1])
        else:
            _, node = min(fits)
        cands = [self.devices[u] for u in self._free_gpus[node] if u not in exclude]
        cands.sort(key=lambda d: d.gpu_index)
        return cands[:n]

    def reserve(self, size: Size, now: float) -> tuple[frozenset[str], float] | None:
        """Where and when the top blocked request of ``size`` starts (EASY backfill):
        on the node whose ``k``-th compatible device frees first, at that instant (its
        shadow time), with the ``k`` devices there that free *latest* by then, as
        textbook EASY does: a device free now and not needed at the shadow time may run
        a job of any length. Among devices freeing at the same instant an idle one is
        reserved before a held one (a lease past its expected end may run on).

        One node, because the grant will be on one node; one machine is one node. A
        share: the GPU where that much memory frees first (``SharePool.reserve``)."""
        if size.shared:
            found_share = self.shares.reserve(share_mib(size), now)
            return None if found_share is None else (frozenset({found_share[0]}), found_share[1])
        k = self.units(size)
        found = self._first_to_free(size, k)
        if found is None:
            return None
        per_node, node = found
        ready = sorted(
            (max(now, end), end > -math.inf, u)
            for nodes in per_node
            for end, u in nodes.get(node, ())
        )
        shadow = ready[k - 1][0]
        by_then = [x for x in ready if x[0] <= shadow]
        by_then.sort(key=lambda x: (x[0], not x[1], x[2]))  # idle last: taken first
        return frozenset(u for _, _, u in by_then[-k:]), shadow

    def _first_to_free(
        self, size: Size, k: int
    ) -> tuple[list[dict[str, list[tuple[float, str]]]], str] | None:
        """The node whose ``k``-th device compatible with ``size`` frees first, with the
        devices' (end, uuid) by node it was chosen from (None: no node has ``k``)."""
        if size.gpus is not None and size.model is not None:  # a resume's: a scan
            ends = {
                node: [x for x in xs if self._of_model(self.devices[x[1]], size.model)]
                for node, xs in self._gpu_ends.items()
            }
            per_node = [ends]
            best = min(
                ((x[k - 1][0], node) for node, x in ends.items() if len(x) >= k), default=None
            )
        elif size.gpus is not None:
            per_node = [self._gpu_ends]
            if k <= KTH_INDEXED:
                found = self._kth[k].first(frozenset())
                best = None if found is None else (found[0][0], found[1])
            else:
                best = min(
                    ((x[k - 1][0], node) for node, x in self._gpu_ends.items() if len(x) >= k),
                    default=None,
                )
        else:
            shapes = self._shapes(size)
            per_node = [self._ends[s] for s in shapes]
            firsts = [self._soonest[s].first(frozenset()) for s in shapes]
            best = min(((f[0][0], f[1]) for f in firsts if f is not None), default=None)
        return None if best is None else (per_node, best[1])

    def plan_mig(
        self, profile_name: str, exclude: AbstractSet[str] = frozenset()
    ) -> MigPlan | None:
        """How to cut a new ``profile_name`` slice from idle capacity, if any GPU can
        (``migplan.plan``)."""
        return plan(self, profile_name, exclude, self._cuts)
