"""Taking GPUs back: idle and stalled leases, and (optionally) over-share borrowers.

Every few seconds the host observes what each lease's devices and kernel are doing
(:class:`Observation`); :meth:`Reclaimer.step` turns that into warnings, withdrawn
warnings and reclaims, applies them through the broker (``warn``, ``unwarn``,
``reclaim`` with its evidence) and returns them, so that the host can shut the
reclaimed kernels down. Nothing here reads a clock or touches a kernel.

- **Idle**: the kernel ran nothing for ``idle_timeout`` AND the GPU stayed under
  ``utilization_threshold`` as long. A GPU server's reservation (the hub's GPU spawner,
  holder ``server:<user>``) is judged the same way, by the activity of all the server's
  kernels as the server reports it, with its own timeouts (``server_idle_timeout_s``).
  Where NVML reports no utilization (a MIG slice without GPM) a change in the holder's
  GPU processes or their memory counts as GPU activity.
- **Stalled**: the kernel has been busy for ``stalled_timeout`` while its GPU, which
  does report utilization, stayed under the threshold (a hung cell, a wait on input).
- **Computing**: a busy kernel whose GPU is above the threshold or reports nothing.
  It is never reclaimed; neither is a lease whose kernel the host cannot see (a CLI
  lease, a kernel of another server): there is no evidence either way.
- **Time limit**: a lease whose request declared a time limit (``broker.limits``) is
  warned ``limit_warning_s`` before the limit (with its extensions) ends and reclaimed
  ``limit_grace_s`` after it, whatever it is doing and whoever holds it (a limit is
  the holder's own declaration; the start promised to others rests on it).
- **Over its share**: a share of a GPU whose kernel goes past what holds it
  (``sharewatch``: over its memory where nothing enforces it, or outside MPS) is warned,
  and reclaimed ``over_share_grace_s`` later if it still is, as an idle lease is.
- **Preempted** (off by default): a user over their fair share holds a slice that a
  waiting user under theirs could use. Fair share is the broker's fair-share ledger
  (``broker.fairshare``), the one the queue is ordered by.

A verdict is first a warning with a deadline ``grace`` away; the lease is reclaimed
if the verdict still holds at the deadline, and the warning withdrawn as soon as it
does not. Before either, an ``arbiter`` the host may give (the admin's hook, as the
idle culler's ``cull_arbiter_hook``) sees the :class:`Candidate` and may keep the lease.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ..wire.errors import InvalidRequest
from ..wire.profiles import ALL_PROFILE_NAMES
from ..wire.sizes import MAX_DURATION_S, number, seconds_between
from ..wire.text import SERVER_HOLDER, duration, limit_reason
from .models import JobClass, Lease, Request, RequestState
from .sharewatch import share_fault

if TYPE_CHECKING:
    from .core import Broker

MEMORY_ACTIVITY_MIB = 16.0
"""A change of the holder's GPU memory by more than this counts as GPU activity."""

Cause = Literal["idle", "stalled", "preempted", "time_limit", "over_share"]
SUSPENDABLE = ("idle", "stalled")
"""The causes the reclaim action applies to (a kernel whose GPU sits unused); a time limit,
a preemption or a share over its memory ends the lease as before."""


@dataclass(frozen=True)
class KernelState:
    """A kernel as the host sees it."""

    execution_state: str
    """``idle``, ``busy``, ``starting``, ... (the Jupyter kernel status)."""
    last_activity: float
    """When it last started or finished running code."""


@dataclass(frozen=True)
class Observation:
    """One look at a lease. ``None``: not known (e.g. MIG utilization without GPM)."""

    utilization: float | None = None
    """Highest GPU utilization (percent) over the lease's devices."""
    memory_used_mib: float | None = None
    """Over the lease's devices; a share's: its own processes' on its GPU."""
    processes: int | None = None
    outside_mps: int | None = None
    """A share's processes that NVML lists without an MPS compute context."""
    kernel: KernelState | None = None


