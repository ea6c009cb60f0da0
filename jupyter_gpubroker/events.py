"""The event bus: a running broker's events on their way to the live streams.

The core's events get ids (for SSE resume) and their request's holder, kept for the last
``buffer`` events; each goes to the listeners that may see it (every user's stream, or
only the streams of the one kernel whose request it is); once per burst of events the
queue's ``Positions`` are computed, once for every stream, and go to the streams whose
waiting requests moved. ``runtime`` feeds it, ``api.streams`` decides what each stream
sees of it; it imports neither, so the API's rules load without a running broker.

Open streams do not each follow the bus: streams that see alike (one ``audience``) form
one ``Group`` (``Fanout``), which is told of each event once, keeps the latest message
about each thing for a short window (``WINDOW_S``) and then writes one encoded chunk to
all of its streams. A thousand of one user's fronts so cost one decision and one
encoding per event, and one write each per window.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections import Counter, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .broker.core import Broker, Event, QueueEntry
from .broker.eta import Eta
from .broker.models import Lease, Request
from .wire.errors import NotFound
from .wire.times import iso

WINDOW_S = 0.25
"""How long a group of streams gathers messages before it writes them (the latest about
each thing wins): a front shows no state older than this plus the network's delay."""
READINGS_S = 5.0
"""How often the devices' readings go to the streams (only those that changed)."""
USER_NOTICES = ("outside_use",)
"""Events about a user but none of its requests that each of its fronts shows, its
kernels' ``%gpu`` included (kernel tokens' streams otherwise get only their requests')."""
KEEPALIVE_S = 15.0
"""A comment line to every stream this often, so proxies keep idle streams open."""

EVENT_VERSION = 1
"""The version of the event envelope ``{v, id, type, at, data}``."""


def envelope(event_id: int, kind: str, at: float, data: dict[str, Any]) -> dict[str, Any]:
    """One message of the event stream: versioned, with its stream id (for resume)."""
    return {"v": EVENT_VERSION, "id": event_id, "type": kind, "at": iso(at), "data": data}


Audience = tuple[str, str]
"""(user, kernel id): the one kernel whose requests a listener may see."""


@dataclass(frozen=True)
class Published:
    """A broker event as the streams send it: with its id, for resume."""

    id: int
    event: Event
    holder: str | None = None
    """Its request's holder (a kernel id), read once for every stream's visibility check."""
    views: dict[bool, dict[str, Any]] = field(default_factory=dict, compare=False)
    """Its JSON in full and reduced (``api.rules``), made once for every stream."""


