"""The wait queue: requests in buckets, buckets ranked by their head's priority.

A bucket is one FIFO per (size, user, group, class, time limit). Every policy's priority
grows with age and is otherwise the same for all requests of a bucket, so the
oldest request of a bucket always ranks first in it and only bucket heads
need ranking. Each size keeps a heap of its buckets; an entry goes stale when
its bucket's head or its user's fair share changes, and is skipped when it
comes up (lazy deletion). A scheduling pass therefore costs a few heap
operations per decision, not a sort of the whole queue.

Equal priorities and submit times are ordered by arrival (``order``), never by
which bucket was ranked first: the order of the queue must not depend on how
requests are grouped into users.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import defaultdict, deque
from collections.abc import Callable, Generator, Iterator

from ..wire.sizes import Size
from .models import Request

BucketKey = tuple[str, str, str, str, float]
"""(size key, user, group, job class, time limit or 0)."""
Entry = tuple[float, float, int, int, int, BucketKey]
"""(-priority, head's submit time, head's arrival rank, version, user epoch, bucket)."""


def stated(r: Request) -> float | None:
    """How long ``r`` says it holds: its time limit (an upper bound, as Slurm's backfill
    takes it), else its expected duration."""
    return r.limit_s or r.expected_duration_s


def bucket_key(r: Request) -> BucketKey:
    return (r.size.key, r.user, r.group, r.job_class.value, r.limit_s or 0.0)


class WaitQueue:
    def __init__(self, rank: Callable[[Request], float]) -> None:
        self._rank = rank
        self._buckets: dict[BucketKey, deque[Request]] = {}
        self._heaps: dict[str, list[Entry]] = defaultdict(list)
        self._order: dict[str, int] = {}
        self._arrivals = itertools.count()
        self._version: dict[BucketKey, int] = {}
        self._user_epoch: dict[str, int] = defaultdict(int)
        self.sizes: dict[str, Size] = {}
        """Size key -> size, for every size that has waiting requests."""
        self._buckets_of_size: dict[str, int] = defaultdict(int)
        self._tick = itertools.count()
        self._stated: dict[str, list[tuple[float, int, str]]] = defaultdict(list)
        """Size key -> (stated duration, arrival rank, id) of its requests that state one,
        a heap; entries of requests no longer waiting are dropped as they come up."""
        self._unstated: dict[str, int] = defaultdict(int)
        """Size key -> how many of its waiting requests state no duration."""

    def __len__(self) -> int:
        return sum(len(b) for b in self._buckets.values())

    def __iter__(self) -> Iterator[Request]:
        for bucket in self._buckets.values():
            yield from bucket

    def order(self, r: Request) -> int:
        """The waiting request's arrival rank: what breaks ties of priority and submit time."""
        return self._order[r.id]

    def add(self, r: Request, order: int | None = None) -> None:
        """Queue ``r`` behind every request added before it (add in submission order), or
        at its former arrival rank ``order`` (put back after a change of its class)."""
        self._order[r.id] = next(self._arrivals) if order is None else order
        key = bucket_key(r)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = deque()
            self.sizes[r.size.key] = r.size
            self._buckets_of_size[r.size.key] += 1
        bucket.append(r)
        if len(bucket) == 1:
            self._push(key)
        if held := stated(r):
            heapq.heappush(self._stated[key[0]], (held, self._order[r.id], r.id))
        else:
            self._unstated[key[0]] += 1

    def remove(self, r: Request) -> None:
        key = bucket_key(r)
        bucket = self._buckets[key]
        was_head = bucket[0] is r
        del self._order[r.id]
        if not stated(r):
            self._unstated[key[0]] -= 1
        if was_head:
            bucket.popleft()
        else:
            bucket.remove(r)
        if not bucket:
            del self._buckets[key], self._version[key]
            self._buckets_of_size[r.size.key] -= 1
            if not self._buckets_of_size[r.size.key]:
                del (
                    self.sizes[r.size.key],
                    self._buckets_of_size[r.size.key],
                    self._heaps[r.size.key],
                )
                self._stated.pop(r.size.key, None)
                self._unstated.pop(r.size.key, None)
        elif was_head:
            self._push(key)

    def shortest(self, size_key: str, unstated: float) -> float:
        """A lower bound on how long any waiting request of this size will hold: the
        shortest stated duration, or ``unstated`` (the shortest any estimate can be)
        while some state none. A pass stops looking for backfill of a size that cannot
        end before the reservation starts."""
        heap = self._stated.get(size_key, [])
        while heap and self._order.get(heap[0][2]) != heap[0][1]:
            heapq.heappop(heap)  # no longer waiting
        stated = heap[0][0] if heap else math.inf
        return min(stated, unstated) if self._unstated.get(size_key) else stated

    def oldest_submitted_at(self) -> float | None:
        """The oldest waiting request's submit time (each bucket's head is its oldest)."""
        return min((b[0].submitted_at for b in self._buckets.values()), default=None)

    def rerank_user(self, user: str) -> None:
        """The user's fair share changed: their buckets are ranked again when next met."""
        self._user_epoch[user] += 1

    def rerank_all(self) -> None:
        """Rank every bucket again (after a fair-share recalculation): one heapify per
        size, not a push per bucket."""
        self._heaps.clear()
        for key in self._buckets:
            self._heaps[key[0]].append(self._entry(key))
        for heap in self._heaps.values():
            heapq.heapify(heap)

    def walk(self, size_key: str) -> Generator[tuple[float, Request], None, None]:
        """The heads of one size's buckets, best first. Granting a yielded head
        (``remove``) ranks that bucket's next request into the walk."""
        heap = self._heaps[size_key]
        seen: list[Entry] = []
        try:
            while heap:
                entry = heapq.heappop(heap)
                key = entry[5]
                if self._version.get(key) != entry[3]:
                    continue
                if self._user_epoch[key[1]] != entry[4]:
                    self._push(key)  # ranked before its user's share changed
                    continue
                seen.append(entry)
                yield -entry[0], self._buckets[key][0]
        finally:
            for entry in seen:
                if self._version.get(entry[5]) == entry[3]:
                    heapq.heappush(heap, entry)

    def _push(self, key: BucketKey) -> None:
        heapq.heappush(self._heaps[key[0]], self._entry(key))

    def _entry(self, key: BucketKey) -> Entry:
        """The bucket's heap entry, ranked now; older entries of it go stale."""
        head = self._buckets[key][0]
        version = next(self._tick)
        self._version[key] = version
        return (
            -self._rank(head),
            head.submitted_at,
            self._order[head.id],
            version,
            self._user_epoch[key[1]],
            key,
        )
