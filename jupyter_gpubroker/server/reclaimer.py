"""The server's kernels as idle reclaim sees them, and what a reclaim does to them.

A lease belongs to a kernel when its request's holder is that kernel's id (the GPU
provisioner and ``%gpu`` both submit so). Whether the kernel is idle is read from
its IOPub channel, not from jupyter-server's ``last_activity``: that one also moves
on every message a kernel sends by itself, such as a widget refreshing in the
background, so a notebook showing a live GPU widget would never look idle. Only
the status changes around requests the user sent (running a cell, a widget
interaction) count here.

In remote mode the central broker decides and this server acts: each renewal
reports the kernel's state (``ServerKernels.state``), and ``carry_out_reclaims``
hears the central broker's ``reclaimed`` events and shuts down (or interrupts) the
kernel whose lease it was, provisioned or taken with ``%gpu``, or leaves it running where
the central broker suspended it (the lease's ``on_reclaim``).

A server with a GPU of its own (the hub's GPU spawner, ``$GPUBROKER_SERVER_LEASE``) is
judged as a whole: ``report_server_activity`` renews the server's lease with the state of
all its kernels together (busy while any runs a cell; idle since the last one ran one),
so the central broker's reclaimer warns an idle GPU server and reclaims its lease, and
the hub, which holds that lease, stops the server. HTTP activity (a browser tab left
open, JupyterLab's polling) is not activity here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import Any

from jupyter_client.session import Session
from jupyter_core.utils import ensure_async

from ..broker.clock import Clock
from ..broker.reclaim import KernelState
from ..client import BrokerAPIError, BrokerClient, kernel_report

USER_REQUESTS = ("execute_request", "comm_msg")
"""Requests whose handling counts as the kernel being used."""
NOTICE_S = 2.0
"""How long a reclaimed kernel lives on before it is shut down, so that its widgets can
show why. Its lease, and so its device, went back to the queue at the reclaim."""
DOING = {
    "shutdown": "shutting it down",
    "revoke": "interrupting it",
    "suspend": "leaving it running, suspended",
}
"""What this server does to a reclaimed lease's kernel (its ``on_reclaim``), for the log."""


class _Watch:
    """One kernel's execution state and last activity, from its IOPub status messages.

    A new subscription misses what the kernel publishes before it is connected (ZeroMQ's
    "slow joiner"), so a watch begun while a cell runs can miss that cell's end and see
    the kernel busy for good: a GPU server that never looks idle keeps its GPU. So a busy
    watch defers to jupyter-server's own state, watched since the kernel started, once
    that says idle (only that way: jupyter-server also counts requests that are no use
    of the kernel, such as completions, as busy)."""

    def __init__(self, kernel: Any, clock: Clock) -> None:
        self.kernel, self.clock = kernel, clock
        state = getattr(kernel, "execution_state", "idle")
        self.state = state if state in ("idle", "busy") else "idle"
        last = getattr(kernel, "last_activity", None)
        self.last_activity = last.timestamp() if last is not None else clock.now()
        self.session = Session(config=kernel.session.config, key=kernel.session.key)
        self.stream = kernel.connect_iopub()
        self.stream.on_recv(self._on_message)

    def _on_message(self, parts: list[bytes]) -> None:
        _, message = self.session.feed_identities(parts)
        msg = self.session.deserialize(message, content=False)
        parent = (msg.get("parent_header") or {}).get("msg_type")
        if msg["header"]["msg_type"] != "status" or parent not in USER_REQUESTS:
            return
        state = self.session.deserialize(message)["content"]["execution_state"]
        if state in ("idle", "busy"):
            self.state, self.last_activity = state, self.clock.now()

    def observe(self) -> KernelState:
        if self.state == "busy" and getattr(self.kernel, "execution_state", None) == "idle":
            self.state, self.last_activity = "idle", self.clock.now()  # its end was missed
        return KernelState(self.state, self.last_activity)

    def close(self) -> None:
        if not self.stream.closed():
            self.stream.close()


