"""The reclaim action ``suspend``, made by the broker on the kernels of its own host.

Beside its kernels (the server extension's embedded broker) the server process, another
process of the kernel's user, makes the checkpoint calls on the kernel's processes. A
central broker (the hub service) suspends the kernel of a server that uses it from
elsewhere only where that kernel runs on the broker's host as its lease's user: the user
names the holder process in their own renewals, so the holder and every process suspended
must be owned by the account that runs that user's kernels (``GPUBroker.holder_uid``: the
lease user's local account there), or the kernel is not suspended (the fallback, with
why). Its server leaves a suspended kernel running (the lease's
``on_reclaim`` says ``suspend``) and carries out a fallback (``on_reclaim``: the action).

At the deadline of an idle (or stalled, or preempted) lease the reclaimer hands the lease
here (``Decision.action == "suspend"``). The processes on the lease's devices that descend
from the kernel (its renewals name its pid) are suspended; the lease ends with cause
``suspended``; its devices go to the next holder once NVML lists nothing on them, as for
any lease. When the kernel's own request (its user's) for as many GPUs of that model is
granted later (its next cell asks, ``kernel/resume.py``), its processes are restored onto
the granted GPUs; a grant to another user's request naming the same kernel id is theirs
alone (suspensions are keyed by user and kernel id, ``KernelKey``);
where the kernel's own process ended (a restart that ``gpubroker-provisioner`` did not
report), the kernel asking is a new one: its suspension ends as a restart's does and it
keeps the grant.
Where suspending cannot work, the configured fallback is carried out instead, and the lease's
end (or the log, where the kernel keeps its GPU) says why, once.

A suspension is kept in the state file with its lease's end (the reclaim's evidence names
the kernel and its processes, with their start times), and so is its end: a broker that
starts again takes up the suspensions whose processes still run, checkpointed, and ends the
others with why.
"""

from __future__ import annotations

import asyncio
import logging
import pwd
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from ..broker.models import DeviceReading, Event, Lease, LeaseState
from ..monitor.outside import ProcessTable
from ..nvml.simulated import SimulatedNvml
from ..wire.text import (
    ENDED_AWAY,
    ENDED_EXITED,
    ENDED_RESTARTED,
    ENDED_SHUT_DOWN,
    KERNEL_PID_NAMESPACE,
    SHARE_NOT_SUSPENDED,
    suspended_text,
)
from .cuda import CudaCheckpointDriver
from .driver import CheckpointDriver, CheckpointError, ProcessState
from .simulated import SimulatedCheckpointDriver
from .suspender import SUSPENDED, Outcome, Suspender, Suspension

if TYPE_CHECKING:
    from ..broker.core import Broker
    from ..broker.reclaim import Decision

FALLBACKS = ("shutdown", "revoke", "keep")
ENDED = "suspension_ended"
"""The event of a suspended kernel's lease once the kernel is suspended no more (resumed,
its memory lost, or the kernel shut down or restarted), with the reason."""


class KernelKey(NamedTuple):
    """A suspended kernel as the suspender keys it: its lease's user and its id. A kernel
    id is no secret (URLs, logs and the kernel's environment show it) and any user may
    name it as a request's holder, so no path resumes, ends or shows a suspension on the
    id alone: another user's request naming it is another kernel."""

    user: str
    kernel_id: str


@dataclass(frozen=True)
class Suspended:
    """A kernel suspended by this broker, waiting for its next grant."""

    suspension: Suspension
    lease: Lease
    """The lease it had (its size and chip)."""
    started: Mapping[int, int | None]
    """The kernel's process and those suspended -> their start times (clock ticks since
    boot; None: not known): what tells them from later processes with their pids."""
    kernel_pid: int | None = None
    """The kernel's own process (None: not stored, a suspension from before it was):
    a resume asked for by another one is a restarted kernel's."""

    def kernel(self) -> Mapping[int, int | None]:
        """The kernel's own process -> its start time (all of ``started`` when not known)."""
        pid = self.kernel_pid
        return self.started if pid is None else {pid: self.started.get(pid)}

    def evidence(self, kernel_id: str) -> dict[str, Any]:
        """What is stored with the lease's end (its reclaim's evidence), to take the
        suspension up again after a restart."""
        return {
            "kernel_id": kernel_id,
            "pids": list(self.suspension.pids),
            "processes": [[p, t] for p, t in self.started.items()],
            "kernel_pid": self.kernel_pid,
            "device_mib": list(self.suspension.device_mib),
        }

    @classmethod
    def stored(cls, lease: Lease, evidence: Mapping[str, Any]) -> tuple[KernelKey, Suspended]:
        """A stored suspension: (its kernel, it); ``evidence`` is its reclaim's."""
        kept = evidence["suspension"]
        pids = tuple(int(p) for p in kept["pids"])
        per_device = tuple(float(m) for m in kept.get("device_mib", ()))
        suspension = Suspension(pids, lease.devices, float(evidence["host_mib"]), per_device)
        started = {int(p): t for p, t in kept["processes"]}
        kernel_pid = kept.get("kernel_pid")
        key = KernelKey(lease.user, str(kept["kernel_id"]))
        return key, cls(suspension, lease, started, kernel_pid)