@dataclass(frozen=True)
class ReclaimConfig:
    idle_timeout_s: float = 1200.0
    """How long a lease may sit idle before its holder is warned; 0 disables."""
    idle_timeout_by_class: Mapping[str, float] = field(default_factory=dict)
    idle_timeout_by_profile: Mapping[str, float] = field(default_factory=dict)
    """Overrides: a profile's (``gpu:N`` for N whole GPUs, ``gpu`` for any number) wins
    over a class's."""
    server_idle_timeout_s: float | None = None
    """How long a GPU server's reservation may sit idle; None: as a kernel's lease."""
    server_idle_timeout_by_profile: Mapping[str, float] = field(default_factory=dict)
    """Overrides for GPU servers, keyed as ``idle_timeout_by_profile``."""
    grace_s: float = 600.0
    """Time between the warning and the reclaim."""
    suspend_idle_timeout_s: float | None = None
    """The idle timeout of a lease whose kernel the host suspends, where shorter than
    ``idle_timeout_s`` (None: that one): a suspend loses nothing, so it may come sooner,
    never later than a shutdown would; per-class and per-profile timeouts win."""
    suspend_grace_s: float | None = None
    """The grace before such a suspend, where shorter than ``grace_s`` (None: that one)."""
    stalled_timeout_s: float = 7200.0
    """How long a busy kernel may leave its GPU under the threshold; 0 disables."""
    utilization_threshold: float = 5.0
    """GPU utilization (percent) under which a GPU counts as unused."""
    exempt_users: frozenset[str] = frozenset()
    exempt_groups: frozenset[str] = frozenset()
    preemption: bool = False
    """Warn and reclaim over-share borrowers when an under-share user waits."""
    over_share_grace_s: float = 60.0
    """Time between the warning that a watched share's kernel uses more than its share
    and the reclaim."""

    def __post_init__(self) -> None:
        timeouts = {
            "idle_timeout_s": self.idle_timeout_s,
            "stalled_timeout_s": self.stalled_timeout_s,
            "grace_s": self.grace_s,
            "over_share_grace_s": self.over_share_grace_s,
            **{f"idle timeout of class {k!r}": v for k, v in self.idle_timeout_by_class.items()},
            **{f"idle timeout of {k!r}": v for k, v in self.idle_timeout_by_profile.items()},
            **{
                f"server idle timeout of {k!r}": v
                for k, v in self.server_idle_timeout_by_profile.items()
            },
        }
        for name in ("server_idle_timeout_s", "suspend_idle_timeout_s", "suspend_grace_s"):
            if getattr(self, name) is not None:
                timeouts[name] = getattr(self, name)
        for name, v in timeouts.items():
            number(v, name, 0.0, MAX_DURATION_S, words=seconds_between(0.0, MAX_DURATION_S))
        unknown = set(self.idle_timeout_by_class) - {c.value for c in JobClass}
        if unknown:
            raise InvalidRequest(f"unknown job class(es) {', '.join(sorted(unknown))}")
        if not 0 <= self.utilization_threshold <= 100:
            raise InvalidRequest("utilization_threshold is a percent from 0 to 100")
        for by_profile in (self.idle_timeout_by_profile, self.server_idle_timeout_by_profile):
            unknown = {k for k in by_profile if not _is_size_key(k)}
            if unknown:
                raise InvalidRequest(
                    f"unknown profile(s) {', '.join(sorted(unknown))}: name MIG profiles, "
                    "'gpu' for whole GPUs or 'gpu:N' for N of them"
                )

    def idle_timeout(
        self,
        profile: str,
        job_class: str,
        gpus: int = 1,
        *,
        server: bool = False,
        suspend: bool = False,
    ) -> float:
        """The idle timeout of a lease of ``profile`` (``gpu``: ``gpus`` whole GPUs) and
        ``job_class``; ``server``: a GPU server's reservation; ``suspend``: a lease whose
        kernel the host suspends."""
        keys = (f"gpu:{gpus}", "gpu") if profile == "gpu" else (profile,)
        base = self.idle_timeout_s
        if suspend and self.suspend_idle_timeout_s is not None and base:
            base = min(base, self.suspend_idle_timeout_s)
        kernel = next(
            (self.idle_timeout_by_profile[k] for k in keys if k in self.idle_timeout_by_profile),
            self.idle_timeout_by_class.get(job_class, base),
        )
        if not server:
            return kernel
        by_profile = self.server_idle_timeout_by_profile
        default = kernel if self.server_idle_timeout_s is None else self.server_idle_timeout_s
        return next((by_profile[k] for k in keys if k in by_profile), default)


