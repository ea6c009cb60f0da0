"""Moving kernels instead of ending them: off a drained GPU, onto a free one of its model.

A drain (an admin's with ``move``, a health fault, an alert the admin marked ``move``)
hands each lease on the drained GPU here. A kernel that can move is suspended on its GPUs
and restored onto as many free GPUs of the same model (NVIDIA restores onto the same chip
only: ``CUcheckpointRestoreArgs.gpuPairs``), each with the kernel's memory free, reserved
for it meanwhile; then its lease holds the new GPUs (``Broker.move``: the same lease, so
its kernel renews it as before). Its running cell pauses while it moves (CUDA calls block
in a locked process) and goes on after. Its notebook says one line before its next cell
("moved from GPU 3 to GPU 5: GPU 3 is too hot"), and the audit log records each move.

A kernel that cannot move (a MIG slice, GPUs the canary did not pass, no free GPU of its
model, a kernel that never named its process) keeps its lease as a plain drain leaves it,
and is told why. A suspend that fails changes nothing; a restore onto the new GPUs that
fails puts the kernel back on its old ones.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..broker.models import Lease
from ..broker.store import AuditRecord
from .canary import MIG_TEXT, Verdict

if TYPE_CHECKING:
    from ..broker.core import Broker
    from .host import KernelSuspender


HEALTH = "health"
"""The actor of the moves a GPU's health check (or an alert) asks for."""
NO_ROOM = "no free GPU of its model has the room"