@dataclass
class Positions:
    """The queue once, after a burst of events: every subscriber takes its own part.

    ``moved_users`` and ``moved_holders`` ((user, holder) pairs) name whose waiting
    requests moved since the last computation: position, ETA, or the queue's length.
    """

    id: int
    """The last event id these positions reflect."""
    at: float
    length: int
    by_user: dict[str, list[QueueEntry]]
    by_holder: dict[tuple[str, str], list[QueueEntry]]
    """Waiting requests by (user, holder): a kernel's own, without scanning its user's."""
    ahead: dict[str, dict[str, int]]
    """Request id -> requests ahead of it by job class."""
    moved_users: set[str] = field(default_factory=set)
    moved_holders: set[tuple[str, str]] = field(default_factory=set)
    changed: bool = True
    """Whether anything in the queue changed (a request joined, left or moved)."""
    entries: list[QueueEntry] = field(default_factory=list)
    """The whole queue, best first."""

    @classmethod
    def of(cls, entries: list[QueueEntry], event_id: int = 0, at: float = 0.0) -> Positions:
        by_user: dict[str, list[QueueEntry]] = {}
        by_holder: dict[tuple[str, str], list[QueueEntry]] = {}
        ahead: dict[str, dict[str, int]] = {}
        classes: Counter[str] = Counter()
        for e in entries:
            r = e.request
            by_user.setdefault(r.user, []).append(e)
            by_holder.setdefault((r.user, r.holder), []).append(e)
            ahead[r.id] = dict(classes)
            classes[r.job_class.value] += 1
        return cls(event_id, at, len(entries), by_user, by_holder, ahead, entries=entries)

    def _seen(self) -> dict[str, tuple[int, Eta | None]]:
        return {e.request.id: (e.position, e.eta) for es in self.by_user.values() for e in es}

    def moved_since(self, before: Positions | None) -> None:
        """Fill ``moved_*`` from the previous computation."""
        old = {} if before is None else before._seen()
        same_length = before is not None and before.length == self.length
        self.changed = before is None or old != self._seen()
        for user, entries in self.by_user.items():
            for e in entries:
                if not same_length or old.get(e.request.id) != (e.position, e.eta):
                    self.moved_users.add(user)
                    self.moved_holders.add((user, e.request.holder))


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
        self._requests: dict[str, Request] = {}
        """Request id -> the request (the core's own object, which it updates in place),
        for the requests of recent events: an ended request is then not read back from
        the state file, for its holder nor for the state its event shows."""
        self._leases: dict[str, Lease] = {}
        """Lease id -> the lease, likewise, for the leases of recent events."""
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
        self.fanout = Fanout(self)

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
        """How many listeners follow the events now: each open event stream, and each
        listener of the bus's own (a group of streams listens once for all of them)."""
        listeners = len(self._everyone) + sum(map(len, self._by_kernel.values()))
        return listeners - len(self.fanout.groups) + self.fanout.streams

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
        holder = None if event.request_id is None else self.request_of(event.request_id).holder
        if event.lease_id is not None and event.request_id is not None:
            with contextlib.suppress(NotFound):  # kept while the core has it at hand
                self.lease_of(event.lease_id)
        published = Published(self.last_event_id, event, holder)
        self._recent.append(published)
        listeners = self._everyone
        if holder is not None and self._by_kernel:
            listeners = [*listeners, *self._by_kernel.get((event.user, holder), ())]
        elif event.kind in USER_NOTICES and self._by_kernel:  # to its user's kernels too
            mine = (ls for (user, _), ls in self._by_kernel.items() if user == event.user)
            listeners = [*listeners, *(x for ls in mine for x in ls)]
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

    def request_of(self, request_id: str) -> Request:
        """A request, remembered for the last ``buffer`` requests with events: the event
        that ends a request, once the core has let it go, then needs no read of the state
        file (the core updates the object it gave in place)."""
        r = self._requests.get(request_id)
        if r is None:
            r = self._requests[request_id] = self.core.request(request_id)
            if len(self._requests) > self.buffer:
                del self._requests[next(iter(self._requests))]
        return r

    def lease_of(self, lease_id: str) -> Lease:
        """A lease, remembered as ``request_of`` remembers requests."""
        lease = self._leases.get(lease_id)
        if lease is None:
            lease = self._leases[lease_id] = self.core.lease(lease_id)
            if len(self._leases) > self.buffer:
                del self._leases[next(iter(self._leases))]
        return lease

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
        if not now.changed:
            return
        listeners = [*self._everyone]
        for pair in now.moved_holders:
            listeners.extend(self._by_kernel.get(pair, ()))
        for listener in listeners:
            listener(now)


Key = Hashable
"""What a message is about (a request, the positions, ...): within a window the latest
message about each thing wins."""
Message = dict[str, Any]


class View(Protocol):
    """What one audience sees (``api.streams``): the messages an item makes for it, each
    with what it is about, and what a window adds once it is over."""

    def see(self, item: Published | Positions) -> list[tuple[Key, Message]]: ...

    def window(self, batch: list[Message]) -> list[tuple[Key, Message]]: ...


Chunk = bytes
"""A window's messages encoded once for every stream of an audience: a thousand streams
then cost a thousand writes of the same bytes and one encoding."""

KEEPALIVE: Chunk = b": keepalive\n\n"


def _frames(messages: list[Message]) -> Chunk:
    return "".join(map(frame, messages)).encode()


def frame(message: Message) -> str:
    """A message as one server-sent event: its ``id:`` line and its JSON (without the
    blanks ``json.dumps`` puts by default: a tenth of the bytes every stream is sent)."""
    return f"id: {message['id']}\ndata: {json.dumps(message, separators=(',', ':'))}\n\n"


@dataclass(eq=False)
class Stream:
    """One open event stream: ``write`` takes encoded chunks (an HTTP stream) and
    ``send`` messages (a listener in process); ``after``: the last event id its start
    covered, so the window it joined in sends it nothing older."""

    after: int
    write: Callable[[Chunk], None] | None = None
    send: Callable[[Message], None] | None = None
    joined: bool = True

    def deliver(self, batch: list[Message], chunk: Callable[[], Chunk]) -> None:
        if self.write is not None:
            self.write(chunk())
        elif self.send is not None:
            for message in batch:
                self.send(message)


