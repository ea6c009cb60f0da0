"""This kernel's dealings with the broker: its request, its lease and what follows them.

A kernel holds at most one live request: the provisioner's (a GPU kernelspec) or one
made with ``%gpu request``. The ``Tracker`` follows it through the event feed; the
``Session`` renews its ``%gpu`` request while it waits, pins the granted devices in the
process environment, renews leases it obtained itself (the provisioner renews its own),
and unpins them when the lease ends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from IPython.core.getipython import get_ipython

from ..client import SERVER_LEASE_ENV, BrokerClient, keep_alive, kernel_report
from ..wire.text import LIVE, duration, size_text
from . import NO_GPUS_ENV, GpuError
from .cuda import cuda_initialised
from .feed import Clock, EventFeed, Runner

if TYPE_CHECKING:
    from .feed import Log

T = TypeVar("T")
LEASE_ENV = "GPUBROKER_LEASE_ID"
"""The provisioner's own lease, which it renews itself."""
KERNEL_ENV = "GPUBROKER_KERNEL_ID"
PLACE = ("position", "place", "eta", "eta_range", "eta_known", "eta_basis", "held_back")
"""A waiting request's place in the queue (and a quota's hold on it), which ``positions``
events bring."""

NO_BROKER = (
    "no GPU broker for this kernel: start it with a GPU kernelspec (e.g. "
    '"Python 3 (GPU on demand)"), or set GPUBROKER_URL (e.g. '
    "http://localhost:8888/gpubroker/api/v1) and GPUBROKER_JUPYTER_TOKEN (the Jupyter "
    "server's token) before the first %gpu"
)


class Activity:
    """When this kernel last started or finished running a cell: its idle time."""

    def __init__(self) -> None:
        self.busy, self.since = False, time.time()

    def register(self, shell: Any) -> None:
        shell.events.register("pre_run_cell", self._started)
        shell.events.register("post_run_cell", self._finished)

    def _started(self, *_: Any) -> None:
        self.busy, self.since = True, time.time()

    def _finished(self, *_: Any) -> None:
        self.busy, self.since = False, time.time()

    def text(self, granted_at: float) -> str:
        """Busy, or idle since its last cell but never since before the grant (a kernel
        that waited in the queue for half an hour was not idle on its GPU): the time idle
        reclaim counts, and the Lab panel shows."""
        if self.busy:
            return "kernel busy"
        return f"kernel idle for {duration(time.time() - max(self.since, granted_at))}"

    def report(self) -> dict[str, Any]:
        """As a lease renewal reports it (a central broker cannot watch this kernel)."""
        return kernel_report("busy" if self.busy else "idle", self.since)


