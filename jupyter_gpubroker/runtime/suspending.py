"""The broker's suspends, suspend canaries and moves, and what the API shows of them.

A mixin of :class:`~.gpubroker.GPUBroker`, which builds them at its start where NVML is read
on this machine (``_start_suspending``): the ``KernelSuspender`` (``suspend.host``) carries
out idle reclaim's suspends and resumes; under ``reclaim_action = "auto"`` the
``Canaries`` (``suspend.canary``) prove suspend per GPU model first; the ``KernelMover``
(``suspend.move``) moves kernels off drained GPUs. Idle reclaim per GPU is one answer,
``idle_reclaim_of``, that the reclaimer, ``GET devices``, ``status`` and the log share.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..broker.alerts import AlertChange
from ..broker.models import Inventory, Lease, LeaseState
from ..suspend.canary import MIG_TEXT, Canaries, Verdict, simulated_or_real
from ..suspend.host import KernelSuspender, carried_out, checkpoint_driver
from ..suspend.move import HEALTH, KernelMover
from ..suspend.suspender import SUSPENDED, Suspender
from ..wire.text import SHARE_NOT_SUSPENDED
from ..wire.times import iso

if TYPE_CHECKING:
    from ..broker.core import Broker
    from ..events import EventBus
    from ..monitor.sampler import Sampler
    from ..nvml import NvmlBackend
    from .pid_view import PidView


class SuspendHost:
    """Suspends, canaries and moves of a running broker (``GPUBroker``'s)."""

    if TYPE_CHECKING:  # the GPUBroker's, which this is a part of
        backend: NvmlBackend | None
        pids: PidView | None
        sampler: Sampler | None
        log: logging.Logger
        reclaim_action: str
        suspend_fallback: str
        suspend_lock_timeout: float
        move_on_drain: bool
        move_on_alerts: set[str]

        @property
        def core(self) -> Broker: ...
        @property
        def events(self) -> EventBus: ...
        def keep(self, lease_id: str) -> None: ...
        def holder_pid(self, lease_id: str) -> int | None: ...
        def pid_elsewhere(self, lease_id: str) -> bool: ...
        def holder_uid(self, lease: Lease) -> int | None: ...
        def open_devices(
            self, lease_id: str, pid: int, devices: list[str] | None = None
        ) -> None: ...

    suspender: KernelSuspender | None = None
    """Carries out the reclaim action ``suspend`` (where NVML is read here)."""
    canaries: Canaries | None = None
    """Proves suspend on each GPU model here, for ``auto`` (where NVML is read here)."""
    mover: KernelMover | None = None
    """Moves kernels off drained GPUs (where NVML is read here)."""

    def _start_suspending(self, core: Broker, sampler: Sampler) -> None:
        """Build the suspender, the canaries and the mover, and hook them to the sampler."""
        if self.backend is None:
            return
        suspender = Suspender(
            checkpoint_driver(self.backend.simulator),
            lock_timeout_s=self.suspend_lock_timeout,
            room=self.free_mib,
        )
        if self.reclaim_action == "auto":
            start = simulated_or_real(self.backend.simulator)
            self.canaries = Canaries(core, suspender, start, self.listed, self.log)
            if sampler.outside is not None:
                sampler.outside.own = self.canaries.own
        self.suspender = KernelSuspender(
            core,
            suspender,
            readings=lambda: sampler.latest,
            holder_pid=self.holder_pid,
            elsewhere=self.pid_elsewhere,
            owner_uid=self.holder_uid,
            opens=self.open_devices,
            keep=self.keep,
            publish=self.events.publish,
            fallback=self.suspend_fallback,
            log=self.log,
        )
        sampler.reclaimer.suspends = self._suspends
        sampler.reclaimer.not_suspended = self._not_suspended
        self.mover = KernelMover(core, self.suspender, self.idle_reclaim_of, self.keep, self.log)
        sampler.on_drain = self._health_drained
        slices = sum(d.kind == "mig" for d in core.inventory.devices)
        if slices and self.reclaim_action in ("suspend", "auto"):  # the canaries log the rest
            self.log.info(
                "GPU broker: idle reclaim shuts down the kernels of the %d MIG slices: %s",
                slices,
                MIG_TEXT,
            )

    def suspended(self, lease_id: str) -> dict[str, Any] | None:
        """A lease whose kernel was suspended, while it stays so (None: any other)."""
        return None if self.suspender is None else self.suspender.shown(lease_id)

    def suspended_leases(self) -> list[str]:
        """The ended leases of the kernels suspended now."""
        return [] if self.suspender is None else self.suspender.lease_ids()

    def on_reclaim(self, lease: Lease) -> str:
        """What the holder's server does to the lease's kernel once it is reclaimed (a
        server in remote mode carries it out): ``reclaim_action``; where that is
        ``suspend`` or ``auto``, a reclaimed lease says what was done: ``suspend`` where
        its kernel was suspended (it runs on), else the fallback carried out instead
        (under ``auto``, a shutdown on the GPUs the canary did not pass)."""
        action = self.reclaim_action
        if action not in ("suspend", "auto"):
            return action
        reclaimed = lease.state is LeaseState.RECLAIMED
        if reclaimed and self.core.store.reclaim_cause(lease.id) == SUSPENDED:
            return "suspend"
        if action == "auto" and not self._suspends(lease):
            return "shutdown"
        return carried_out(self.suspend_fallback) if reclaimed else "suspend"

    # ------------------------------------------------------ idle reclaim, per GPU

    def _suspends(self, lease: Lease) -> bool | None:
        """Whether idle reclaim suspends the lease's kernel (None: not known yet, and a
        canary may answer soon; where none can, no free GPU of its model, it is shut down).
        A share never is: the reclaimer shuts it down, saying why."""
        if lease.shared:
            return False
        actions = {d: self.idle_reclaim_of(d).action for d in lease.devices}
        pending = [d for d, a in actions.items() if a == "pending"]
        if pending:
            assert self.canaries is not None
            return None if all(map(self.canaries.may_prove, pending)) else False
        return set(actions.values()) == {"suspend"}

    def _not_suspended(self, lease: Lease) -> str | None:
        """Why the lease's kernel is shut down rather than suspended (None: it would be,
        or shutting down is the chosen action)."""
        if self.reclaim_action not in ("suspend", "auto"):
            return None
        if lease.shared:  # whatever its GPU's canary says
            return SHARE_NOT_SUSPENDED
        verdicts = map(self.idle_reclaim_of, lease.devices)
        return next((v.reason for v in verdicts if v.action != "suspend"), None)

    def idle_reclaim_of(self, device_uuid: str) -> Verdict:
        """What idle reclaim does to the kernel of a GPU or device, and why."""
        action = self.reclaim_action
        if action == "shutdown" or action == "revoke":
            return Verdict(action, f"c.GPUBroker.reclaim_action is {action!r}")  # type: ignore[arg-type]
        if self.suspender is None:
            why = "the GPUs are an engine's: the broker runs no kernel of theirs to suspend"
            return Verdict("shutdown", why)
        if self.pids is not None and self.pids.unseen is not None:
            return Verdict("shutdown", self.pids.unseen)
        if self.core.placer.shares.mode.get(device_uuid) == "shared":  # shares only, now
            return Verdict("shutdown", SHARE_NOT_SUSPENDED)
        if action == "suspend":
            device = self.core.inventory.device(device_uuid)
            if device is not None and device.kind == "mig":
                return Verdict("shutdown", MIG_TEXT)
            return Verdict("suspend", "c.GPUBroker.reclaim_action is 'suspend' (not proven)")
        assert self.canaries is not None
        return self.canaries.verdict(device_uuid)

    def idle_reclaim(self) -> dict[str, dict[str, str]]:
        """Device UUID -> what idle reclaim does to its kernel (``action``: ``suspend``,
        ``shutdown``, ``revoke`` or ``pending``) and why: ``GET devices`` shows it. A GPU
        lent whole or shared says its shares are not suspended."""
        shown, pool = {}, self.core.placer.shares
        for d in self.core.inventory.devices:
            v = self.idle_reclaim_of(d.uuid)
            reason = v.reason
            if v.action in ("suspend", "pending") and pool.mode.get(d.uuid) == "both":
                reason = f"{reason}; {SHARE_NOT_SUSPENDED}"  # its whole leases' kernels are
            shown[d.uuid] = {"action": v.action, "reason": reason}
        return shown

    def listed(self, pid: int) -> dict[str, float]:
        """Where NVML lists a process now: UUID -> MiB (what the canary checks)."""
        assert self.backend is not None
        return {
            uuid: float(p.used_memory_mib or 0)
            for uuid, reading in self.backend.read_all(self.core.inventory).items()
            for p in reading.processes
            if p.pid == pid
        }

    def suspension_ended(self, lease_id: str) -> str | None:
        """Why a suspended kernel's lease is suspended no more (None: it is, or never was);
        the state file keeps it."""
        return self.core.store.suspension_end(lease_id)

    def free_mib(self, uuid: str) -> float | None:
        """A device's free memory now, read from NVML (None: NVML cannot say): a restore
        starts only onto devices with the memory free (``Suspender.no_room``)."""
        if self.backend is None:
            return None
        reading = self.backend.read(uuid)
        total, used = reading.memory_total_mib, reading.memory_used_mib
        return None if total is None or used is None else float(total - used)

    def move_off(self, uuid: str, why: str, actor: str) -> dict[str, str]:
        """Move the kernels of a drained GPU or device elsewhere (``KernelMover``); lease
        id -> what is done. Nothing moves where the GPUs are an engine's."""
        if self.mover is None:
            return {}
        return self.mover.move_off(uuid, why, actor)

    def moved(self, lease_id: str) -> dict[str, Any] | None:
        """A lease's last move, or why its kernel did not move (None: none since the start)."""
        if self.mover is None:
            return None
        found = self.mover.moved.get(lease_id)
        return None if found is None else {**found, "at": iso(found["at"])}

    def _health_drained(self, gpu: str, kinds: tuple[str, ...], reason: str) -> None:
        """A GPU its health check drained: its kernels move where ``move_on_drain`` says."""
        if self.move_on_drain:
            self.move_off(gpu, drain_words(self.core.inventory, gpu, kinds, reason), HEALTH)

    def _alert_changed(self, change: AlertChange) -> None:
        """An alert of a kind ``move_on_alerts`` names drains its GPU and moves its kernels
        when it starts (cause ``alert``), and lifts that drain when it ends."""
        alert = change.alert
        if alert.kind not in self.move_on_alerts or self.mover is None:
            return
        core = self.core
        device = core.inventory.device(alert.uuid)
        gpu = device.gpu_uuid if device is not None else alert.uuid
        if change.state == "started":
            core.drain(gpu, alert.message, cause="alert")
            label = alert.label.split(" / ")[0]
            words = ALERT_WORDS.get(alert.kind)
            why = f"{label}: {alert.message}" if words is None else words.format(label=label)
            self.move_off(gpu, why, HEALTH)
        elif change.state == "ended" and core.drain_cause(gpu) == "alert":
            core.undrain(gpu, f"alert ended: {alert.message}")


ALERT_WORDS = {"temperature": "{label} is too hot", "power_cap": "{label} is held at its power cap"}
"""Why a kernel moves off a GPU an alert of this kind drained, in the words it shows."""


def drain_words(inventory: Inventory, gpu: str, kinds: tuple[str, ...], reason: str) -> str:
    """Why a kernel moves off a GPU its health check drained: "GPU 3 is too hot", else
    "GPU 3 is unhealthy: <its faults>"."""
    found = next((d for d in inventory.devices if d.gpu_uuid == gpu), None)
    label = found.label.split(" / ")[0] if found is not None else gpu
    if "temperature" in kinds:
        return f"{label} is too hot"
    return f"{label} is unhealthy: {reason}"
