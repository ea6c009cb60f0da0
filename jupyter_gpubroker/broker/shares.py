"""Shares of GPUs: where a request for part of a GPU's memory goes, and when.

The placer (``placement.Placer``) owns one ``SharePool``: the GPUs that take shares at
some hour (``sharing.Sharing.ever_shared``), each with its memory, the shares it holds
(MiB and expected end each) and whether it is open to new ones now (its mode allows
shares, it is not drained and nobody holds it whole). Shares are packed by memory and
never over a GPU's memory: best fit takes the open GPU with the least room that still
fits, so whole GPUs and large rooms stay free; first fit the first open GPU in
inventory order. The top blocked share is reserved, as EASY backfill does for whole
devices, the GPU where that much memory frees first, from the shares' expected ends
(a GPU held whole frees all of it at its lease's end).

Every question is answered from indexes kept on each change: the open GPUs sorted by
room, and per memory size asked, the GPUs by when that much frees. A scheduling pass
therefore costs the same with 1,024 shared GPUs as with one.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from collections.abc import Set as AbstractSet

from ..wire.sizes import Size, gb_to_mib
from .lazyheap import LazyHeap
from .models import Device
from .sharing import SHARES_ALLOWED


def share_mib(size: Size) -> int:
    """The MiB a share asks for: ``share_gb`` (10^9 bytes each, as ``min_memory_gb``) in
    NVML's MiB, rounded up (never less)."""
    assert size.share_gb is not None
    return math.ceil(gb_to_mib(size.share_gb) - 1e-9)


def share_fraction(size: Size, device: Device) -> float:
    """What a share of ``device`` counts as everywhere (fair share, quotas, accounting):
    its part of the GPU's memory."""
    return share_mib(size) / device.memory_mib


class SharePool:
    """The GPUs shares may go on, their shares and the indexes over them."""

    def __init__(self) -> None:
        self.capacity: dict[str, int] = {}
        """GPU device UUID -> its memory (MiB), for each GPU taking shares at some hour."""
        self.mode: dict[str, str] = {}
        """How each is lent now (``sharing.MODES``)."""
        self.shares: dict[str, dict[str, tuple[int, float]]] = {}
        """GPU -> lease id -> (MiB, expected end) of the shares it holds."""
        self.used: dict[str, int] = {}
        self.drained: set[str] = set()
        self.whole: dict[str, float] = {}
        """GPU held whole (a lease, or a process lingering) -> when it frees (-inf: idle)."""
        self._where: dict[str, tuple[str, int]] = {}
        """GPU -> (node, index): the order of first fit and of ties."""
        self._rooms: list[tuple[int, str, int, str]] = []
        """(room MiB, node, index, GPU) of the open GPUs, sorted: best fit's index."""
        self._filed: dict[str, tuple[int, str, int, str]] = {}
        self._soon: dict[int, LazyHeap] = {}
        """MiB asked -> the GPUs by when that much of them frees (reservations)."""

    # -- bookkeeping

    def add(self, d: Device, mode: str) -> None:
        self.capacity[d.uuid] = d.memory_mib
        self.mode[d.uuid] = mode
        self.shares.setdefault(d.uuid, {})
        self.used.setdefault(d.uuid, 0)
        self._where[d.uuid] = (d.node, d.gpu_index)
        self._refresh(d.uuid)

    def remove(self, uuid: str) -> None:
        for table in (self.capacity, self.mode, self._where):
            table.pop(uuid, None)
        self._refresh(uuid)

    def set_mode(self, uuid: str, mode: str) -> None:
        if self.mode.get(uuid, mode) != mode:
            self.mode[uuid] = mode
            self._refresh(uuid)

    def set_drained(self, uuid: str, drained: bool) -> None:
        (self.drained.add if drained else self.drained.discard)(uuid)
        self._refresh(uuid)

    def set_whole(self, uuid: str, until: float | None) -> None:
        """``uuid`` is held whole until ``until`` (-inf: nobody knows, idle for a
        reservation), or no longer (None)."""
        if uuid not in self.capacity:
            return
        if until is None:
            self.whole.pop(uuid, None)
        else:
            self.whole[uuid] = until
        self._refresh(uuid)

    def put(self, uuid: str, lease_id: str, mib: int, end: float) -> None:
        self.shares[uuid][lease_id] = (mib, end)
        self.used[uuid] += mib
        self._refresh(uuid)

    def take(self, uuid: str, lease_id: str) -> None:
        held = self.shares.get(uuid, {}).pop(lease_id, None)
        if held is not None:
            self.used[uuid] -= held[0]
            self._refresh(uuid)

    def expect(self, uuid: str, lease_id: str, end: float) -> None:
        mib, _ = self.shares[uuid][lease_id]
        self.shares[uuid][lease_id] = (mib, end)
        self._refresh(uuid)

    # -- questions

    def is_open(self, uuid: str) -> bool:
        """Does ``uuid`` take a new share now?"""
        return (
            self.mode.get(uuid) in SHARES_ALLOWED
            and uuid not in self.drained
            and uuid not in self.whole
        )

    def room(self, uuid: str) -> int:
        return self.capacity.get(uuid, 0) - self.used.get(uuid, 0)

    def last_end(self, uuid: str) -> float | None:
        """When its last share is expected to end (None: it holds none)."""
        held = self.shares.get(uuid)
        return max(end for _, end in held.values()) if held else None

    def largest(self) -> int:
        """The most memory a share could ever have here (MiB)."""
        return max(self.capacity.values(), default=0)

    def fits_now(self, mib: int) -> bool:
        return bool(self._rooms) and self._rooms[-1][0] >= mib

    def find(self, mib: int, strategy: str, exclude: AbstractSet[str] = frozenset()) -> str | None:
        """The open GPU a share of ``mib`` goes on now (none of ``exclude``), or None:
        the least room that fits (``best_fit``), or the first in inventory order."""
        at = bisect.bisect_left(self._rooms, (mib,))
        fits = (e for e in self._rooms[at:] if e[3] not in exclude)
        if strategy == "best_fit":
            return next((e[3] for e in fits), None)
        first = min(fits, key=lambda e: (e[1], e[2]), default=None)
        return None if first is None else first[3]

    def reserve(self, mib: int, now: float) -> tuple[str, float] | None:
        """The GPU where ``mib`` frees first and when (not before ``now``); None: no GPU
        that takes shares could ever hold it."""
        if mib not in self._soon:
            heap = self._soon[mib] = LazyHeap()
            for uuid in self.capacity:
                self._file_soon(heap, uuid, mib)
        found = self._soon[mib].first(frozenset())
        if found is None or found[0][0] == math.inf:
            return None
        return found[1], max(now, found[0][0])

    # -- indexes

    def _refresh(self, uuid: str) -> None:
        old = self._filed.pop(uuid, None)
        if old is not None:
            del self._rooms[bisect.bisect_left(self._rooms, old)]
        if uuid in self.capacity and self.is_open(uuid):
            node, index = self._where[uuid]
            entry = (self.room(uuid), node, index, uuid)
            bisect.insort(self._rooms, entry)
            self._filed[uuid] = entry
        for mib, heap in self._soon.items():
            self._file_soon(heap, uuid, mib)

    def _file_soon(self, heap: LazyHeap, uuid: str, mib: int) -> None:
        """File ``uuid`` under when ``mib`` of it frees (gone when it never will)."""
        t = self._frees_at(uuid, mib)
        if t is None:
            heap.discard(uuid)
        else:
            node, index = self._where[uuid]
            heap.set(uuid, (t, node, index))

    def _frees_at(self, uuid: str, mib: int) -> float | None:
        """When ``mib`` of ``uuid`` is free for a share (-inf: now; inf: not while a
        share's end is unknown); None when it never takes such a share."""
        capacity = self.capacity.get(uuid)
        if capacity is None or capacity < mib or uuid in self.drained:
            return None
        if self.mode.get(uuid) not in SHARES_ALLOWED:
            return None
        if uuid in self.whole:
            return self.whole[uuid]
        room = capacity - self.used[uuid]
        if room >= mib:
            return -math.inf
        for held, end in sorted(self.shares[uuid].values(), key=lambda x: x[1]):
            room += held
            if room >= mib:
                return end
        return math.inf  # never reached: the shares add up to no more than its memory