class KernelSuspender:
    """Suspends the kernels of leases the reclaimer hands over, and resumes them on their
    next grant."""

    def __init__(
        self,
        core: Broker,
        suspender: Suspender,
        *,
        readings: Callable[[], Mapping[str, DeviceReading]],
        holder_pid: Callable[[str], int | None],
        elsewhere: Callable[[str], bool],
        owner_uid: Callable[[Lease], int | None],
        opens: Callable[[str, int, list[str] | None], None],
        keep: Callable[[str], None],
        publish: Callable[[Event], None],
        fallback: str,
        log: logging.Logger,
    ) -> None:
        """Keyword-only past ``suspender``: several of these are callables of a lease id,
        which a positional call could swap unnoticed."""
        if fallback not in FALLBACKS:
            raise ValueError(f"suspend_fallback must be one of {', '.join(FALLBACKS)}")
        self.core, self.suspender, self.log = core, suspender, log
        self.readings, self.keep = readings, keep
        self.holder_pid = holder_pid
        """The holder process a lease's last renewal named (None: none)."""
        self.elsewhere = elsewhere
        """Whether a lease's renewals name its process in another pid namespace (a pid
        that names nothing here, or another process: never read)."""
        self.owner_uid = owner_uid
        """The uid whose processes may be a lease's kernel's (None: its user has no
        account here): only those are suspended (``owner``)."""
        self.opens = opens
        """Lets a kernel process open a lease's devices, or the ones given (where kernels
        are confined to theirs): a restore runs in the kernel's process, which must open
        its new GPU, and so must every process of the kernel that was suspended with it."""
        self.publish, self.fallback = publish, fallback
        self.suspended: dict[KernelKey, Suspended] = {}
        """(Lease user, kernel id) -> its suspension."""
        self._procs = ProcessTable()
        self._told: set[str] = set()
        self._resumes: dict[asyncio.Task[None], KernelKey] = {}
        """The resumes under way -> the kernel each resumes."""
        self.waiting: dict[KernelKey, tuple[str, str]] = {}
        """Kernels granted GPUs without the memory free for their restore -> (the grant's
        lease id, why): tried again at each sampling pass while the grant stands."""
        self._take_up()
        self.unsubscribe = core.subscribe(self._on_event)

    def _take_up(self) -> None:
        """The suspensions the state file holds (a broker that ran before): each goes on
        while its processes run, checkpointed; the others end, with why. A kernel whose
        grant came before the broker stopped, its restore not done (it waited for memory,
        or the broker stopped first), is restored onto that grant at the next pass: no
        event grants it again."""
        for row in self.core.store.suspensions():
            lease = self.core.lease(row["lease_id"])
            key, suspended = Suspended.stored(lease, row["evidence"])
            self.suspended[key] = suspended
        self.check(gone=ENDED_AWAY)
        for grant in self.core.holders().values():
            key = KernelKey(grant.user, self.core.request(grant.request_id).holder)
            if key in self.suspended:
                self.waiting[key] = (grant.id, "its restore waits for the broker")

    def check(
        self, handled: Callable[[KernelKey], bool] = lambda _: False, gone: str = ENDED_EXITED
    ) -> None:
        """End the suspensions that are over (``_over``), each with why (``gone`` where a
        process of it ended). Run on every sampling pass: a kernel whose process ended
        while suspended (killed, say, by the out-of-memory killer) with nobody restarting
        it would otherwise be shown suspended, its memory on the host, until the broker
        restarted. Left alone: a kernel being resumed (its resume ends it), and one the
        host's kernel manager is starting, restarting or shutting down, or runs in a new
        process (``handled``: its provisioner, or the new process's first cell, ends it
        saying so)."""
        resuming = set(self._resumes.values())
        self._retry_waiting(resuming)
        for key, suspended in list(self.suspended.items()):
            if key in resuming or handled(key):
                continue
            why = self._over(suspended, gone)
            if why is not None:
                self.log.info("GPU broker: kernel %s is suspended no more: %s", key.kernel_id, why)
                self._end(key, why)

    def _retry_waiting(self, resuming: set[KernelKey]) -> None:
        """Try again each restore that waited for memory, while its grant stands (given
        back, expired or withdrawn: the kernel's next cell asks again)."""
        for key, (lease_id, _) in list(self.waiting.items()):
            suspended = self.suspended.get(key)
            if suspended is None or self.core.lease(lease_id).state is not LeaseState.ACTIVE:
                del self.waiting[key]
            elif key not in resuming:
                self._start_resume(key, suspended, lease_id)

    def _over(self, suspended: Suspended, gone: str) -> str | None:
        """Why a suspension is over (None: it is not): a process of it gone (``gone``), or
        one the driver does not hold checkpointed."""
        if _ended(suspended.started):
            return gone
        for pid in suspended.suspension.pids:
            try:
                state = self.suspender.driver.state(pid)
            except CheckpointError as e:
                return f"the driver no longer holds its GPU memory: {e.reason}"
            if state is not ProcessState.CHECKPOINTED:
                return (
                    f"the driver no longer holds its GPU memory: the kernel's process {pid} "
                    f"is {state.name.lower()}"
                )
        return None

    def processes(self, lease: Lease, uid: int | None = None) -> dict[int, float]:
        """The kernel's processes on the lease's devices (pid -> MiB over them all): the
        holder the renewals named and what it started (only those owned by ``uid``, when
        given)."""
        return {p: sum(on.values()) for p, on in self._kernel_use(lease, uid).items()}

    def on_devices(self, lease: Lease, uid: int | None = None) -> dict[str, float]:
        """The kernel's MiB on each of the lease's devices (``processes``' per device)."""
        found = dict.fromkeys(lease.devices, 0.0)
        for on in self._kernel_use(lease, uid).values():
            for uuid, mib in on.items():
                found[uuid] += mib
        return found

    def _kernel_use(self, lease: Lease, uid: int | None) -> dict[int, dict[str, float]]:
        """pid -> device -> MiB of the kernel's processes on the lease's devices."""
        holder = self.holder_pid(lease.id)
        readings = self.readings()
        listed: dict[int, dict[str, float]] = {}
        for uuid in lease.devices:
            reading = readings.get(uuid)
            for p in reading.processes if reading is not None else ():
                listed.setdefault(p.pid, {})[uuid] = float(p.used_memory_mib or 0)
        if holder is None:
            return {}
        procs = self._procs.read(listed)
        return {
            p: on
            for p, on in listed.items()
            if p in procs and holder in procs[p].chain and uid in (None, procs[p].uid)
        }

    def owner(self, lease: Lease) -> tuple[int | None, str | None]:
        """(The uid the kernel's processes must be owned by; why it is not suspended, None
        where it may be.) The holder process is named by the lease's user: it must run
        here, owned by the account that runs that user's kernels (``owner_uid``), or a user
        could have another's process (or init) suspended. The renewal that named it was
        checked so already (``api.rules``); the process may have changed hands since."""
        if lease.shared:
            return None, SHARE_NOT_SUSPENDED
        uid = self.owner_uid(lease)
        if uid is None:
            return None, f"{lease.user} has no account on the GPU broker's machine"
        holder = self.holder_pid(lease.id)
        if holder is None:
            named = KERNEL_PID_NAMESPACE if self.elsewhere(lease.id) else None
            return uid, named or "the kernel never named its process"
        proc = self._procs.read([holder]).get(holder)
        if proc is None:
            return uid, f"its process {holder} does not run on the GPU broker's machine"
        if proc.uid != uid:
            return uid, f"its process {holder} is not {lease.user}'s"
        return uid, None

    def shown(self, lease_id: str) -> dict[str, Any] | None:
        """A suspended kernel's ended lease, as the API shows it (None: any other lease)."""
        for key, s in self.suspended.items():
            if s.lease.id == lease_id:
                mib = s.suspension.host_mib
                waiting = self.waiting.get(key)
                return {
                    "host_mib": round(mib, 1),
                    "text": suspended_text(mib),
                    "kernel_id": key.kernel_id,
                    "model": self.model(s.lease),
                    "waiting": None if waiting is None else waiting[1],
                }
        return None

    def model(self, lease: Lease) -> str | None:
        """The model of a lease's GPUs (None: not one the catalog knows, or several)."""
        inventory = self.core.inventory
        gpus = {inventory.gpu(d.gpu_uuid) for d in map(inventory.device, lease.devices) if d}
        models = {g.model if g else None for g in gpus}
        return models.pop() if len(models) == 1 else None

    def lease_ids(self) -> list[str]:
        """The ended leases of the kernels suspended now, oldest first."""
        return [s.lease.id for s in self.suspended.values()]

    def forget(self, key: KernelKey, reason: str = ENDED_SHUT_DOWN) -> None:
        """A kernel whose process ended: shut down (its token revoked), or restarted (a new
        process); its memory on the host went with the old one, so its suspension is
        over, for ``reason``. Only its own user's word ends it (``key``)."""
        if key in self.suspended:
            self._end(key, reason)

    def _end(self, key: KernelKey, reason: str) -> None:
        """A kernel suspended no more: the state file, then its lease, says why, and its
        fronts are told."""
        lease = self.suspended[key].lease
        now = self.core.clock.now()
        with self.core.store.transaction():
            self.core.store.end_suspension(lease.id, now, reason)
        del self.suspended[key]
        self.publish(Event.of_lease(ENDED, now, lease, {"reason": reason}))

    async def suspend(self, decision: Decision) -> str | None:
        """Suspend the kernel of ``decision``'s lease; returns the action the host still
        carries out on the kernel (the fallback), None when there is none."""
        lease = self.core.lease(decision.lease_id)
        key = KernelKey(lease.user, decision.holder)
        uid, why_not = self.owner(lease)
        if why_not is not None:
            outcome, suspension = Outcome(False, why_not), None
        else:
            outcome, suspension = await asyncio.to_thread(
                self.suspender.suspend,
                lease.devices,
                self.processes(lease, uid),
                self.on_devices(lease, uid),
            )
        evidence: dict[str, Any] = {**decision.evidence, "verdict": decision.cause}
        if outcome.done and suspension is not None:
            suspended = self._suspended(suspension, lease)
            evidence["host_mib"] = round(suspension.host_mib, 1)
            evidence["suspension"] = suspended.evidence(decision.holder)
            reason = f"{decision.reason}; {outcome.reason}"
            self.suspended[key] = suspended  # the lease's end shows it
            try:
                self.core.reclaim(lease.id, reason, cause=SUSPENDED, evidence=evidence)
            except BaseException:
                del self.suspended[key]
                raise
            self.log.info("GPU broker: kernel %s %s", decision.holder, outcome.reason)
            return None
        if self.fallback == "keep" and not outcome.lost:
            self.keep(lease.id)  # warned again after the next idle timeout
            if lease.id not in self._told:
                self._told.add(lease.id)
                self.log.warning(
                    "GPU broker: kernel %s keeps its GPU: not suspended: %s",
                    decision.holder,
                    outcome.reason,
                )
            return None
        reason = f"{decision.reason}; not suspended: {outcome.reason}"
        self.core.reclaim(lease.id, reason, cause=decision.cause, evidence=evidence)
        return carried_out(self.fallback)

    def _suspended(self, suspension: Suspension, lease: Lease) -> Suspended:
        """A suspension with the start times of the kernel's process and those suspended."""
        kernel_pid = self.holder_pid(lease.id)
        pids = {*suspension.pids, kernel_pid or 0} - {0}
        running = ProcessTable().read(pids)
        started = {p: running[p].started if p in running else None for p in sorted(pids)}
        return Suspended(suspension, lease, started, kernel_pid)

    def _on_event(self, event: Event) -> None:
        """A grant to a suspended kernel's request, its own user's, restores it there; a
        grant to another user's request naming the same holder is that user's alone."""
        if event.kind != "granted" or event.request_id is None or event.lease_id is None:
            return
        request = self.core.request(event.request_id)
        key = KernelKey(request.user, request.holder)
        suspended = self.suspended.get(key)
        if suspended is None:
            return
        self._start_resume(key, suspended, event.lease_id)

    def _start_resume(self, key: KernelKey, suspended: Suspended, lease_id: str) -> None:
        task = asyncio.ensure_future(self._resume(key, suspended, lease_id))
        self._resumes[task] = key
        task.add_done_callback(self._resumes.pop)

    async def _resume(self, key: KernelKey, suspended: Suspended, lease_id: str) -> None:
        """Restore the suspended processes onto the grant ``lease_id``; where the kernel's
        own process ended, the kernel asking is a new process (restarted without
        ``gpubroker-provisioner`` telling the broker): its suspension ends as a restart's
        does, nothing is restored, and the grant stays the new process's, as a new
        kernel's would."""
        holder = key.kernel_id
        if _ended(suspended.kernel()):
            self.log.info("GPU broker: kernel %s asks to resume from a new process", holder)
            self.forget(key, reason=ENDED_RESTARTED)
            return
        lease = self.core.lease(lease_id)
        if len(lease.devices) != len(suspended.suspension.devices):
            outcome_reason = "the grant has a different number of GPUs than the kernel had"
            lost = False
        else:
            if suspended.kernel_pid is not None:
                self.opens(lease_id, suspended.kernel_pid, None)
            outcome = await asyncio.to_thread(
                self.suspender.resume, suspended.suspension, lease.devices
            )
            if outcome.done:
                self.waiting.pop(key, None)
                self._end(key, f"{outcome.reason} ({', '.join(lease.devices)})")
                self.log.info("GPU broker: kernel %s %s", holder, outcome.reason)
                return
            if outcome.waiting:  # nothing tried: the grant stands, tried again next pass
                if self.waiting.get(key) != (lease_id, outcome.reason):
                    self.log.info("GPU broker: kernel %s: %s", holder, outcome.reason)
                self.waiting[key] = (lease_id, outcome.reason)
                return
            self.waiting.pop(key, None)
            outcome_reason, lost = outcome.reason, outcome.lost
        self.log.warning("GPU broker: kernel %s: %s", holder, outcome_reason)
        # the new lease ends first: the kernel, which reads it before the old one, must
        # never see the old one no longer suspended while the new one still stands
        self.core.release(lease_id, reason=outcome_reason)
        if lost:
            self._end(key, outcome_reason)

    def close(self) -> None:
        self.unsubscribe()
        for task in self._resumes:
            task.cancel()