class Tracker:
    """One of this kernel's requests, followed from the queue to its end.

    Driven by the event feed on the runner's loop: while queued, its ``positions``
    events bring its position, ETA and the requests ahead of it; an event about the
    request brings the request with its lease; only a new stream's first message that
    lacks it has it read again. It listens while
    queued (a grant must be noticed with no widget open) and, once granted, while a
    widget watches it.
    """

    def __init__(self, session: Session, request: dict[str, Any]) -> None:
        self.session, self.request = session, request
        self.ahead: dict[str, int] = {}
        """Requests ahead of this one, by job class."""
        self.queue_length: int = request.get("position") or 0
        self.warning: dict[str, Any] | None = None
        """The lease's pending warning (``reason``, ``deadline``, ``cause``) since its
        ``warning`` event; None once withdrawn or extended."""
        self.settled: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        """Resolves with the request when it leaves the queue (granted or ended)."""
        self._watchers: list[Callable[[], None]] = []
        self._stop_listening: Callable[[], None] | None = None
        self._lock = threading.Lock()
        if self.state != "queued":
            self.settled.set_result(request)
        self._listen()

    @property
    def id(self) -> str:
        return str(self.request["id"])

    @property
    def state(self) -> str:
        return str(self.request["state"])

    @property
    def lease(self) -> dict[str, Any] | None:
        return self.request.get("lease")

    def watch(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` (on the runner's thread) after each change; returns the
        function that stops it."""
        with self._lock:
            self._watchers.append(callback)
        self._listen()
        return lambda: self._unwatch(callback)

    def _unwatch(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if callback in self._watchers:
                self._watchers.remove(callback)
        self._listen()

    def _listen(self) -> None:
        with self._lock:
            wanted = self.state == "queued" or (self.state == "granted" and bool(self._watchers))
            if wanted == (self._stop_listening is not None):
                return
            if wanted:
                self._stop_listening = self.session.feed.subscribe(self._on_event)
            else:
                assert self._stop_listening is not None
                self._stop_listening()
                self._stop_listening = None
        if wanted:  # whatever happened before the feed (re)connected
            self.session.runner.submit(self.refresh())

    async def _on_event(self, event: dict[str, Any]) -> None:
        """Take the request's state from the event itself: its positions from
        ``hello``/``positions``, its request and lease from its own events; read it only
        when a stream starts without it (a ``snapshot``, or a ``hello`` that no longer
        lists it: it left the queue while nobody listened)."""
        kind, data = event["type"], event["data"]
        if kind in ("hello", "positions"):
            mine = next((r for r in data["requests"] if r["id"] == self.id), None)
            if mine is not None:  # the event carries it all: no need to ask
                self.queue_length, self.ahead = data["queue_length"], data["ahead"][self.id]
                self.update({**self.request, **mine})
            elif kind == "hello":
                await self.refresh()
        elif kind == "snapshot":
            await self.refresh()
        elif data.get("request_id") == self.id and data.get("request") is not None:
            if kind == "warning":
                self.warning = data
            elif kind in ("warning_cleared", "extended"):
                self.warning = None
            request = data["request"]
            if request["state"] == "queued":  # its place comes with ``positions``
                request = {**request, **{k: self.request.get(k) for k in PLACE}}
            self.update({**self.request, **request})

    async def refresh(self) -> None:
        """Read the request again (and the queue ahead of it while it waits)."""
        client = self.session.client
        request = await client.request(self.id)
        if request["state"] == "queued":
            position = request.get("position") or 0
            queue = await client.queue()
            self.queue_length = len(queue)
            self.ahead = dict(Counter(e["job_class"] for e in queue if e["position"] < position))
        self.update(request)

    def update(self, request: dict[str, Any]) -> None:
        """Take the request's new state (from any thread) and tell whoever should know."""
        before, self.request = self.state, request
        if self.state != before:
            self.session.changed(self)
        with self._lock:
            watchers = list(self._watchers)
        for callback in watchers:
            callback()
        if self.state != before:
            self._listen()
            if not self.settled.done() and self.state != "queued":
                self.settled.set_result(request)  # last: a waiting cell ends with the view


class Session:
    """This kernel's broker client, background loop, feed, clock and live request."""

    def __init__(
        self, client: BrokerClient, kernel_id: str, log: Log, refresh_interval: float
    ) -> None:
        self.client, self.kernel_id, self.log = client, kernel_id, log
        self.runner = Runner()
        self.feed = EventFeed(self.runner, client, log)
        self.clock = Clock(self.runner, log)
        self.clock.interval = refresh_interval
        self.tracker: Tracker | None = None
        self._pinned: str | None = None
        """The request whose devices CUDA_VISIBLE_DEVICES names."""
        self._heartbeat: tuple[str, concurrent.futures.Future[None]] | None = None
        self.activity: Activity | None = None
        """This kernel's activity, reported with each renewal of a lease it took itself."""

    @classmethod
    def from_env(cls, log: Log, refresh_interval: float) -> Session:
        try:
            client = BrokerClient.from_env()
        except ValueError:
            raise GpuError(os.environ.get(NO_GPUS_ENV) or NO_BROKER) from None
        return cls(client, _kernel_id(), log, refresh_interval)

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.runner.call(coro)

    # -- this kernel's request

    def live(self) -> Tracker | None:
        """This kernel's live request (the provisioner's or a ``%gpu`` one), else the
        reservation of its server that it shares (``shared``), followed."""
        if self.tracker is not None:
            self.call(self.tracker.refresh())
            if self.tracker.state in LIVE:
                return self.tracker
        mine = [r["id"] for r in self.call(self.client.requests()) if r["holder"] == self.kernel_id]
        if mine:
            request = self.call(self.client.request(mine[0]))
        elif self.server_lease:
            lease = self.call(self.client.lease(self.server_lease))
            request = self.call(self.client.request(lease["request_id"]))
            if request["state"] not in LIVE:
                return None
        else:
            return None
        self.tracker = Tracker(self, request)
        self.changed(self.tracker)
        return self.tracker

    @property
    def server_lease(self) -> str:
        """The lease of this kernel's server, when the server holds a GPU of its own (the
        hub's GPU spawner): its kernels share it rather than ask for another."""
        return os.environ.get(SERVER_LEASE_ENV, "")

    def shared(self, tracker: Tracker) -> dict[str, Any] | None:
        """The server's lease when ``tracker`` is the server's reservation (not this kernel's
        own request), else None."""
        lease = tracker.lease
        return lease if self.server_lease and lease and lease["id"] == self.server_lease else None

    def submit(self, size: dict[str, Any], job_class: str, limit_s: float | None = None) -> Tracker:
        """Ask for ``size`` for this kernel; refused while it already has a live request or
        once CUDA is initialised (the device could not be pinned any more). Interrupted,
        it withdraws the request before it lets the interrupt through. In a server with a
        GPU of its own, the server's: ``live`` before asking says so."""
        held = self.live()
        if held is not None:
            raise GpuError(f"this kernel already {holding(held.request)}: %gpu release first")
        initialised_by = cuda_initialised()
        if initialised_by is not None:
            raise GpuError(
                f"CUDA is already initialised in this kernel (by {initialised_by}), so a GPU "
                "granted now would stay invisible to it: restart the kernel and run %gpu "
                "request before using the GPU, or start it with a GPU kernelspec"
            )
        submitted = self.runner.submit(
            self.client.submit(**size, job_class=job_class, holder=self.kernel_id, limit_s=limit_s)
        )
        try:
            request = submitted.result()
        except KeyboardInterrupt:  # it is on its way: let it land, then take it back
            self.call(self.client.cancel(submitted.result()["id"]))
            raise
        self.tracker = Tracker(self, request)
        self.changed(self.tracker)
        return self.tracker

    def withdraw(self, tracker: Tracker) -> None:
        """Cancel the request, or release its lease if it has one."""
        tracker.update(self.call(self.client.cancel(tracker.id)))

    def extend(self, tracker: Tracker, seconds: float) -> dict[str, Any]:
        """Give the lease of ``tracker`` ``seconds`` more on its time limit; the broker's
        refusal (``BrokerAPIError``) says why not."""
        lease = tracker.lease
        if tracker.state != "granted" or lease is None:
            raise GpuError("this kernel holds no GPU to extend")
        extended = self.call(self.client.extend(lease["id"], seconds))
        tracker.warning = None
        tracker.update({**tracker.request, "lease": extended})
        return extended

    def changed(self, tracker: Tracker) -> None:
        """Keep a waiting request alive; pin the devices of a grant in this process's
        environment; unpin them when the lease ends."""
        lease = tracker.lease
        if tracker.state == "queued":
            self._renew("request", tracker.request)
        elif tracker.state == "granted" and lease is not None:
            devices = ",".join(lease["devices"])
            os.environ.update(CUDA_VISIBLE_DEVICES=devices, NVIDIA_VISIBLE_DEVICES=devices)
            self._pinned = tracker.id
            if lease["id"] not in (os.environ.get(LEASE_ENV), self.server_lease):
                self._renew("lease", lease)
            else:
                self._stop_renewing()  # the provisioner's own, or the server's: they renew it
        elif tracker.state not in LIVE:
            self._stop_renewing()
            if self._pinned == tracker.id:
                os.environ["CUDA_VISIBLE_DEVICES"] = ""  # nothing held: no device visible
                os.environ.pop("NVIDIA_VISIBLE_DEVICES", None)
                self._pinned = None

    # -- heartbeat of the %gpu request while it waits, then of its lease

    def _renew(self, kind: str, held: dict[str, Any]) -> None:
        """Renew ``held``, a queued request or a lease (``kind``), every third of its TTL."""
        if self._heartbeat is not None and self._heartbeat[0] == held["id"]:
            return
        self._stop_renewing()
        self._heartbeat = (held["id"], self.runner.submit(self._heartbeats(kind, held)))

    def _stop_renewing(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat[1].cancel()
            self._heartbeat = None

    async def _heartbeats(self, kind: str, held: dict[str, Any]) -> None:
        """Renew while this kernel process lives (and the request or lease does)."""

        async def renew_lease(lease_id: str) -> dict[str, Any]:
            report = self.activity.report() if self.activity is not None else None
            return await self.client.renew(lease_id, report, holder_pid=os.getpid(), log=self.log)

        renew = renew_lease if kind == "lease" else self.client.renew_request
        # a lease's first renewal at once: it names this kernel's process (outside use)
        lost = await keep_alive(renew, held, request=kind == "request", now=kind == "lease")
        if lost is not None:  # ended elsewhere (expired, reclaimed, released) or refused
            self.log.warning("GPU %s %s lost: %s", kind, held["id"], lost.message)
            if self.tracker is not None:
                await self.tracker.refresh()

    # -- the rest of the API, as %gpu shows it

    def usage_by_day(self, days: int) -> list[dict[str, Any]]:
        """My GPU-hours on each of the last ``days`` days (local time), oldest first."""

        async def read() -> list[dict[str, Any]]:
            me = (await self.client.me())["user"]
            today = datetime.now().astimezone().replace(hour=0, minute=0, second=0, microsecond=0)
            starts = [today - timedelta(days=n) for n in reversed(range(days))]
            replies = await asyncio.gather(
                *(
                    self.client.usage(
                        since=s.isoformat(), until=(s + timedelta(days=1)).isoformat()
                    )
                    for s in starts
                )
            )
            return [
                {"date": s.date().isoformat(), "gpu_hours": r["gpu_hours"].get(me, 0.0)}
                for s, r in zip(starts, replies, strict=True)
            ]

        return self.call(read())


def holding(request: dict[str, Any]) -> str:
    """What a live request means for its kernel, as words after "this kernel ..."."""
    if request["state"] == "granted" and request.get("lease"):
        return f"holds {', '.join(request['lease']['devices'])} ({size_text(request)})"
    return f"waits for {size_text(request)} at position {request.get('position')} in the queue"


def _kernel_id() -> str:
    """Whose requests are this kernel's: the provisioner names it; a plain kernel's comes
    from its connection file (kernel-<id>.json); a terminal IPython uses its pid."""
    if os.environ.get(KERNEL_ENV):
        return os.environ[KERNEL_ENV]
    if getattr(get_ipython(), "kernel", None) is not None:
        from ipykernel.connect import get_connection_file

        match = re.fullmatch(r"kernel-(.+)\.json", Path(get_connection_file()).name)
        if match:
            return match.group(1)
    return f"ipython-{os.getpid()}"
