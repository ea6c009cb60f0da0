"""Outside use: compute processes on a local GPU that no lease accounts for.

On one machine a grant names its devices to the kernel only through
``CUDA_VISIBLE_DEVICES``, which anyone can unset, so each sampling pass checks what
NVML lists against the leases. A process on a device belongs to the lease holding
that device when it descends from the lease's holder process (the kernel or the
single-user server, whose pid the holder reports with its renewals) or, failing that,
when its owner (uid -> user name) is the lease's user. Anything else on a grantable
device is *outside use* by the process's owner: the engines' "work outside the broker"
(:mod:`jupyter_gpubroker.engines`), seen per process.

:class:`OutsideWatch` keeps each sighting from pass to pass and acts on it: it drains
the device (cause ``outside``, so nothing is granted onto it; lifted once the process
is gone), records the start in the audit log, charges the owner the device's time as
unbrokered use, hands the alert judge a finding, and, as the admin's policy says,
notifies the owner's fronts and at last signals the process (SIGTERM, then SIGKILL)
when the broker runs as root. A lease holder's own processes on its own devices are
never outside use, so never touched. The processes of a lease that just ended are the
core's to handle (``vacating``), not this watch's; those found running when the broker
started are outside use.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import signal
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ..broker.core import Broker, Event
from ..broker.models import Device, DeviceReading, Lease
from ..broker.store import AuditRecord
from ..procstat import proc_stat, read_small
from ..wire.text import clock, duration

OUTSIDE = "outside"
"""The drain cause and alert kind of outside use."""
POLICIES = ("report", "warn", "stop")
KILL_AFTER_S = 10.0
"""Seconds a process gets to exit after SIGTERM before SIGKILL."""


@dataclass(frozen=True)
class Proc:
    """What the OS says of one process NVML listed."""

    pid: int
    user: str
    """Its real uid's user name (``uid 1234`` when the uid has no name)."""
    chain: frozenset[int]
    """Itself and its ancestors."""
    started: int
    """Its start time (clock ticks since boot): tells it from a later one with its pid."""
    uid: int
    """Its owner, as ``user`` names it: what a suspend checks (``suspend.host``)."""