class Group:
    """The open streams of one audience: each item is decided once for all of them, the
    latest message about each thing kept until the window ends, then encoded once."""

    def __init__(self, fanout: Fanout, key: Key, view: View, audience: Audience | None) -> None:
        self.fanout, self.key, self.view = fanout, key, view
        self.streams: list[Stream] = []
        self.pending: dict[Key, Message] = {}
        self._due: asyncio.TimerHandle | None = None
        self._leave = fanout.bus.subscribe(self.take, audience)

    def take(self, item: Published | Positions) -> None:
        for key, message in self.view.see(item):
            self.add(key, message)

    def add(self, key: Key, message: Message) -> None:
        """Keep ``message`` as the latest about ``key`` (in the order of the latest)."""
        self.pending.pop(key, None)
        self.pending[key] = message
        if self._due is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop (a script, a test): at once
                self.flush()
                return
            self._due = loop.call_later(self.fanout.window_s, self.flush)

    def flush(self) -> None:
        """The window is over: what it kept goes to every stream, encoded once."""
        self._due = None
        batch = list(self.pending.values())
        self.pending.clear()
        for key, message in self.view.window(batch):
            self.pending.pop(key, None)
            batch.append(message)
        if not batch:
            return
        encoded: list[Chunk] = []

        def chunk() -> Chunk:
            if not encoded:
                encoded.append(_frames(batch))
            return encoded[0]

        for stream in list(self.streams):
            if stream.joined:  # it joined during this window: not what its start covered
                stream.joined = False
                newer = [m for m in batch if m["id"] >= stream.after]
                if len(newer) < len(batch):
                    if newer:
                        stream.deliver(newer, functools.partial(_frames, newer))
                    continue
            stream.deliver(batch, chunk)

    def close(self) -> None:
        self._leave()
        if self._due is not None:
            self._due.cancel()


class Fanout:
    """The open streams by audience (``Group``), the devices' readings for all of them
    every ``READINGS_S`` when some changed, and their keepalives."""

    def __init__(self, bus: EventBus) -> None:
        self.bus = bus
        self.window_s = WINDOW_S
        self.groups: dict[Key, Group] = {}
        self.readings: Callable[[], dict[str, Any]] | None = None
        """The devices' latest readings by UUID, as every viewer may see them."""
        self._sent_readings: dict[str, Any] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._ticks = 0

    @property
    def streams(self) -> int:
        return sum(len(g.streams) for g in self.groups.values())

    def join(
        self,
        key: Key,
        view: Callable[[], View],
        stream: Stream,
        audience: Audience | None = None,
    ) -> Callable[[], None]:
        """Add ``stream`` to its audience's group (``key``; made with ``view()`` and
        subscribed to ``audience``'s events when it is the first); returns its leave."""
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = Group(self, key, view(), audience)
        group.streams.append(stream)
        self._start()

        def leave() -> None:
            if stream in group.streams:
                group.streams.remove(stream)
            if not group.streams and self.groups.get(key) is group:
                group.close()
                del self.groups[key]

        return leave

    def _start(self) -> None:
        if self._timer is None:
            with contextlib.suppress(RuntimeError):  # no loop: no readings, no keepalive
                loop = asyncio.get_running_loop()
                self._timer = loop.call_later(READINGS_S, self._tick)

    def _tick(self) -> None:
        """Every ``READINGS_S``: the readings that changed; every ``KEEPALIVE_S``, a
        keepalive to streams that write chunks."""
        self._timer = None
        if not self.groups:
            return
        self._ticks += 1
        self.send_readings()
        if self._ticks % max(1, round(KEEPALIVE_S / READINGS_S)) == 0:
            for group in self.groups.values():
                for stream in group.streams:
                    if stream.write is not None:
                        stream.write(KEEPALIVE)
        self._start()

    def send_readings(self) -> None:
        """A ``readings`` message with the devices whose readings changed, into every
        group's window (in order with its events: it carries the newest event id)."""
        if self.readings is None:
            return
        now = self.readings()
        changed = {u: r for u, r in now.items() if self._sent_readings.get(u) != r}
        self._sent_readings = now
        if not changed:
            return
        at = self.bus.core.clock.now()
        message = envelope(self.bus.last_event_id, "readings", at, {"devices": changed})
        for group in self.groups.values():
            group.add(("readings", self._ticks), message)
