"""The event streams' rules: what each viewer sees of the broker's events, and what a
front needs to render from them alone.

A viewer's own events carry its request and lease in full (``request``), so a front
updates its picture from the event itself; other users' events show only whose they
are, and for a grant or a lease's end its devices. A user's streams get the queue as
they may see it (``positions``) whenever it changes and, after a window with a drain,
vacating or outside use, the devices with their holders (``devices``). Every stream
gets the devices' readings when they change (``readings``, every
``events.READINGS_S``): readings are what ``GET devices`` shows every caller. A kernel
token's stream gets only its own kernel's requests and positions, and the notices
about its user that are not about any request (use of a GPU outside the broker).
Streams that see alike share one ``events.Group``: each message is decided and encoded
once for all of them, the latest about each thing winning within the group's window.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..events import USER_NOTICES, Chunk, Key, Message, Positions, Published, Stream, envelope
from .base import Rules
from .identity import Identity
from .shapes import event_json, held_back_text, queue_json, reading_json, request_json

DEVICE_CHANGES = ("drained", "undrained", "vacating", "vacated", "repartitioned", "outside_use")
"""Events after which a user's streams get the ``devices`` (grants and lease ends carry
the devices they took or gave back themselves)."""


LEASE_CHANGES = ("granted", "released", "expired", "reclaimed")
"""Events whose devices change holder: others' show which (``devices``)."""


TRANSITIONS = ("queued", "granted", "released", "expired", "cancelled", "refused", "reclaimed")
"""A request's moves from state to state: within a window only the latest is sent (it
carries the request as it is then). Other events about a request (reclassed, warnings,
drains) are notices, each sent."""


def key_of(published: Published) -> Key:
    """What an event is about, for coalescing: a request's state (its transitions), or
    the event itself."""
    e = published.event
    if e.request_id is not None and e.kind in TRANSITIONS:
        return ("request", e.request_id)
    return ("event", published.id)


class AudienceView:
    """What one audience (a viewer, as an ``Identity`` sees) gets of each item."""

    def __init__(self, api: StreamRules, who: Identity) -> None:
        self.api, self.who = api, who
        self.devices_due = False

    def see(self, item: Published | Positions) -> list[tuple[Key, Message]]:
        who = self.who
        if isinstance(item, Positions):
            seen = self.api.moved(who, item)
            return [] if seen is None else [("positions", seen)]
        seen = self.api.event(who, item)
        if seen is None:
            return []
        if who.kernel_id is None and item.event.kind in DEVICE_CHANGES:
            self.devices_due = True
        return [(key_of(item), seen)]

    def window(self, batch: list[Message]) -> list[tuple[Key, Message]]:
        """After a window with events that move devices: the devices as ``who`` sees them."""
        if not self.devices_due or not batch:
            return []
        self.devices_due = False
        gpus = self.api.devices(self.who)
        at = self.api.core.clock.now()
        return [("devices", envelope(batch[-1]["id"], "devices", at, gpus))]


