"""A min-heap whose entries' keys change: the placer's orders of free devices, kept
up to date in O(log n) a change."""

from __future__ import annotations

import heapq
from collections.abc import Set as AbstractSet
from typing import Any


class LazyHeap:
    """A min-heap of (key, name) where only each name's latest key counts: a change
    pushes a new entry and stale ones are dropped as they come up, so keeping an order
    costs O(log n) per change instead of a scan per question."""

    def __init__(self) -> None:
        self.live: dict[str, tuple[Any, ...]] = {}
        self._heap: list[tuple[tuple[Any, ...], str]] = []

    def set(self, name: str, key: tuple[Any, ...]) -> None:
        if self.live.get(name) == key:
            return
        self.live[name] = key
        heapq.heappush(self._heap, (key, name))
        if len(self._heap) > 2 * len(self.live) + 64:  # mostly stale: rebuild
            self._heap = [(k, n) for n, k in self.live.items()]
            heapq.heapify(self._heap)

    def discard(self, name: str) -> None:
        self.live.pop(name, None)

    def first(self, skip: AbstractSet[str]) -> tuple[tuple[Any, ...], str] | None:
        """The entry with the smallest key whose name is not in ``skip``."""
        heap, passed = self._heap, []
        try:
            while heap:
                key, name = heap[0]
                if self.live.get(name) != key:
                    heapq.heappop(heap)
                elif name in skip:
                    passed.append(heapq.heappop(heap))
                else:
                    return key, name
            return None
        finally:
            for entry in passed:
                heapq.heappush(heap, entry)