class KernelMover:
    """Moves the kernels of a drained GPU's leases (``move_off``), one lease at a time each."""

    def __init__(
        self,
        core: Broker,
        kernels: KernelSuspender,
        verdict: Callable[[str], Verdict],
        moved: Callable[[str], None],
        log: logging.Logger,
    ) -> None:
        """``verdict``: what idle reclaim does on a device (a move is a suspend: only where
        it holds ``suspend``); ``moved``: told each lease moved (its idle time starts anew,
        as after a resume)."""
        self.core, self.kernels, self.verdict, self.log = core, kernels, verdict, log
        self.after = moved
        self.moved: dict[str, dict[str, Any]] = {}
        """Lease id -> its last move (``from``, ``to``, ``text``, ``at``): the lease shows it."""
        self._moving: set[str] = set()
        self._tasks: set[asyncio.Task[str]] = set()

    # -- what moves where

    def leases_on(self, uuid: str) -> list[Lease]:
        """The active leases holding a device ``uuid`` covers (a GPU: every one on it)."""
        holders = self.core.holders()
        found = {
            holders[d.uuid].id: holders[d.uuid]
            for d in self.core.placer.under(uuid)
            if d.uuid in holders
        }
        return sorted(found.values(), key=lambda x: x.granted_at)

    def why_not(self, lease: Lease) -> str | None:
        """Why a lease's kernel cannot move (None: it may be tried)."""
        inventory = self.core.inventory
        for uuid in lease.devices:
            device = inventory.device(uuid)
            if device is None or device.kind == "mig":
                return MIG_TEXT
            said = self.verdict(uuid)
            if said.action == "pending":
                return "suspend is not proven on its GPU model yet"
            if said.action != "suspend":
                return said.reason
        return self.kernels.owner(lease)[1]

    def targets(self, lease: Lease) -> list[str] | None:
        """As many free GPUs of the lease's model, on its node, as it holds, each with the
        kernel's memory there free (None: not enough of them)."""
        inventory, placer = self.core.inventory, self.core.placer
        held = [inventory.device(u) for u in lease.devices]
        gpus = [inventory.gpu(d.gpu_uuid) for d in held if d is not None]
        models = {(g.model or g.name, g.node) for g in gpus if g is not None}
        most = max(self.kernels.on_devices(lease).values(), default=0.0)
        room = self.kernels.suspender.room

        def fits(uuid: str) -> bool:
            free = float("inf") if room is None else room(uuid)
            return free is not None and free >= most

        free = [
            g.uuid
            for g in inventory.gpus
            if (g.model or g.name, g.node) in models
            and g.uuid not in lease.devices
            and placer.is_free(g.uuid)
            and fits(g.uuid)
        ]
        return free[: len(held)] if len(free) >= len(held) else None

    # -- moving

    def move_off(self, uuid: str, why: str, actor: str) -> dict[str, str]:
        """Start moving every kernel on a drained GPU or device, for ``why`` ("GPU 3 is too
        hot"), audited as ``actor``'s (the admin who drained it, or ``health``); lease id ->
        what is done (``moving``, or why it stays)."""
        plan = {}
        for lease in self.leases_on(uuid):
            if lease.id in self._moving:
                plan[lease.id] = "moving already"
                continue
            stays = self.why_not(lease)
            if stays is None and self.targets(lease) is None:
                stays = NO_ROOM
            if stays is not None:
                plan[lease.id] = self._stays(lease, why, stays, actor, tried=False)
                continue
            plan[lease.id] = "moving"
            self._moving.add(lease.id)
            task = asyncio.ensure_future(self.move(lease.id, why, actor))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return plan

    async def move(self, lease_id: str, why: str, actor: str) -> str:
        """Move one lease's kernel to free GPUs of its model; what came of it."""
        try:
            return await self._move(self.core.lease(lease_id), why, actor)
        except Exception as e:  # a broken move must not break the sampling pass
            self.log.exception("GPU broker: moving lease %s failed", lease_id)
            return f"not moved: {e}"
        finally:
            self._moving.discard(lease_id)

    async def _move(self, lease: Lease, why: str, actor: str) -> str:
        targets = self.targets(lease)
        if targets is None:
            return self._stays(lease, why, NO_ROOM, actor)
        devices = self.core.devices
        devices.reserve(targets)
        try:
            return await self._copy(lease, why, targets, actor)
        finally:
            if self.core.lease(lease.id).devices != tuple(targets):
                devices.unreserve(targets)
                self.core.schedule()

    async def _copy(self, lease: Lease, why: str, targets: list[str], actor: str) -> str:
        kernels, old = self.kernels, lease.devices
        uid, not_owned = kernels.owner(lease)  # again: its process may have changed hands
        if not_owned is not None:
            return self._stays(lease, why, not_owned, actor)
        processes, on = kernels.processes(lease, uid), kernels.on_devices(lease, uid)
        suspender = kernels.suspender
        outcome, suspension = await asyncio.to_thread(suspender.suspend, old, processes, on)
        if suspension is None:
            return self._stays(lease, why, outcome.reason, actor)
        kernel_pid = kernels.holder_pid(lease.id)
        if kernel_pid is not None:  # both, until it is restored on one side or the other
            kernels.opens(lease.id, kernel_pid, [*old, *targets])
        resumed = await asyncio.to_thread(suspender.resume, suspension, targets)
        if not resumed.done:
            if kernel_pid is not None:
                kernels.opens(lease.id, kernel_pid, list(old))
            back = await asyncio.to_thread(suspender.resume, suspension, old)
            kept = "it runs on where it was" if back.done else f"and back: {back.reason}"
            return self._stays(lease, why, f"{resumed.reason}; {kept}", actor)
        labels = self._labels
        text = f"moved from {labels(old)} to {labels(targets)}: {why}"
        detail = {"user": lease.user, "from": list(old), "to": targets, "reason": why}
        with self.core.store.audited(self._record(actor, lease, detail)):
            self.core.move(lease.id, targets, text)
        if kernel_pid is not None:
            kernels.opens(lease.id, kernel_pid, targets)  # the old GPUs no more
        self.moved[lease.id] = {**detail, "text": text, "at": self.core.clock.now()}
        self.after(lease.id)
        self.log.warning("GPU broker: lease %s of %s %s", lease.id, lease.user, text)
        return text

    def _stays(self, lease: Lease, why: str, because: str, actor: str, tried: bool = True) -> str:
        """A kernel that does not move: its lease says why (so its notebook does, before its
        next cell); audited where a move was tried, or an admin asked for one (a health
        drain of a MIG GPU tries none)."""
        text = f"{why}; this kernel cannot move: {because}"
        detail = {"user": lease.user, "from": list(lease.devices), "to": [], "reason": why}
        if tried or actor != HEALTH:
            record = self._record(actor, lease, {**detail, "not_moved": because})
            with self.core.store.audited(record):
                pass
        self.log.warning("GPU broker: lease %s of %s stays: %s", lease.id, lease.user, because)
        self.moved[lease.id] = {**detail, "text": text, "at": self.core.clock.now()}
        return text

    def _record(self, actor: str, lease: Lease, detail: dict[str, Any]) -> AuditRecord:
        return AuditRecord(self.core.clock.now(), actor, "move", lease.id, detail)

    def _labels(self, uuids: Any) -> str:
        inventory = self.core.inventory
        return ", ".join(d.label if (d := inventory.device(u)) is not None else u for u in uuids)

    def moving(self, lease_id: str) -> bool:
        return lease_id in self._moving

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