class StreamRules(Rules):
    """The event streams: who sees what, and how a stream starts and resumes."""

    if TYPE_CHECKING:

        def overview(self, who: Identity) -> dict[str, Any]: ...

        def devices(self, who: Identity) -> dict[str, Any]: ...

        def _lease_json(self, lease: Any) -> dict[str, Any]: ...

    def follow(
        self,
        who: Identity,
        send: Callable[[dict[str, Any]], None] | None = None,
        last_event_id: int | None = None,
        write: Callable[[Chunk], None] | None = None,
        snapshot: bool = False,
    ) -> tuple[list[dict[str, Any]], Callable[[], None]]:
        """A stream of ``who``'s: what it starts with (``resume``) and its leave; from
        then on, once per window, ``write`` gets the window's messages ``who`` may see
        encoded (an HTTP stream), or ``send`` each of them (a listener in process). A
        kernel token's stream is not even told of another kernel's events. The start is
        read before joining, and nothing is awaited in between, so no event falls between
        the two; a window that began before it joined sends it only newer messages.
        ``snapshot``: a new stream starts with the whole picture (a front's one overview,
        in order with the events that follow it)."""
        start = self.resume(who, last_event_id, snapshot)
        bus = self.runtime.events
        fanout = bus.fanout
        if fanout.readings is None:
            fanout.readings = self._readings
        audience = None if who.kernel_id is None else (who.user, who.kernel_id)
        stream = Stream(bus.last_event_id, write=write, send=send)
        key = (who.user, who.admin, who.kernel_id)
        return start, fanout.join(key, lambda: AudienceView(self, who), stream, audience)

    def _readings(self) -> dict[str, Any]:
        """Every GPU's and device's latest readings (no NVML call here)."""
        return {uuid: reading_json(r) for uuid, r in self.runtime.readings().items()}

    def event(self, who: Identity, published: Published) -> dict[str, Any] | None:
        """An event as ``who`` may see it (``None``: not at all). A user sees everyone's
        (others' reduced to whose it is) but alerts, which only admins see; a kernel token
        its own kernel's, and its user's notices about no request. One's own event carries
        its request with its lease as they are now (``request``)."""
        e = published.event
        if e.kind == "alert" and not who.admin:
            return None
        if who.kernel_id is not None and (
            e.user != who.user
            or published.holder != who.kernel_id
            and not (published.holder is None and e.kind in USER_NOTICES)
        ):
            return None
        full = who.admin or e.user == who.user  # the same for every viewer who sees it so
        if full not in published.views:
            view = event_json(published.id, e, who.user, who.admin)
            if full and e.request_id is not None:
                view["data"]["request"] = self._request_state(e.request_id)
            elif not full and e.lease_id is not None and e.kind in LEASE_CHANGES:
                lease = self.runtime.events.lease_of(e.lease_id)
                view["data"]["devices"] = list(lease.devices)
            published.views[full] = view
        return published.views[full]

    def _request_state(self, request_id: str) -> dict[str, Any]:
        """A request with its lease, as its event shows them (no position: ``positions``
        brings it), from the objects the bus keeps (no read of the state file)."""
        bus = self.runtime.events
        r = bus.request_of(request_id)
        d = request_json(r)
        d["lease"] = self._lease_json(bus.lease_of(r.lease_id)) if r.lease_id else None
        return d

    def positions(self, who: Identity, kind: str = "positions") -> dict[str, Any]:
        """``who``'s waiting requests with positions and ETAs, and the queue."""
        return self._positions_json(who, self.runtime.events.positions(), kind)

    def moved(self, who: Identity, positions: Positions) -> dict[str, Any] | None:
        """A ``positions`` event for ``who``: a user's whenever the queue changed (its
        fronts show the whole queue), a kernel token's when one of its requests moved."""
        mine = (
            positions.changed
            if who.kernel_id is None
            else (who.user, who.kernel_id) in positions.moved_holders
        )
        return self._positions_json(who, positions, "positions") if mine else None

    def _positions_json(self, who: Identity, p: Positions, kind: str) -> dict[str, Any]:
        if who.kernel_id is None:
            entries = p.by_user.get(who.user, [])
        else:
            entries = p.by_holder.get((who.user, who.kernel_id), [])
        data: dict[str, Any] = {
            "queue_length": p.length,
            "requests": [
                request_json(
                    e.request,
                    e,
                    p.length,
                    p.ahead[e.request.id],
                    held_back_text(self.core, e.request, who.user),
                )
                for e in entries
            ],
            "ahead": {e.request.id: p.ahead[e.request.id] for e in entries},
        }
        if who.kernel_id is None:  # a kernel's stream follows only its own requests
            data["queue"] = queue_json(p.entries, who.user, who.admin)
        return envelope(p.id, kind, p.at, data)

    def resume(
        self, who: Identity, last_event_id: int | None, snapshot: bool = False
    ) -> list[dict[str, Any]]:
        """What a stream starts with: a ``hello`` with ``who``'s positions (a
        ``snapshot``, the overview, when asked); after a reconnect (``last_event_id``) the
        events it missed (the latest about each request only, as a window sends them),
        then its positions; a ``snapshot`` when those events are no longer kept."""
        bus = self.runtime.events
        if last_event_id is None and not snapshot:
            return [self.positions(who, "hello")]
        missed = None if last_event_id is None else bus.since(last_event_id)
        if missed is None:
            at = self.core.clock.now()
            return [envelope(bus.last_event_id, "snapshot", at, self.overview(who))]
        latest: dict[Key, dict[str, Any]] = {}
        for p in missed:
            seen = self.event(who, p)
            if seen is not None:
                key = key_of(p)
                latest.pop(key, None)
                latest[key] = seen
        return [*latest.values(), self.positions(who)]