class ServerKernels:
    """The ``KernelActions`` of a jupyter-server: its ``kernel_manager``'s kernels."""

    def __init__(
        self, kernel_manager: Any, clock: Clock, log: logging.Logger, owner: str | None = None
    ) -> None:
        self.kernel_manager, self.clock, self.log = kernel_manager, clock, log
        self.owner = owner
        """The user of every kernel here that names none (a single-user server's owner);
        None where several users share the server."""
        self._watches: dict[str, _Watch] = {}
        self._shutdowns: set[asyncio.Task[None]] = set()
        self._busy_until = 0.0
        """When a kernel last went away while busy: its cell ran until then."""

    def observe(self, holders: Iterable[str]) -> dict[str, KernelState]:
        """Watch the kernels among ``holders`` (and stop watching the others)."""
        kernels = {o for o in holders if o in self.kernel_manager}
        for gone in self._watches.keys() - kernels:
            self.forget(gone)
        states = {k: self.state(k) for k in kernels}
        return {k: state for k, state in states.items() if state is not None}

    def state(self, kernel_id: str) -> KernelState | None:
        """One kernel's state, watched from now on (in remote mode each provisioner asks
        for its own kernel's, to report it with its lease's renewals); ``None`` while it
        cannot be watched."""
        if kernel_id not in self._watches:
            try:
                self._watches[kernel_id] = _Watch(
                    self.kernel_manager.get_kernel(kernel_id), self.clock
                )
            except Exception as e:  # starting, or going away: next pass
                self.log.debug("GPU broker: cannot watch kernel %s yet: %s", kernel_id, e)
                return None
        return self._watches[kernel_id].observe()

    def server_state(self, since: float) -> KernelState:
        """All of this server's kernels as one: ``busy`` while any runs a cell, else idle
        since the last one started or finished one (``since`` at the least: the server's
        start). Kernels that ended are no longer watched."""
        running = set(self.kernel_manager.list_kernel_ids())
        for gone in self._watches.keys() - running:
            self.forget(gone)
        states = [s for s in map(self.state, running) if s is not None]
        busy = any(s.execution_state == "busy" for s in states)
        last = max((s.last_activity for s in states), default=since)
        return KernelState("busy" if busy else "idle", max(last, since, self._busy_until))

    def forget(self, kernel_id: str) -> None:
        """Stop watching a kernel (it ended, or holds no lease any more)."""
        watch = self._watches.pop(kernel_id, None)
        if watch is not None:
            if watch.state == "busy":
                self._busy_until = self.clock.now()
            watch.close()

    def handles(self, kernel_id: str) -> bool:
        """Whether the kernel manager has the kernel in hand: it starts, restarts or shuts
        it down now, or runs it in a process that has not exited (polled as jupyter-client
        polls it, which reaps one that did)."""
        if kernel_id not in self.kernel_manager:
            return False
        kernel = self.kernel_manager.get_kernel(kernel_id)
        if kernel.shutting_down or not kernel.ready.done():
            return True
        process = getattr(kernel.provisioner, "process", None)  # a local provisioner's
        return process is not None and process.poll() is None

    def running(self) -> list[tuple[str, str]]:
        found = ((self.user_of(k), k) for k in self.kernel_manager.list_kernel_ids())
        return [(user, k) for user, k in found if user is not None]

    def user_of(self, kernel_id: str) -> str | None:
        """The user the kernel is charged to: its GPU provisioner's, else ``owner``."""
        if kernel_id not in self.kernel_manager:
            return None
        provisioner = self.kernel_manager.get_kernel(kernel_id).provisioner
        return getattr(provisioner, "charged_to", "") or self.owner

    async def act(self, kernel_id: str, action: str) -> None:
        """``revoke``: interrupt the kernel now; ``shutdown``: shut it down ``NOTICE_S``
        later; ``suspend``: nothing (a broker suspended it: it runs on, off its GPU)."""
        if kernel_id not in self.kernel_manager or action == "suspend":
            return
        if action == "revoke":
            await ensure_async(self.kernel_manager.interrupt_kernel(kernel_id))
            return
        task = asyncio.ensure_future(self._shut_down(kernel_id))
        self._shutdowns.add(task)
        task.add_done_callback(self._shutdowns.discard)

    async def _shut_down(self, kernel_id: str) -> None:
        await asyncio.sleep(NOTICE_S)
        try:
            if kernel_id in self.kernel_manager:
                await ensure_async(self.kernel_manager.shutdown_kernel(kernel_id))
        except Exception:
            self.log.exception("GPU broker: cannot shut down reclaimed kernel %s", kernel_id)

    def close(self) -> None:
        for watch in self._watches.values():
            watch.close()
        self._watches.clear()
        for task in self._shutdowns:
            task.cancel()


async def carry_out_reclaims(broker: BrokerClient, kernels: ServerKernels) -> None:
    """Follow the central broker's events as this server's user and carry out each reclaim
    of a lease held by one of this server's kernels, as the lease's ``on_reclaim`` says.
    The stream resumes where it broke; a refused one (the user's token revoked) is logged
    once and given up."""
    log = kernels.log
    try:
        async with contextlib.aclosing(broker.follow()) as events:
            async for message in events:
                if message["type"] != "reclaimed":
                    continue
                try:
                    request = await broker.request(message["data"]["request_id"])
                except (BrokerAPIError, OSError) as e:
                    log.warning("GPU broker: cannot read a reclaimed request: %s", e)
                    continue
                kernel_id, lease = request["holder"], request["lease"]
                if lease is None or kernel_id not in kernels.kernel_manager:
                    continue  # another server's kernel (the same user's), or none
                log.warning(
                    "GPU broker: lease %s of kernel %s reclaimed (%s): %s",
                    lease["id"],
                    kernel_id,
                    lease["reason"],
                    DOING.get(lease["on_reclaim"], lease["on_reclaim"]),
                )
                await kernels.act(kernel_id, lease["on_reclaim"])
    except BrokerAPIError as e:
        log.error(
            "GPU broker at %s refused this server's event stream (%s): its kernels' leases "
            "reclaimed there are not shut down here",
            broker.url,
            e.message,
        )


async def report_server_activity(
    broker: BrokerClient, lease_id: str, kernels: ServerKernels, interval: float
) -> None:
    """Renew the server's own lease every ``interval`` seconds with its kernels' activity
    (``ServerKernels.server_state``), for the central broker to judge the server idle or
    not; the hub renews it too, and stops the server once the lease ends. Ends when the
    lease does (404, 409) or the broker refuses this server's credential."""
    log, since = kernels.log, kernels.clock.now()
    log.info("GPU broker: reporting this server's kernel activity with lease %s", lease_id)
    while True:
        state = kernels.server_state(since)
        since = state.last_activity
        try:
            await broker.renew(lease_id, kernel_report(state.execution_state, since))
        except BrokerAPIError as e:
            if e.status < 500:
                log.info("GPU broker: this server's lease %s ended (%s)", lease_id, e.message)
                return
            log.warning("GPU broker: cannot report this server's activity: %s", e.message)
        except OSError as e:
            log.warning("GPU broker: cannot report this server's activity: %s", e)
        await asyncio.sleep(interval)