@dataclass(frozen=True)
class Decision:
    """What ``step`` did to one lease, and why."""

    action: Literal["warn", "clear", "reclaim", "suspend"]
    """``suspend``: the deadline passed and the host suspends the kernel instead; it ends
    the lease itself (cause ``suspended``, or the verdict's cause where it falls back)."""
    lease_id: str
    holder: str
    """The request's holder (a kernel id) whose kernel the host acts on."""
    cause: Cause
    reason: str
    evidence: dict[str, Any]
    deadline: float | None = None


@dataclass(frozen=True)
class Candidate:
    """A lease about to be warned or reclaimed, as an arbiter sees it."""

    action: Literal["warn", "reclaim"]
    cause: Cause
    reason: str
    lease_id: str
    user: str
    group: str
    kernel: str
    """The request's holder: a kernel id, ``server:<user>`` for a GPU server, ``cli``."""
    job_class: str
    profile: str
    """Its MIG profile; "" for whole GPUs."""
    devices: tuple[str, ...]
    granted_at: float
    idle_s: float | None
    """How long the lease has been idle (None: its kernel is not seen)."""
    evidence: dict[str, Any]
    """The readings and kernel state the verdict rests on (``utilization``,
    ``memory_used_mib``, ``processes``, ``kernel_state``, ``gpu_quiet_s``, ...)."""
    now: float


Arbiter = Callable[[Candidate], str | None]
"""Why to keep a lease the reclaimer would warn or reclaim; None: go ahead."""


@dataclass(frozen=True)
class _Verdict:
    cause: Cause
    reason: str
    evidence: dict[str, Any]
    deadline: float | None = None
    """When to reclaim, if fixed by the verdict (a time limit); else ``grace_s`` away."""


@dataclass
class _Track:
    gpu_active_at: float
    """When the GPU was last seen in use (the grant to begin with)."""
    footprint: tuple[int | None, float | None] | None = None
    """The holder's (processes, memory) at the last look."""
    warning: tuple[Cause, float, float] | None = None
    """(cause, warned at, deadline) of a pending warning."""
    kept_at: float = 0.0
    """When the holder last said to keep it ("keep it" on a warning): kernel activity."""
    idle_s: float | None = None
    """How long the lease had been idle at the last look (None: its kernel is not seen)."""


