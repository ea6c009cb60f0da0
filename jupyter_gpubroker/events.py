"""The event bus: a running broker's events on their way to the live streams.

The core's events get ids (for SSE resume) and their request's holder, kept for the last
``buffer`` events; each goes to the listeners that may see it (every user's stream, or
only the streams of the one kernel whose request it is); once per burst of events the
queue's ``Positions`` are computed, once for every stream, and go to the streams whose
waiting requests moved. ``runtime`` feeds it, ``api.rules`` decides what each stream
sees of it; it imports neither, so the API's rules load without a running broker.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .broker.core import Broker, Event, QueueEntry
from .broker.eta import Eta

Audience = tuple[str, str]
"""(user, kernel id): the one kernel whose requests a listener may see."""


@dataclass(frozen=True)
class Published:
    """A broker event as the streams send it: with its id, for resume."""

    id: int
    event: Event
    owner: str | None = None
    """Its request's holder (a kernel id), read once for every stream's visibility check."""
    views: dict[bool, dict[str, Any]] = field(default_factory=dict, compare=False)
    """Its JSON in full and reduced (``api.rules``), made once for every stream."""


@dataclass
class Positions:
    """The queue once, after a burst of events: every subscriber takes its own part.

    ``moved_users`` and ``moved_holders`` ((user, owner) pairs) name whose waiting
    requests moved since the last computation: position, ETA, or the queue's length.
    """

    id: int
    """The last event id these positions reflect."""
    at: float
    length: int
    by_user: dict[str, list[QueueEntry]]
    by_holder: dict[tuple[str, str], list[QueueEntry]]
    """Waiting requests by (user, owner): a kernel's own, without scanning its user's."""
    ahead: dict[str, dict[str, int]]
    """Request id -> requests ahead of it by job class."""
    moved_users: set[str] = field(default_factory=set)
    moved_holders: set[tuple[str, str]] = field(default_factory=set)

    @classmethod
    def of(cls, entries: list[QueueEntry], event_id: int, at: float) -> Positions:
        by_user: dict[str, list[QueueEntry]] = {}
        by_holder: dict[tuple[str, str], list[QueueEntry]] = {}
        ahead: dict[str, dict[str, int]] = {}
        classes: Counter[str] = Counter()
        for e in entries:
            r = e.request
            by_user.setdefault(r.user, []).append(e)
            by_holder.setdefault((r.user, r.owner), []).append(e)
            ahead[r.id] = dict(classes)
            classes[r.job_class.value] += 1
        return cls(event_id, at, len(entries), by_user, by_holder, ahead)

    def _seen(self) -> dict[str, tuple[int, Eta | None]]:
        return {e.request.id: (e.position, e.eta) for es in self.by_user.values() for e in es}

    def moved_since(self, before: Positions | None) -> None:
        """Fill ``moved_*`` from the previous computation."""
        old = {} if before is None else before._seen()
        same_length = before is not None and before.length == self.length
        for user, entries in self.by_user.items():
            for e in entries:
                if not same_length or old.get(e.request.id) != (e.position, e.eta):
                    self.moved_users.add(user)
                    self.moved_holders.add((user, e.request.owner))


Listener = Callable[[Published | Positions], None]


class EventBus:
    """The events of one core for its live subscribers (``publish`` is the core's
    subscriber), with the recent ones kept for resume and the queue's positions."""

    def __init__(self, core: Broker, buffer: int) -> None:
        self.core = core
        self.buffer = max(1, buffer)
        self._everyone: list[Listener] = []
        """Listeners that may see any event (users' streams), called with each one."""
        self._by_kernel: dict[Audience, list[Listener]] = {}
        """Listeners that may see only one kernel's requests (kernel tokens' streams), by
        (user, kernel id): called only with that kernel's events and positions."""
        self._owners: dict[str, str] = {}
        """Request id -> its holder (``owner``), for the requests of recent events: an
        ended request's holder is then not read back from the state file."""
        self._recent: deque[Published] = deque(maxlen=self.buffer)
        self.last_event_id = int(core.clock.now() * 1e6)
        """The id of the newest event. Ids count up from the start time in microseconds,
        so an id a client kept from an earlier run of the broker is older than any of
        this run's (it gets a snapshot)."""
        self._positions: Positions | None = None
        self._positions_due = False
        """The positions are stale: an event happened since they were computed."""
        self._positions_scheduled = False
        """Their computation for the streams is on its way (the next pass of the loop)."""
        self._positions_ranked_at: float | None = None
        """The core's ranking instant the last positions reflect (``Broker.ranked_at``)."""

    def subscribe(self, listener: Listener, audience: Audience | None = None) -> Callable[[], None]:
        """Call ``listener`` with every event (``Published``, with its stream id) and,
        once per burst of events, with the queue's new ``Positions`` when any moved.

        ``audience`` (user, kernel id): a listener that may see only that kernel's
        requests is called only with their events and positions, so the streams of idle
        kernels cost an event nothing (``api.rules`` still decides what each one sees)."""
        group = self._everyone if audience is None else self._by_kernel.setdefault(audience, [])
        group.append(listener)

        def unsubscribe() -> None:
            group.remove(listener)
            if not group and audience is not None and self._by_kernel.get(audience) is group:
                del self._by_kernel[audience]

        return unsubscribe

    @property
    def subscribers(self) -> int:
        """How many listeners follow the events now (one per open event stream)."""
        return len(self._everyone) + sum(map(len, self._by_kernel.values()))

    def _listening(self) -> bool:
        return bool(self._everyone or self._by_kernel)

    def since(self, event_id: int) -> list[Published] | None:
        """The events after ``event_id``; ``None`` when some of them are no longer kept
        (or the id is not one of this run's): the caller needs a snapshot."""
        oldest = self._recent[0].id if self._recent else self.last_event_id + 1
        if not oldest - 1 <= event_id <= self.last_event_id:
            return None
        return [p for p in self._recent if p.id > event_id]

    def positions(self) -> Positions:
        """The queue's positions now (computed at most once per change)."""
        if self._positions is None or self._positions_due:
            self._update_positions()
        assert self._positions is not None
        return self._positions

    def publish(self, event: Event) -> None:
        """Give ``event`` its id and send it to whoever may see it; the positions follow
        once the burst is over."""
        self.last_event_id += 1
        holder = None if event.request_id is None else self._holder(event.request_id)
        published = Published(self.last_event_id, event, holder)
        self._recent.append(published)
        listeners = self._everyone
        if holder is not None and self._by_kernel:
            listeners = [*listeners, *self._by_kernel.get((event.user, holder), ())]
        for listener in list(listeners):
            listener(published)
        self._positions_due = True
        if not self._positions_scheduled:
            # once the burst is over: the next pass of the event loop (without a loop,
            # in a script or a test, they are computed when asked for)
            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().call_soon(self._positions_later)
                self._positions_scheduled = True

    def after_tick(self) -> None:
        """The queue's positions again when aging re-ranked it without any event (a
        waiting widget would show a stale position)."""
        if (
            self._listening()
            and not self._positions_scheduled  # an event's computation is on its way
            and (self._positions_due or self._positions_ranked_at != self.core.ranked_at)
        ):
            self._update_positions()

    def close(self) -> None:
        """No more positions: the core's store is about to close."""
        self._positions_due = False

    def _holder(self, request_id: str) -> str:
        """A request's holder, remembered for the last ``buffer`` requests with events
        (a holder never changes): the event that ends a request, once the core has let
        it go, then needs no read of the state file."""
        owner = self._owners.get(request_id)
        if owner is None:
            owner = self._owners[request_id] = self.core.request(request_id).owner
            if len(self._owners) > self.buffer:
                del self._owners[next(iter(self._owners))]
        return owner

    def _positions_later(self) -> None:
        """The burst's positions, for the streams: with none open, nobody needs them
        before someone asks (``positions()`` computes them then)."""
        self._positions_scheduled = False
        if self._positions_due and self._listening():  # not computed meanwhile, nor closed
            self._update_positions()

    def _update_positions(self) -> None:
        self._positions_due = False
        self._positions_ranked_at = self.core.ranked_at
        now = Positions.of(self.core.queue(), self.last_event_id, self.core.clock.now())
        before, self._positions = self._positions, now
        now.moved_since(before)
        if not now.moved_users:
            return
        listeners = [*self._everyone]
        for pair in now.moved_holders:
            listeners.extend(self._by_kernel.get(pair, ()))
        for listener in listeners:
            listener(now)