@lru_cache(maxsize=4096)
def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks since boot); None when the process is gone,
    a zombie included: it has ended and holds no memory."""
    stat = proc_stat(pid)
    return None if stat is None or stat.ended else (stat.ppid, stat.start_ticks)


def _real_uid(pid: int) -> int | None:
    """The real uid ``/proc/<pid>/status`` names (None once gone)."""
    status = read_small(f"/proc/{pid}/status") or b""
    line = next((x for x in status.splitlines() if x.startswith(b"Uid:")), None)
    return None if line is None else int(line.split()[1])


class ProcessTable:
    """The processes NVML lists, as ``/proc`` describes them: owner, start, ancestry.

    A process's facts are kept from pass to pass while ``/proc/<pid>`` stays the same
    inode with the same owner (a new process under a reused pid gets a new inode), so a
    steady pass costs one ``stat`` call a process; its ancestry is as first seen (a
    process whose parent exits stays its former holder's, which is still its lease's)."""

    def __init__(self) -> None:
        self._known: dict[int, tuple[int, int, Proc]] = {}
        """pid -> (inode of /proc/<pid>, its owner's uid, the process)."""

    def read(self, pids: Iterable[int]) -> dict[int, Proc]:
        """The processes behind ``pids``; a pid that is gone or not in this broker's pid
        namespace is left out: nothing can be said of it."""
        parent: dict[int, int] = {}
        known: dict[int, tuple[int, int, Proc]] = {}
        for pid in set(pids):
            try:
                st = os.stat(f"/proc/{pid}")
            except OSError:
                continue
            seen = self._known.get(pid)
            if seen is None or seen[:2] != (st.st_ino, st.st_uid):
                proc = self._describe(pid, st.st_uid, parent)
                if proc is None:
                    continue
                seen = (st.st_ino, st.st_uid, proc)
            known[pid] = seen
        self._known = known
        return {pid: seen[2] for pid, seen in known.items()}

    @staticmethod
    def _describe(pid: int, owner: int, parent: dict[int, int]) -> Proc | None:
        """Read one process: its owner is that of ``/proc/<pid>`` (its effective uid),
        or, where that is root (root's processes, and setuid programs, which the kernel
        hands to root there), the real uid its ``status`` names."""
        stat = _stat(pid)
        uid = owner if owner != 0 else _real_uid(pid)
        if stat is None or uid is None:
            return None
        chain, at = {pid}, stat[0]
        while at > 1 and at not in chain:
            chain.add(at)
            if at not in parent:
                found = _stat(at)
                parent[at] = 0 if found is None else found[0]
            at = parent[at]
        return Proc(pid, user_name(uid), frozenset(chain), stat[1], uid)


@dataclass(frozen=True)
class Sighting:
    """A process on a device that no lease of its owner holds."""

    uuid: str
    label: str
    pid: int
    user: str
    started: int


def find_outside(
    devices: Iterable[Device],
    readings: Mapping[str, DeviceReading],
    holders: Mapping[str, Lease],
    holder_pids: Mapping[str, int],
    procs: Mapping[int, Proc],
    lingering: Mapping[str, Iterable[int]] = {},
    shared: Mapping[str, Iterable[Lease]] = {},
) -> list[Sighting]:
    """Every process on ``devices`` that is no lease's: not of the lease holding its
    device (``holders``: device UUID -> lease) or of a share of it (``shared``: GPU UUID
    -> its shares) by ancestry (``holder_pids``: lease id -> its holder process) or by
    owner. ``lingering``: device UUID -> pids of an ended lease still vacating it (the
    core's)."""
    found = []
    for d in devices:
        reading = readings.get(d.uuid)
        if reading is None or not reading.processes:
            continue
        lease, left = holders.get(d.uuid), set(lingering.get(d.uuid, ()))
        leases = [lease, *shared.get(d.uuid, ())] if lease else list(shared.get(d.uuid, ()))
        for listed in reading.processes:
            p = procs.get(listed.pid)
            if p is None or p.pid in left:
                continue
            if any(p.user == x.user or holder_pids.get(x.id) in p.chain for x in leases):
                continue
            found.append(Sighting(d.uuid, d.label, p.pid, p.user, p.started))
    return found


def outside_text(s: Sighting, for_s: float | None = None) -> str:
    """ "GPU 3: in use outside the broker by bob, pid 4242, for 12 min" (without the time
    when ``for_s`` is None)."""
    text = f"{s.label}: in use outside the broker by {s.user}, pid {s.pid}"
    return text if for_s is None else f"{text}, for {duration(for_s)}"


@dataclass
class _Seen:
    sighting: Sighting
    since: float
    """Since when its user has used the device outside the broker (kept over a restart)."""
    noticed: float
    """When this process was first seen there: its grace counts from then."""
    termed_at: float | None = None


@dataclass
class OutsideWatch:
    """Outside use from pass to pass, and what the policy does about it.

    ``policy``: ``report`` (drain, alert, audit, charge), ``warn`` (also a notice to the
    owner's fronts), ``stop`` (warn with a deadline, then after ``grace_s`` SIGTERM and
    ``KILL_AFTER_S`` later SIGKILL; only a broker running as root signals)."""

    broker: Broker
    publish: Callable[[Event], None]
    policy: str = "report"
    grace_s: float = 300.0
    log: logging.Logger = field(default_factory=lambda: logging.getLogger(__name__))
    may_signal: bool = field(default_factory=lambda: os.geteuid() == 0)
    holder_pids: dict[str, int] = field(default_factory=dict)
    """Lease id -> the pid of its holder process, as its last renewal reported it."""
    processes: ProcessTable = field(default_factory=ProcessTable)
    """The processes NVML lists, read on the sampler's worker thread (``Sampler.read``)."""
    own: set[int] = field(default_factory=set)
    """Pids the broker runs on free GPUs itself (the suspend canary): never outside use."""
    _seen: dict[tuple[str, int], _Seen] = field(default_factory=dict)
    _usage: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)
    """(device UUID, user) -> the open unbrokered-use record charging it: (id, start)."""

    _charged: dict[tuple[str, str], float] = field(default_factory=dict)
    """(device UUID, user) -> until when its open use is charged in the fair-share ledger."""
    _audited: set[tuple[str, int]] = field(default_factory=set)
    """(device UUID, pid) of outside use an earlier run of the broker audited and that
    was still going on when it stopped: seen again, it is not audited twice."""

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"outside use policy is one of {', '.join(POLICIES)}")
        now, ledger = self.broker.clock.now(), self.broker.ledger
        horizon = now - 10 * ledger.half_life_s  # as far back as the core restores its own
        for row in self.broker.store.unbrokered():
            if row["end"] is None:  # a restart: the use goes on
                self._usage[row["uuid"], row["user"]] = (row["id"], row["start"])
                self._audited |= {(row["uuid"], pid) for pid in self._pids_audited(row)}
                self._charged[row["uuid"], row["user"]] = now
            if (row["end"] or now) > horizon:
                end = min(row["end"] or now, now)
                ledger.charge_past(row["user"], "", row["gpu_equivalents"], row["start"], end, now)

    def _pids_audited(self, row: dict[str, Any]) -> set[int]:
        """The pids whose outside use of ``row``'s device the audit log records since
        ``row`` (an open unbrokered-use record) started."""
        store, pids, after = self.broker.store, set(), 0
        while True:
            page = store.audit(since=row["start"], actor=row["user"], after=after, limit=500)
            pids |= {
                int(r["detail"]["pid"])
                for r in page
                if r["action"] == "outside_use" and r["target"] == row["uuid"]
            }
            if len(page) < 500:
                return pids
            after = page[-1]["id"]

    def now_seen(self) -> dict[str, list[tuple[Sighting, float]]]:
        """Device UUID -> its outside use now: (sighting, since), oldest first."""
        out: dict[str, list[tuple[Sighting, float]]] = {}
        for seen in sorted(self._seen.values(), key=lambda s: s.since):
            out.setdefault(seen.sighting.uuid, []).append((seen.sighting, seen.since))
        return out

    def step(
        self, readings: Mapping[str, DeviceReading], procs: Mapping[int, Proc]
    ) -> dict[str, str]:
        """One pass: match, record what started and ended, drain or undrain, notify and
        signal as the policy says. Device UUID -> the alert message of its outside use."""
        broker, now = self.broker, self.broker.clock.now()
        for ended in self.holder_pids.keys() - {x.id for x in broker.leases()}:
            del self.holder_pids[ended]
        # an ended lease's processes, on their way out, are the core's to wait for; what
        # ran on a device when the broker started is no lease's
        lingering = {uuid: v.pids for uuid, v in broker.vacating().items() if v.lease_id}
        procs = {pid: p for pid, p in procs.items() if pid not in self.own}
        found = find_outside(
            broker.inventory.devices,
            readings,
            broker.holders(),
            self.holder_pids,
            procs,
            lingering,
            broker.sharers(),
        )
        current = {(s.uuid, s.pid): s for s in found}
        for key in list(self._seen):
            old = self._seen[key].sighting
            if key not in current or current[key].started != old.started:
                del self._seen[key]
                self.log.info("GPU broker: %s: pid %d of %s left it", old.label, old.pid, old.user)
        for key, s in current.items():
            if key not in self._seen:
                known = self._usage.get((s.uuid, s.user))
                self._seen[key] = _Seen(s, now if known is None else known[1], now)
                self._started(s, now)
        self._drains()
        self._charge(now)
        if self.policy == "stop":
            self._signal(now)
        return {
            uuid: f"{outside_text(seen[0][0])}."
            + (
                f" {len(seen) - 1} more processes use it outside the broker too."
                if len(seen) > 1
                else ""
            )
            for uuid, seen in self.now_seen().items()
        }

    def _started(self, s: Sighting, now: float) -> None:
        self.log.warning(
            "GPU broker: %s is in use outside the broker by %s, pid %d", s.label, s.user, s.pid
        )
        store = self.broker.store
        key = s.uuid, s.user
        device = self.broker.placer.devices[s.uuid]
        audit = None
        if (s.uuid, s.pid) not in self._audited:
            audit = AuditRecord(
                now, s.user, "outside_use", s.uuid, {"pid": s.pid, "device": s.label}
            )
        self._audited.discard((s.uuid, s.pid))  # a later process with its pid is new use
        with store.audited(audit) if audit else contextlib.nullcontext():
            if key not in self._usage:
                with store.transaction():
                    record = store.open_unbrokered(
                        s.uuid, s.user, device.profile or "gpu", device.gpu_equivalents, now
                    )
                self._usage[key] = (record, now)
        if self.policy == "report":
            return
        detail: dict[str, object] = {"device": s.uuid, "label": s.label, "pid": s.pid}
        message = (
            f"{s.label} is not granted to you, yet your process {s.pid} uses it. Ask the "
            "broker for a GPU (a GPU kernel or %gpu request) so others are not slowed down"
        )
        if self.policy == "stop":
            deadline = now + self.grace_s
            detail["deadline"] = deadline
            message += f"; the process will be stopped at {clock(deadline)} unless it ends."
        else:
            message += "."
        detail["message"] = message
        self.publish(Event("outside_use", now, s.user, detail=detail))

    def _charge(self, now: float) -> None:
        """Charge unbrokered use up to now in the fair-share ledger, as a lease's use is
        (to the user; no group was named), and close the records of users no longer
        seen on their device."""
        using = {(x.sighting.uuid, x.sighting.user) for x in self._seen.values()}
        store, ledger, devices = self.broker.store, self.broker.ledger, self.broker.placer.devices
        for key, (_, start) in self._usage.items():
            since, device = self._charged.get(key, start), devices.get(key[0])
            if now > since and device is not None:
                ledger.charge_past(key[1], "", device.gpu_equivalents, since, now, now)
            self._charged[key] = now
        for key in self._usage.keys() - using:
            self._charged.pop(key, None)
            with store.transaction():
                store.close_unbrokered(self._usage.pop(key)[0], now)

    def _drains(self) -> None:
        broker = self.broker
        busy = self.now_seen()
        for uuid, seen in busy.items():
            if broker.drain_cause(uuid) in (None, OUTSIDE):
                s = seen[0][0]
                broker.drain(uuid, f"in use outside the broker by {s.user}, pid {s.pid}", OUTSIDE)
        for uuid in broker.drained_by(OUTSIDE) - busy.keys():
            broker.undrain(uuid, "no longer in use outside the broker")

    def _signal(self, now: float) -> None:
        for seen in self._seen.values():
            s = seen.sighting
            if now - seen.noticed < self.grace_s:
                continue
            if seen.termed_at is not None and now - seen.termed_at < KILL_AFTER_S:
                continue
            sig = signal.SIGTERM if seen.termed_at is None else signal.SIGKILL
            if not self.may_signal:
                if seen.termed_at is None:
                    self.log.warning(
                        "GPU broker: not stopping pid %d on %s: only a broker running as "
                        "root signals processes",
                        s.pid,
                        s.label,
                    )
                    seen.termed_at = float("inf")
                continue
            if not _send(s, sig):
                continue
            seen.termed_at = now
            self.log.warning(
                "GPU broker: sent %s to pid %d of %s on %s (outside the broker for %s)",
                sig.name,
                s.pid,
                s.user,
                s.label,
                duration(now - seen.since),
            )
            detail = {"pid": s.pid, "device": s.label, "signal": sig.name}
            with self.broker.store.audited(
                AuditRecord(now, s.user, "outside_use_stop", s.uuid, detail)
            ):
                pass


def _send(s: Sighting, sig: signal.Signals) -> bool:
    """Signal the very process seen, never a later one that took its pid: through a pidfd,
    which names one process, once its start time says it is the one seen."""
    try:
        fd = os.pidfd_open(s.pid)
    except OSError:
        return False
    try:
        found = _stat(s.pid)
        if found is None or found[1] != s.started:
            return False
        signal.pidfd_send_signal(fd, sig)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True