class ShareTimes:
    """The shared GPUs' memory over time in one pass of a list-schedule (``eta``): each
    GPU as chunks of memory, each free from an instant on (its room now, each share's at
    that share's expected end, all of it at a whole lease's end). A waiting share starts
    on the GPU where its memory is free first, takes the chunks it needs and gives them
    back at its end. Per size asked, the GPUs are kept by when that much frees, so a
    pass over a deep queue costs a heap operation a share."""

    def __init__(self, pool: SharePool, share_end: Mapping[str, float], now: float) -> None:
        """``share_end``: lease id -> its expected end in this pass."""
        self.chunks: dict[str, list[tuple[float, int]]] = {}
        for uuid, capacity in pool.capacity.items():
            if pool.mode.get(uuid) not in SHARES_ALLOWED or uuid in pool.drained:
                continue
            if uuid in pool.whole:
                chunks = [(max(now, pool.whole[uuid]), capacity)]
            else:
                held = pool.shares[uuid]
                chunks = [(max(now, share_end[x]), mib) for x, (mib, _) in held.items()]
                chunks.append((now, capacity - pool.used[uuid]))
            self.chunks[uuid] = sorted(chunks)
        self._soon: dict[int, LazyHeap] = {}

    def take(self, mib: int, length: float, after: float) -> float | None:
        """When a share of ``mib`` held for ``length`` starts, not before ``after``
        (None: no GPU here could hold it)."""
        if mib not in self._soon:
            self._soon[mib] = LazyHeap()
            for uuid in self.chunks:
                self._file(self._soon[mib], uuid, mib)
        found = self._soon[mib].first(frozenset())
        if found is None or math.isinf(found[0][0]):
            return None
        uuid, start = found[1], max(after, float(found[0][0]))
        chunks, need = self.chunks[uuid], mib
        while need > 0:
            at, size = chunks.pop(0)
            if size > need:
                bisect.insort(chunks, (at, size - need))
            need -= size
        bisect.insort(chunks, (start + length, mib))
        for wanted, heap in self._soon.items():
            self._file(heap, uuid, wanted)
        return start

    def _file(self, heap: LazyHeap, uuid: str, mib: int) -> None:
        total, at = 0, None
        for t, size in self.chunks[uuid]:
            total += size
            if total >= mib:
                at = t
                break
        if at is None:
            heap.discard(uuid)
        else:
            heap.set(uuid, (at, uuid))
