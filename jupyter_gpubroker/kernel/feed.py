"""The kernel's line to the broker: a loop of its own and live feeds shared by the widgets.

While a cell runs the kernel's own event loop is blocked (``%gpu request`` may wait for
minutes), so every broker call runs on a background thread with its own asyncio loop
(``Runner``). Widgets do not poll the broker: they subscribe to one event stream
(``EventFeed``), which brings this kernel's requests and positions and, every few
seconds, the devices' readings that changed; while a status widget is open, one
``Clock`` redraws it (time held, idle time, recent load) between messages. Each runs
only while someone listens, and stops when the last listener leaves.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import logging
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from ..client import BrokerAPIError, BrokerClient

T = TypeVar("T")
if TYPE_CHECKING:
    Log: TypeAlias = logging.Logger | logging.LoggerAdapter[Any]
    """The app's traitlets logger (an adapter in some versions of traitlets)."""
Listener = Callable[[Any], Awaitable[None]]
TRANSIENT = (BrokerAPIError, OSError, asyncio.TimeoutError)
"""What a lost or refused connection raises: retried by the feed, reported by ``%gpu``."""


def why(e: BaseException) -> str:
    """An error from the broker or the network, in one line."""
    return e.message if isinstance(e, BrokerAPIError) else str(e) or type(e).__name__


class Runner:
    """An asyncio loop on a daemon thread: one per kernel, for every broker call."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="gpubroker", daemon=True).start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coro`` on the loop, in an empty context.

        ipykernel then sends what the coroutine displays (widget updates) as replies to
        the newest request, as it does for any thread the user starts; a copy of the
        caller's context would tie every later update to the cell that started it.
        """
        return contextvars.Context().run(asyncio.run_coroutine_threadsafe, coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result; interrupted, it is cancelled."""
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()
            raise


class Broadcast:
    """One stream of updates fanned out to listeners, running only while anyone listens.

    Listeners are coroutine functions called on the runner's loop, one after another.
    """

    def __init__(self, runner: Runner, log: Log) -> None:
        self.runner, self.log = runner, log
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()
        self._task: concurrent.futures.Future[None] | None = None

    @property
    def active(self) -> bool:
        return self._task is not None and not self._task.done()

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Start delivering to ``listener``; returns the function that stops it."""
        with self._lock:
            self._listeners.append(listener)
            if self._task is None:
                self._task = self.runner.submit(self._run())
        return lambda: self._unsubscribe(listener)

    def _unsubscribe(self, listener: Listener) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)
            if not self._listeners and self._task is not None:
                self._task.cancel()
                self._task = None

    async def publish(self, item: Any) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                await listener(item)
            except TRANSIENT as e:  # the broker went away mid-update: the next one will do
                self.log.info("GPU broker: a %%gpu widget could not update: %s", e)
            except Exception:  # one broken listener must not stop the others' updates
                self.log.warning("GPU broker: a %%gpu widget failed to update", exc_info=True)

    async def _run(self) -> None:
        raise NotImplementedError


REVOKED = (
    "This kernel's GPU broker token is no longer valid, so its GPU widgets stop updating: "
    "restart the kernel to get a new one."
)
"""What a kernel's user reads once the broker refuses its token (403: revoked, or from a
broker that restarted without it)."""


class EventFeed(Broadcast):
    """The broker's server-sent events: this kernel's requests and positions, and the
    devices' readings.

    Listeners also get two messages of the feed's own: ``{"type": "connected", "data":
    {}}`` before each connection's first message (what no replay carries, the readings
    sent while it was down, is read again then); and, once the broker refuses the token
    (no retry would change it), ``{"type": "ended", "data": {"message": REVOKED}}``,
    whose sentence is also shown once in the notebook (the output of the cell that runs
    now): the feed then ends for good."""

    ended: str | None = None
    """Why the feed ended; None while it runs or may run again."""

    def __init__(self, runner: Runner, client: BrokerClient, log: Log) -> None:
        super().__init__(runner, log)
        self.client = client

    async def _run(self) -> None:
        while True:  # a reconnect resumes where the stream broke (``BrokerClient.follow``)
            try:
                follow = self.client.follow(pause=1.0, opened=self._connected)
                async with contextlib.aclosing(follow) as events:
                    async for event in events:
                        await self.publish(event)
            except BrokerAPIError as e:
                if e.status == 403:
                    await self._end(REVOKED)
                    return
                self.log.info("GPU broker event stream refused (%s); retrying", e)
            except TRANSIENT as e:
                self.log.info("GPU broker event stream lost (%s); retrying", why(e))
            await asyncio.sleep(30.0)

    async def _connected(self) -> None:
        await self.publish({"type": "connected", "data": {}})

    async def _end(self, message: str) -> None:
        self.ended = message
        self.log.warning("GPU broker: %s", message)
        print(message, file=sys.stderr)
        await self.publish({"type": "ended", "data": {"message": message}})


class Clock(Broadcast):
    """The time (``time.time()``) at once and then every ``interval`` seconds: the
    status widgets redraw on it between the feed's messages (time held, idle time, the
    recent load). It calls nothing."""

    interval = 3.0

    async def _run(self) -> None:
        while True:
            await self.publish(time.time())
            await asyncio.sleep(self.interval)