def carried_out(fallback: str) -> str:
    """What a kernel whose lease was reclaimed without suspending it gets: the fallback,
    or ``revoke`` for ``keep`` (which keeps the lease only where the kernel is left as it
    was)."""
    return "revoke" if fallback == "keep" else fallback


def local_uid(user: str) -> int | None:
    """The uid of ``user``'s account on this machine (None: it has none)."""
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


def _ended(processes: Mapping[int, int | None]) -> bool:
    """Whether one of ``processes`` (pid -> start time) ended, or its pid now names a later
    process, started at another time: its memory on the host went with it."""
    running = ProcessTable().read(processes)
    for pid, started in processes.items():
        proc = running.get(pid)
        if proc is None or started not in (None, proc.started):
            return True
    return False


def checkpoint_driver(simulator: SimulatedNvml | None) -> CheckpointDriver:
    """The simulated NVML's checkpoint driver where the GPUs are simulated, else the
    machine's CUDA driver (which says itself when it cannot checkpoint)."""
    if simulator is not None:
        return SimulatedCheckpointDriver(simulator)
    return CudaCheckpointDriver()


def simulate_kernel_use(
    simulator: SimulatedNvml, lease: Lease, pid: int, mib: int, *, mps: bool = False
) -> None:
    """List a kernel on its lease's simulated devices with ``mib`` each, as NVML lists a
    kernel that used CUDA (for the demo), as an MPS client where ``mps``; a kernel listed
    anywhere already (a restored one) is left as it is."""
    if lease.state is not LeaseState.ACTIVE or simulator.process_memory(pid):
        return
    for uuid in lease.devices:
        simulator.add_process(uuid, pid, mib, follow=True, mps=mps)
