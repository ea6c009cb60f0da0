"""What-if on a deployment's own history: its recorded requests replayed through the core.

A state file holds every request the broker accepted (who, what size, which class, when)
and, for those granted, how long their lease was held, why it ended (reclaimed, and for
what, or ended by its holder) and when its kernel was busy, as idle reclaim saw it
(``recorded.Activity``). ``whatif`` turns them into a trace (each granted request a job
that holds its lease as long as it did) and replays it with :func:`.driver.replay`, on the
machine the file recorded (``machines``), once as it was and once with the settings
changed: more or fewer GPUs or another machine, another ordering policy, quotas and shares,
MIG re-cutting on or off, the idle timeout, its grace and the reclaim action. All are
printed beside what really happened, so the replay's own fidelity shows next to the change,
and each run's days (``by_day``: requests, mean wait, GPU-hours held) are what its plots draw.
On a long history with two CPUs or more the two replays run side by side, the what-if in
a process of its own (``_both``).

Another idle timeout cuts each lease whose kernel was seen at its busy spans with
:func:`.idle.holds` (the count the notebook benchmark checks the real reclaimer against):
a lease idle longer than the timeout and its grace ends there, and the rest of its work
asks again at its next busy span, a new job submitted then, waiting as the core makes it
wait; a kernel shut down that way before more work is a kernel lost, one suspended is not
(MIG slices and shares are shut down, as the product does). A lease the broker reclaimed
idle ends at its idle start plus the new limit (its user did not come back before);
the other leases end as they did. Leases whose kernel was never seen (a CLI lease) are
held as recorded, as the product never reclaims them; a file that recorded no busy span
at all is refused. A suspend's copies are not modelled (the notebook replay models them).
Requests withdrawn before any grant are left out (they held nothing).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from datetime import date, datetime, timedelta, timezone, tzinfo
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import yaml

from ..broker.accounting import Prices, usage
from ..broker.budgets import Quota
from ..broker.core import Broker
from ..broker.models import JobClass
from ..broker.policy import Window, configured_policy
from ..broker.reclaim import ReclaimConfig
from ..broker.recorded import machines, requests
from ..broker.store import Store
from ..nvml import GpuSpec, Topology
from ..nvml.presets import TopologyError, gpu_spec, load_topology
from ..wire.errors import InvalidRequest
from ..wire.sizes import MAX_DURATION_S, number, seconds_between
from ..wire.times import zone
from .driver import Replay, replay
from .idle import holds
from .traces import MIN_DURATION_S, Job, Trace

QUOTA_FIELDS = ("share", "max_gpus", "gpu_hours", "period_s")
ACTIONS = ("shutdown", "suspend")
"""The reclaim actions a what-if replays (``c.GPUBroker.reclaim_action``'s)."""
IDLE_ENDS = ("idle", "suspended")
"""The reclaims that idle reclaim made (a suspend is one)."""


@dataclass(frozen=True)
class LeaseRecord:
    """One granted request as recorded: its job, and what another idle timeout needs."""

    job: Job
    granted_at: float
    end: float
    profile: str
    busy: tuple[tuple[float, float], ...] | None
    """Its kernel's busy spans, within the hold; None: its kernel was never seen."""
    idle_ended: bool
    """Idle reclaim ended it (shut down or suspended)."""

    @property
    def used_hours(self) -> float:
        return self.job.gpus * sum(b - a for a, b in self.busy or ()) / 3600


@dataclass(frozen=True)
class History:
    """A state file's requests as a trace, its machine and what really happened."""

    trace: Trace
    machine: Topology
    waits_s: list[float]
    gpu_hours: float
    reclaimed: int
    left_out: int
    """Requests never granted (withdrawn, cancelled, still waiting)."""
    holds: list[dict[str, Any]]
    """The recorded leases as usage rows (for their cost)."""
    quotas: tuple[tuple[str, str, Quota], ...]
    """The quotas and shares the file holds (admins' last word)."""
    settings: dict[str, Any]
    """The settings the broker ordered and reclaimed by (``GPUBroker.recorded_settings``
    and ``recorded_reclaim``); empty where the file recorded none (the defaults then)."""
    leases: tuple[LeaseRecord, ...] = ()
    suspended: int = 0

    @property
    def seen(self) -> bool:
        """Whether the file recorded any kernel's busy spans."""
        return any(x.busy is not None for x in self.leases)

    @property
    def unseen_hours(self) -> float:
        """GPU-hours held by leases whose kernel was never seen (any replay holds them so)."""
        return sum(x.job.gpus * x.job.duration_s for x in self.leases if x.busy is None) / 3600

    @property
    def used_hours(self) -> float:
        """GPU-hours the seen kernels were busy."""
        return sum(x.used_hours for x in self.leases)


@dataclass(frozen=True)
class Variation:
    """What a what-if changes; the defaults change nothing (None: as recorded)."""

    gpus: int = 0
    """GPUs added (taken away when negative), repeating the machine's last GPU."""
    machine: str | None = None
    """Another machine instead: a preset with ``:N`` or a topology file."""
    policy: str | None = None
    windows: tuple[dict[str, Any], ...] | None = None
    """Time-of-day windows of the broker policy (``c.GPUBroker.windows``), checked."""
    timezone: str | None = None
    """The time zone the windows are read in."""
    quotas: tuple[tuple[str, str, Quota], ...] = ()
    dynamic_mig: bool | None = None
    idle_timeout: float | None = None
    """Seconds (``c.GPUBroker.idle_timeout``; 0: no idle reclaim); it and ``grace`` stand
    for the suspend's own too (``suspend_idle_timeout``, ``suspend_grace``)."""
    grace: float | None = None
    reclaim_action: str | None = None
    """``shutdown`` or ``suspend``."""

    def __post_init__(self) -> None:
        words = seconds_between(0.0, MAX_DURATION_S)
        for name, said in (("idle_timeout", "the idle timeout"), ("grace", "the grace")):
            if getattr(self, name) is not None:
                number(getattr(self, name), said, 0.0, MAX_DURATION_S, words=words)
        if self.reclaim_action is not None and self.reclaim_action not in ACTIONS:
            raise InvalidRequest(
                f"the reclaim action is shutdown or suspend, not {self.reclaim_action!r}"
            )

    @property
    def varied(self) -> bool:
        return self != Variation()

    @property
    def idle_varied(self) -> bool:
        return (self.idle_timeout, self.grace, self.reclaim_action) != (None, None, None)


def history(state: str | Path, now: float, machine: str | None = None) -> History:
    """Read ``state`` read-only: its requests, machine and recorded outcome. ``machine``
    (a preset with ``:N`` GPUs) stands for the machine where the file recorded none."""
    store = Store(state, read_only=True)
    try:
        rows, recorded, quotas = requests(store), machines(store), store.quotas()
    finally:
        store.close()
    if not recorded and machine is None:
        raise InvalidRequest(
            f"{state} records no machine: it was written before the broker recorded one; "
            "restart the broker once to record it, or name the machine with --machine"
        )
    leases, waits, rows_held, hours, reclaimed, suspended, left = [], [], [], 0.0, 0, 0, 0
    for r in rows:
        if r["granted_at"] is None:
            left += 1
            continue
        end = r["ended_at"] if r["ended_at"] is not None else now
        held = max(end - r["granted_at"], MIN_DURATION_S)
        eq = float(r["gpu_equivalents"])
        job = Job(
            float(r["submitted_at"]),
            held,
            eq if eq < 1 else float(round(eq)),
            r["user"],
            r["grp"] or "",
            JobClass(r["job_class"]),
            states_duration=r["expected_duration_s"] is not None,
        )
        busy = None
        if r["busy"] is not None:  # an open span: busy until the lease ended
            spans = ((a, end if b is None else b) for a, b in json.loads(r["busy"]))
            busy = tuple((max(a, r["granted_at"]), min(b, end)) for a, b in spans if a <= end)
        cause = r["reclaim_cause"]
        leases.append(
            LeaseRecord(job, r["granted_at"], end, r["profile"], busy, cause in IDLE_ENDS)
        )
        waits.append(r["granted_at"] - r["submitted_at"])
        rows_held.append(
            {
                "user": r["user"],
                "grp": r["grp"],
                "profile": r["profile"],
                "job_class": r["job_class"],
                "gpu_equivalents": eq,
                "start": r["granted_at"],
                "end": end,
            }
        )
        hours += eq * held / 3600
        reclaimed += r["lease_state"] == "reclaimed" and cause != "suspended"
        suspended += cause == "suspended"
    if not leases:
        raise InvalidRequest(f"{state} records no granted request: there is nothing to replay")
    trace = Trace(Path(state).name, tuple(sorted((x.job for x in leases), key=_submitted)))
    settings = recorded[-1][2] if recorded else {}
    served = _served(state, recorded, machine)
    limits = tuple((q["kind"], q["name"], Quota(**{k: q[k] for k in QUOTA_FIELDS})) for q in quotas)
    return History(
        trace,
        served,
        waits,
        hours,
        reclaimed,
        left,
        rows_held,
        limits,
        settings,
        tuple(leases),
        suspended,
    )


def _submitted(job: Job) -> float:
    return job.submit_s


def reclaim_config(h: History, v: Variation) -> tuple[ReclaimConfig, str]:
    """The idle reclaim a variation replays: the recorded settings (``recorded_reclaim``;
    the defaults where the file recorded none) with the variation's over them."""
    s, shipped = h.settings, ReclaimConfig()
    timeout = v.idle_timeout if v.idle_timeout is not None else s.get("idle_timeout")
    grace = v.grace if v.grace is not None else s.get("grace")
    own = v.idle_timeout is None and v.grace is None  # else the variation's stand for both
    config = ReclaimConfig(
        idle_timeout_s=shipped.idle_timeout_s if timeout is None else timeout,
        idle_timeout_by_class=s.get("idle_timeout_by_class", {}),
        idle_timeout_by_profile=s.get("idle_timeout_by_profile", {}),
        grace_s=shipped.grace_s if grace is None else grace,
        suspend_idle_timeout_s=s.get("suspend_idle_timeout") if own else None,
        suspend_grace_s=s.get("suspend_grace") if own else None,
    )
    action = v.reclaim_action or s.get("reclaim_action", "shutdown")
    return config, "shutdown" if action not in ACTIONS else action  # auto, revoke: as shutdown


Cut = tuple[Trace, int, int]
"""The jobs cut by another idle reclaim, the kernels it loses and those it suspends."""


def idle_trace(h: History, v: Variation) -> Cut:
    """The history's jobs cut at their idle gaps under the variation's idle reclaim, with
    the kernels it loses and those it suspends."""
    if not h.seen:
        raise InvalidRequest(
            f"{h.trace.name} records no busy periods of any kernel (it was written before the "
            "broker recorded them), so whatif cannot vary the idle timeout or the reclaim action"
        )
    config, action = reclaim_config(h, v)
    jobs, lost, suspended = [], 0, 0
    for x in h.leases:
        job = x.job
        suspends = action == "suspend" and x.profile == "gpu"
        gpus = max(round(job.gpus), 1)
        timeout = config.idle_timeout(x.profile, job.job_class.value, gpus, suspend=suspends)
        grace = config.grace_s
        if suspends and config.suspend_grace_s is not None:
            grace = min(grace, config.suspend_grace_s)
        if x.busy is None or not timeout:
            jobs.append(job)
            continue
        stop = math.inf if x.idle_ended else x.end
        cut = holds(x.granted_at, stop, ((a, b, True) for a, b in x.busy), timeout + grace)
        for i, (a, b) in enumerate(cut.spans):  # the first as submitted, the rest at their span
            submit = job.submit_s if i == 0 else a
            jobs.append(replace(job, submit_s=submit, duration_s=max(b - a, MIN_DURATION_S)))
        if suspends:
            suspended += cut.shutdowns
        else:
            lost += cut.lost
    trace = Trace(h.trace.name, tuple(sorted(jobs, key=_submitted)))
    return trace, lost, suspended


def _served(
    state: str | Path,
    recorded: list[tuple[float, list[dict[str, Any]], dict[str, Any]]],
    machine: str | None,
) -> Topology:
    """The last machine the file recorded, else (or where the simulator does not know its
    GPUs) the one ``machine`` names."""
    if recorded:
        try:
            return topology(recorded[-1][1])
        except TopologyError as e:
            if machine is None:
                raise InvalidRequest(
                    f"{state} records a machine the simulator cannot build ({e}); name one "
                    "like it with --machine"
                ) from None
    assert machine is not None
    return load_topology(machine)


def topology(gpus: Sequence[dict[str, Any]]) -> Topology:
    """The simulated machine a recorded one (``machine``) stands for."""
    specs = tuple(gpu_spec(g["model"], g["mig"]) for g in gpus)
    return Topology(f"recorded ({len(specs)} GPUs)", specs)


def machine_for(base: Topology, v: Variation) -> Topology:
    """The machine a variation replays on."""
    if v.machine is not None:
        return load_topology(v.machine)
    count = len(base.gpus) + v.gpus
    if count < 1:
        n = len(base.gpus)
        raise InvalidRequest(f"the machine has {n} GPU{'s' * (n != 1)}: it cannot lose {-v.gpus}")
    extra: tuple[GpuSpec, ...] = (base.gpus[-1],) * max(v.gpus, 0)
    return replace(base, name=f"{base.name} {v.gpus:+d} GPUs", gpus=(base.gpus + extra)[:count])


def run(h: History, v: Variation, trace: Trace | None = None) -> Replay:
    """Replay the history (``trace``: its jobs cut by ``idle_trace``) under a variation."""
    return replay(trace or h.trace, **_settings(h, v))


def _settings(h: History, v: Variation) -> dict[str, Any]:
    """The replay's policy, machine, MIG re-cutting and quotas under a variation; refused
    (``InvalidRequest``) where the variation cannot run."""
    setup: Callable[[Broker], None] | None = None
    if h.quotas or v.quotas:

        def setup(broker: Broker) -> None:
            for kind, name, quota in h.quotas + v.quotas:  # the what-if's last
                broker.set_quota(kind, name, quota)

    s = h.settings
    name = v.policy or s.get("policy", "broker")
    if (v.windows is not None or v.timezone is not None) and name != "broker":
        raise InvalidRequest("time-of-day windows are the broker policy's, not the others'")
    params = s.get("policy_params", {}) if name == s.get("policy", "broker") else {}
    windows = list(v.windows if v.windows is not None else s.get("windows", []))
    policy = configured_policy(name, params, windows, v.timezone or s.get("timezone", "UTC"))
    dynamic = v.dynamic_mig if v.dynamic_mig is not None else s.get("dynamic_mig", True)
    return {
        "policy": policy,
        "inventory": machine_for(h.machine, v),
        "dynamic_mig": dynamic,
        "setup": setup,
    }


def read_windows(path: Path) -> tuple[dict[str, Any], ...]:
    """Time-of-day windows from a YAML or JSON file (a list, as ``c.GPUBroker.windows``)."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise InvalidRequest(f"cannot read windows file {path}: {e}") from None
    if not isinstance(data, list) or not all(isinstance(w, dict) for w in data):
        raise InvalidRequest(f"windows file {path} must hold a list of windows")
    for w in data:
        Window.from_dict(w)  # refused here, in a sentence, not in the replay
    return tuple(data)


def parse_quota(text: str) -> tuple[str, str, Quota]:
    """``user:alice:max_gpus=2,share=3`` -> (kind, name, quota)."""
    kind, _, rest = text.partition(":")
    name, _, fields = rest.rpartition(":")
    if kind not in ("user", "group") or not name or not fields:
        raise InvalidRequest(
            f"a quota is KIND:NAME:FIELD=VALUE[,...] with KIND user or group, not {text!r}"
        )
    values: dict[str, float] = {}
    for part in fields.split(","):
        key, _, value = part.partition("=")
        if key not in QUOTA_FIELDS:
            raise InvalidRequest(f"a quota sets {', '.join(QUOTA_FIELDS)}, not {key!r}")
        try:
            values[key] = float(value)
        except ValueError:
            raise InvalidRequest(f"{key} must be a number, not {value!r}") from None
    return kind, name, Quota(**values)


def figures(
    waits: Sequence[float],
    gpu_hours: float,
    reclaimed: int | None,
    cost: float | None,
    refused: int = 0,
    *,
    h: History | None = None,
    suspended: int | None = None,
) -> dict[str, Any]:
    """A run's figures; with ``h``, GPU-hours held over used: those of the leases whose
    kernel was seen, over its busy spans (a run moves holds, never the work)."""
    ordered = sorted(waits)
    p95 = ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)] if ordered else 0.0
    used = h.used_hours if h is not None and h.seen else None
    return {
        "requests": len(ordered),
        "mean_wait_s": sum(ordered) / len(ordered) if ordered else 0.0,
        "p95_wait_s": p95,
        "max_wait_s": ordered[-1] if ordered else 0.0,
        "gpu_hours_held": gpu_hours,
        "held_over_used": None if h is None or not used else (gpu_hours - h.unseen_hours) / used,
        "kernels_lost": reclaimed,
        "kernels_suspended": suspended,
        "cost": cost,
        "refused": refused,
    }


def by_day(
    asked: Iterable[tuple[float, float]],
    held: Iterable[dict[str, Any]],
    zone: tzinfo,
) -> list[dict[str, Any]]:
    """Each day in ``zone`` from the first request to the last hold: the requests granted
    that were asked that day and their mean wait (``asked``: submitted at, waited), and the
    GPU-hours held that day (``held``: usage rows, cut at each midnight as ``usage`` cuts
    them by day)."""
    waits: dict[date, list[float]] = {}
    for at, wait in asked:
        waits.setdefault(datetime.fromtimestamp(at, zone).date(), []).append(wait)
    by = usage(held, since=float("-inf"), until=float("inf"), by="day", tz=zone)
    hours = {date.fromisoformat(r.key): r.gpu_hours for r in by}
    if not waits and not hours:
        return []
    first, last = min([*waits, *hours]), max([*waits, *hours])
    days = []
    while first <= last:
        w = waits.get(first, [])
        days.append(
            {
                "day": first.isoformat(),
                "requests": len(w),
                "mean_wait_s": sum(w) / len(w) if w else 0.0,
                "gpu_hours_held": hours.get(first, 0.0),
            }
        )
        first += timedelta(days=1)
    return days


def zone_of(h: History) -> tzinfo:
    """The time zone the broker read its windows in (its days), else UTC."""
    try:
        return zone(h.settings.get("timezone") or "UTC")
    except InvalidRequest:  # a name this machine's zone database lacks
        return timezone.utc


def replayed(
    run: Replay,
    prices: Prices | None,
    h: History | None = None,
    lost: int | None = None,
    suspended: int | None = None,
) -> dict[str, Any]:
    """A replay's figures and days; kernels lost and suspended where known (another idle
    reclaim cut its leases: ``lost``, ``suspended``; as recorded, they are not replayed)."""
    hours = sum(o.gpu_equivalents * (o.end_s - o.start_s) for o in run.outcomes) / 3600
    rows = [
        {
            "user": o.user,
            "grp": o.group,
            "profile": "gpu" if o.gpu_equivalents >= 1 else "*",
            "job_class": o.job_class.value,
            "gpu_equivalents": o.gpu_equivalents,
            "start": o.start_s,
            "end": o.end_s,
        }
        for o in run.outcomes
    ]
    waits = [o.wait_s for o in run.outcomes]
    refused = sum(run.skipped.values())
    cost = _cost(rows, prices)
    found = figures(waits, hours, lost, cost, refused, h=h, suspended=suspended)
    found["days"] = by_day(
        ((o.submit_s, o.wait_s) for o in run.outcomes),
        rows,
        timezone.utc if h is None else zone_of(h),
    )
    return found


def _cost(rows: list[dict[str, Any]], prices: Prices | None) -> float | None:
    if prices is None or not rows:
        return None
    found = usage(
        rows,
        since=float("-inf"),
        until=float("inf"),
        by="user",
        tz=timezone.utc,
        prices=prices,
    )
    return sum(r.cost or 0.0 for r in found)


def compare(
    h: History, v: Variation, prices: Prices | None = None, prices_if: Prices | None = None
) -> dict[str, dict[str, Any]]:
    """What happened, the replay as it was, and (if anything varies) the what-if, its cost
    at ``prices_if`` where given (other prices, other bands), else at ``prices``."""
    cost = _cost(h.holds, prices)
    real = figures(h.waits_s, h.gpu_hours, h.reclaimed, cost, h=h, suspended=h.suspended)
    real["days"] = by_day(
        ((x.job.submit_s, x.granted_at - x.job.submit_s) for x in h.leases), h.holds, zone_of(h)
    )
    if not (v.varied or prices_if is not None):
        return {"recorded": real, "replayed": _figures_of(h, Variation(), None, prices)}
    _settings(h, v)  # a variation that cannot run is refused before either replay
    cut = idle_trace(h, v) if v.idle_varied else None
    as_was, what_if = _both(h, v, cut, prices, prices_if or prices)
    return {"recorded": real, "replayed": as_was, "what_if": what_if}


BESIDE_FROM = 2000
"""Requests from which the what-if replays in a process of its own, beside the unvaried
replay, where there are two CPUs or more: a process takes about a second to start, and a
month of a 64-GPU hub (22,000 requests) half a minute to replay."""


def _both(
    h: History, v: Variation, cut: Cut | None, prices: Prices | None, prices_if: Prices | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The unvaried replay's figures and the what-if's, side by side where it is worth it."""
    if len(h.trace.jobs) >= BESIDE_FROM and len(os.sched_getaffinity(0)) > 1:
        with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
            varied = pool.submit(_figures_of, h, v, cut, prices_if)
            return _figures_of(h, Variation(), None, prices), varied.result()
    return _figures_of(h, Variation(), None, prices), _figures_of(h, v, cut, prices_if)


def _figures_of(h: History, v: Variation, cut: Cut | None, prices: Prices | None) -> dict[str, Any]:
    """One replay's figures; ``cut``: the jobs ``idle_trace`` cut, with the kernels lost
    and suspended."""
    if cut is None:
        return replayed(run(h, v), prices, h)
    trace, lost, suspended = cut
    return replayed(run(h, v, trace), prices, h, lost, suspended)