class Reclaimer:
    """Judges every active lease of ``broker`` at each :meth:`step`."""

    def __init__(
        self, broker: Broker, config: ReclaimConfig | None = None, arbiter: Arbiter | None = None
    ) -> None:
        self.broker = broker
        self.config = config or ReclaimConfig()
        self.arbiter = arbiter
        self.watched: Callable[[Lease], bool] = lambda lease: False
        """Whether nothing but this watch holds a share to its memory (the host's word)."""
        self.under_mps: Callable[[Lease], bool] = lambda lease: False
        """Whether MPS holds a share (its clients only: the watch holds the rest)."""
        self.suspends: Callable[[Lease], bool | None] | None = None
        """Whether the host suspends a lease's kernel at the deadline rather than the
        reclaimer reclaiming it (the reclaim action ``suspend``, or ``auto`` where the
        canary passed on its GPUs); None: not known yet (the canary has not run), the
        deadline waits for the answer."""
        self.not_suspended: Callable[[Lease], str | None] | None = None
        """Why the host does not suspend a lease the reclaimer reclaims itself, where it
        says (a MIG slice, a GPU model the canary did not pass): the end of its reason."""
        self._tracks: dict[str, _Track] = {}

    def step(self, observations: Mapping[str, Observation]) -> list[Decision]:
        """Judge each active lease by its observation (lease id -> ``Observation``),
        apply the warnings and reclaims due, and return them."""
        now = self.broker.clock.now()
        leases = {x.id: x for x in self.broker.leases()}
        for gone in self._tracks.keys() - leases.keys():
            del self._tracks[gone]
        verdicts: dict[str, _Verdict | None] = {}
        for lease in leases.values():
            track = self._tracks.setdefault(lease.id, _Track(lease.granted_at))
            request = self.broker.request(lease.request_id)
            obs = observations.get(lease.id, Observation())
            judged = self._judge(lease, request, track, obs, now)
            over = self._over_share(lease, obs, now)
            verdicts[lease.id] = self._time_limit(lease, now) or over or judged
        if self.config.preemption:
            for lease_id, preempted in self._preemptions(leases).items():
                verdicts[lease_id] = verdicts[lease_id] or preempted
        decisions = []
        for lease_id, verdict in verdicts.items():
            decision = self._act(leases[lease_id], self._tracks[lease_id], verdict, now)
            if decision is not None:
                decisions.append(decision)
        return decisions

    def idle_s(self, lease_id: str) -> float | None:
        """Seconds the lease's kernel ran nothing and its GPU stayed quiet, at the last
        look (0 while computing); None where there is no evidence either way."""
        track = self._tracks.get(lease_id)
        return None if track is None else track.idle_s

    def keep(self, lease_id: str) -> None:
        """The holder wants the lease: count it as kernel activity now, and withdraw a
        pending idle or stalled warning at once rather than at the next look."""
        lease = self.broker.lease(lease_id)
        track = self._tracks.setdefault(lease.id, _Track(lease.granted_at))
        track.kept_at = self.broker.clock.now()
        track.idle_s = 0.0 if track.idle_s is not None else None
        if track.warning is not None and track.warning[0] in ("idle", "stalled"):
            track.warning = None
            self.broker.unwarn(lease.id, "kept by its holder")

    def suspended_at_deadline(self, lease: Lease) -> bool | None:
        """Whether the host suspends the lease's kernel at its deadline (``suspends``)."""
        return False if self.suspends is None else self.suspends(lease)

    # -- verdicts

    def exempt(self, lease: Lease, request: Request) -> bool:
        cfg = self.config
        return lease.user in cfg.exempt_users or bool(cfg.exempt_groups & set(request.groups))

    def _judge(
        self, lease: Lease, request: Request, track: _Track, obs: Observation, now: float
    ) -> _Verdict | None:
        cfg = self.config
        if obs.utilization is not None:
            if obs.utilization >= cfg.utilization_threshold:
                track.gpu_active_at = now
        else:
            footprint = (obs.processes, obs.memory_used_mib)
            if track.footprint is not None and _moved(track.footprint, footprint):
                track.gpu_active_at = now
            track.footprint = footprint
        kernel = obs.kernel
        track.idle_s = None
        if kernel is None:
            return None
        gpu_quiet_s = now - track.gpu_active_at
        since_activity_s = max(now - max(kernel.last_activity, track.kept_at), 0.0)
        busy = kernel.execution_state == "busy"
        track.idle_s = 0.0 if busy else round(min(since_activity_s, gpu_quiet_s), 3)
        if self.exempt(lease, request):
            return None
        evidence: dict[str, Any] = {
            "kernel_state": kernel.execution_state,
            "kernel_last_activity": kernel.last_activity,
            "utilization": obs.utilization,
            "utilization_threshold": cfg.utilization_threshold,
            "gpu_quiet_s": round(gpu_quiet_s, 3),
            "memory_used_mib": obs.memory_used_mib,
            "processes": obs.processes,
        }
        below = f"the GPU under {cfg.utilization_threshold:g}%"
        if kernel.execution_state == "busy":
            if obs.utilization is None or not cfg.stalled_timeout_s:
                return None  # computing, or no way to tell: never reclaimed
            stalled_s = min(since_activity_s, gpu_quiet_s)
            if stalled_s < cfg.stalled_timeout_s:
                return None
            evidence.update(stalled_s=round(stalled_s, 3), timeout_s=cfg.stalled_timeout_s)
            reason = f"stalled: kernel busy for {duration(since_activity_s)} with {below}"
            return _Verdict("stalled", reason, evidence)
        timeout = cfg.idle_timeout(
            lease.profile,
            request.job_class.value,
            len(lease.devices),
            server=request.holder.startswith(SERVER_HOLDER),
            suspend=self.suspended_at_deadline(lease) is True,
        )
        if kernel.execution_state != "idle" or not timeout:
            return None
        idle_s = min(since_activity_s, gpu_quiet_s)
        if idle_s < timeout:
            return None
        evidence.update(idle_s=round(idle_s, 3), timeout_s=timeout)
        gpu = below if obs.utilization is not None else "no change on the GPU"
        reason = f"idle for {duration(idle_s)}: the kernel ran nothing, {gpu}"
        return _Verdict("idle", reason, evidence)

    def _time_limit(self, lease: Lease, now: float) -> _Verdict | None:
        """Warn once the lease's time limit is ``limit_warning_s`` away; reclaim once it is
        ``limit_grace_s`` past."""
        end, cfg = lease.ends_at, self.broker.config
        if end is None or now < end - cfg.limit_warning_s:
            return None
        evidence = {
            "limit_s": lease.limit_s,
            "extended_s": lease.extended_s,
            "extensions": lease.extensions,
            "ends_at": end,
            "grace_s": cfg.limit_grace_s,
        }
        reason = limit_reason(lease.granted_at, end, now)
        return _Verdict("time_limit", reason, evidence, end + cfg.limit_grace_s)

    def _over_share(self, lease: Lease, obs: Observation, now: float) -> _Verdict | None:
        """A share past what holds it (``sharewatch``): reclaimed ``over_share_grace_s``
        after the warning unless it comes back within it."""
        if not lease.shared:
            return None
        mechanism = "watched" if self.watched(lease) else "mps" if self.under_mps(lease) else ""
        device = self.broker.placer.devices.get(lease.devices[0])
        label = device.label if device is not None else lease.devices[0]
        reason = share_fault(lease, obs, mechanism, label)
        if reason is None:
            return None
        evidence = {
            "memory_used_mib": obs.memory_used_mib,
            "share_mib": lease.share_mib,
            "processes": obs.processes,
            "outside_mps": obs.outside_mps,
        }
        deadline = now + self.config.over_share_grace_s
        track = self._tracks.get(lease.id)
        if track is not None and track.warning is not None and track.warning[0] == "over_share":
            deadline = track.warning[2]
        return _Verdict("over_share", reason, evidence, deadline)

    def _preemptions(self, leases: Mapping[str, Lease]) -> dict[str, _Verdict]:
        """Leases to take back, judged by the fair-share ledger the queue is ordered by.

        For the oldest request of each waiting user under their share that no free device
        fits: the newest lease it could use of the holder the ledger ranks lowest
        (``F_user * F_group``), among holders over their share and below the waiter. One
        lease per waiting user at a time: taking a lease does not change the ledger, the
        grant that follows (its entry penalty, then its usage) does."""
        b = self.broker
        ledger = b.ledger
        waiting = [r for r in b.live_requests() if r.state is RequestState.QUEUED]
        if not waiting:
            return {}
        requests = {x.id: b.request(x.request_id) for x in leases.values()}
        victims: dict[str, _Verdict] = {}
        served: set[str] = set()
        for r in waiting:
            if r.user in served or ledger.over_share(("user", r.user)):
                continue
            fits = b.placer.compatible(r.size)
            if not fits or b.placer.has_free_for(r.size):
                continue  # nothing could serve it, or it waits for another reason
            standing = ledger.fairshare(r.user, r.group)
            usable = {d.uuid for d in fits}
            candidates = [
                x
                for x in leases.values()
                if x.id not in victims
                and x.user != r.user
                and not self.exempt(x, requests[x.id])
                and set(x.devices) <= usable
                and len(x.devices) >= b.placer.units(r.size)
                and ledger.over_share(("user", x.user))
                and ledger.fairshare(x.user, x.group) < standing
            ]
            if not candidates:
                continue
            # the heaviest holder first, then its newest lease (the least work lost; of
            # leases granted in one pass, the last granted: candidates are in grant order)
            victim = min(
                reversed(candidates),
                key=lambda x: (ledger.fairshare(x.user, x.group), -x.granted_at),
            )
            holder, waiter = ("user", victim.user), ("user", r.user)
            evidence = {
                "holder_usage_share": round(ledger.usage_share(holder), 4),
                "holder_share": round(ledger.norm_share(holder), 4),
                "holder_fairshare": round(ledger.fairshare(victim.user, victim.group), 4),
                "waiting_user": r.user,
                "waiting_user_usage_share": round(ledger.usage_share(waiter), 4),
                "waiting_user_share": round(ledger.norm_share(waiter), 4),
                "waiting_user_fairshare": round(standing, 4),
                "waiting_request": r.id,
            }
            reason = (
                f"preempted: {victim.user} has used {ledger.usage_share(holder):.0%} of the "
                f"recent GPU time for a {ledger.norm_share(holder):.0%} share, while {r.user} "
                f"({ledger.usage_share(waiter):.0%} for {ledger.norm_share(waiter):.0%}) waits"
            )
            victims[victim.id] = _Verdict("preempted", reason, evidence)
            served.add(r.user)
        return victims

    # -- actions

    def _act(
        self, lease: Lease, track: _Track, verdict: _Verdict | None, now: float
    ) -> Decision | None:
        request = self.broker.request(lease.request_id)
        holder = request.holder
        kept = None
        if verdict is not None:
            warning = track.warning
            if _fresh(warning, verdict):
                kept = self._arbitrate("warn", lease, request, track, verdict, now)
            elif warning is not None and now >= warning[2]:
                kept = self._arbitrate("reclaim", lease, request, track, verdict, now)
        if verdict is None or kept is not None:
            if track.warning is None:
                return None
            cause = track.warning[0]
            track.warning = None
            reason = kept or _CLEARED.get(cause, "in use again")
            self.broker.unwarn(lease.id, reason)
            return Decision("clear", lease.id, holder, cause, reason, {})
        if _fresh(track.warning, verdict):
            deadline = verdict.deadline
            if deadline is None:
                grace = self.config.grace_s
                shorter = self.config.suspend_grace_s
                if shorter is not None and self.suspended_at_deadline(lease) is True:
                    grace = min(grace, shorter)
                deadline = now + grace
            track.warning = (verdict.cause, now, deadline)
            self.broker.warn(lease.id, verdict.reason, deadline, verdict.cause)
            return Decision(
                "warn", lease.id, holder, verdict.cause, verdict.reason, verdict.evidence, deadline
            )
        assert track.warning is not None  # not fresh: one is pending
        _, warned_at, deadline = track.warning
        if now < deadline:
            return None
        evidence = {**verdict.evidence, "warned_at": warned_at, "deadline": deadline}
        why = None
        if verdict.cause in SUSPENDABLE:
            suspend = self.suspended_at_deadline(lease)
            if suspend is None:
                return None  # the canary's answer first: looked at again next pass
            if suspend:
                track.warning = (verdict.cause, warned_at, math.inf)  # the host's from now on
                cause, why_reclaimed = verdict.cause, verdict.reason
                return Decision("suspend", lease.id, holder, cause, why_reclaimed, evidence)
            why = self.not_suspended(lease) if self.not_suspended is not None else None
        reason = verdict.reason if why is None else f"{verdict.reason}; not suspended: {why}"
        self.broker.reclaim(lease.id, reason, cause=verdict.cause, evidence=evidence)
        return Decision("reclaim", lease.id, holder, verdict.cause, reason, evidence)

    def _arbitrate(
        self,
        action: Literal["warn", "reclaim"],
        lease: Lease,
        request: Request,
        track: _Track,
        verdict: _Verdict,
        now: float,
    ) -> str | None:
        """The arbiter's reason to keep the lease (None: none, or no arbiter)."""
        if self.arbiter is None:
            return None
        return self.arbiter(
            Candidate(
                action=action,
                cause=verdict.cause,
                reason=verdict.reason,
                lease_id=lease.id,
                user=lease.user,
                group=lease.group,
                kernel=request.holder,
                job_class=request.job_class.value,
                profile=lease.profile,
                devices=tuple(lease.devices),
                granted_at=lease.granted_at,
                idle_s=track.idle_s,
                evidence=dict(verdict.evidence),
                now=now,
            )
        )


_CLEARED = {
    "preempted": "no longer needed",
    "time_limit": "its time limit was extended",
    "over_share": "back within its share",
}
"""Why a warning of a cause was withdrawn (else: the lease is in use again)."""


def _fresh(warning: tuple[Cause, float, float] | None, verdict: _Verdict) -> bool:
    """Does ``verdict`` need a warning of its own: none is pending, the pending one is of
    another cause, or its deadline moved (a time limit extended meanwhile)?"""
    if warning is None or warning[0] != verdict.cause:
        return True
    moved = verdict.deadline is not None and verdict.deadline != warning[2]
    return moved and math.isfinite(warning[2])  # inf: the host suspends it


def _is_size_key(key: str) -> bool:
    """A key of the per-profile timeouts: a MIG profile, ``gpu`` or ``gpu:N`` (N >= 1)."""
    if key in ALL_PROFILE_NAMES or key == "gpu":
        return True
    count = key.removeprefix("gpu:")
    return count != key and count.isdigit() and int(count) >= 1


def _moved(before: tuple[int | None, float | None], after: tuple[int | None, float | None]) -> bool:
    (p0, m0), (p1, m1) = before, after
    if p0 != p1:
        return True
    return m0 is not None and m1 is not None and abs(m1 - m0) > MEMORY_ACTIVITY_MIB
