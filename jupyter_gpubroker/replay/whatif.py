"""What-if on a deployment's own history: its recorded requests replayed through the core.

A state file holds every request the broker accepted (who, what size, which class, when)
and, for those granted, how long their lease was held. ``whatif`` turns them into a trace
(each granted request a job that holds its lease as long as it did) and replays it with
:func:`.driver.replay`, on the machine the file recorded (``machines``), once as it was and
once with the settings changed: more or fewer GPUs or another machine, another ordering
policy, quotas and shares, MIG re-cutting on or off. Both are printed beside what really
happened, so the replay's own fidelity shows next to the change.

What it does not vary yet: a hold is replayed as it was recorded, so idle timeouts and the
reclaim action change nothing here (the file records when a lease was held, not when its
kernel computed); requests withdrawn before any grant are left out (they held nothing).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import timezone
from pathlib import Path
from typing import Any

import yaml

from ..broker.accounting import Prices, usage
from ..broker.budgets import Quota
from ..broker.core import Broker
from ..broker.models import JobClass
from ..broker.policy import Window, configured_policy
from ..broker.recorded import machines, requests
from ..broker.store import Store
from ..nvml import GpuSpec, Topology
from ..nvml.presets import TopologyError, gpu_spec, load_topology
from ..wire.errors import InvalidRequest
from .driver import Replay, replay
from .traces import MIN_DURATION_S, Job, Trace

QUOTA_FIELDS = ("share", "max_gpus", "gpu_hours", "period_s")


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
    """The settings the broker ordered by (``GPUBroker.recorded_settings``); empty where
    the file recorded none (the replay's defaults then)."""


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

    @property
    def varied(self) -> bool:
        return self != Variation()


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
    jobs, waits, holds, hours, reclaimed, left = [], [], [], 0.0, 0, 0
    for r in rows:
        if r["granted_at"] is None:
            left += 1
            continue
        end = r["ended_at"] if r["ended_at"] is not None else now
        held = max(end - r["granted_at"], MIN_DURATION_S)
        eq = float(r["gpu_equivalents"])
        jobs.append(
            Job(
                float(r["submitted_at"]),
                held,
                eq if eq < 1 else float(round(eq)),
                r["user"],
                r["grp"] or "",
                JobClass(r["job_class"]),
                states_duration=r["expected_duration_s"] is not None,
            )
        )
        waits.append(r["granted_at"] - r["submitted_at"])
        holds.append(
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
        reclaimed += r["lease_state"] == "reclaimed"
    if not jobs:
        raise InvalidRequest(f"{state} records no granted request: there is nothing to replay")
    jobs.sort(key=lambda j: j.submit_s)
    trace = Trace(Path(state).name, tuple(jobs))
    settings = recorded[-1][2] if recorded else {}
    served = _served(state, recorded, machine)
    limits = tuple((q["kind"], q["name"], Quota(**{k: q[k] for k in QUOTA_FIELDS})) for q in quotas)
    return History(trace, served, waits, hours, reclaimed, left, holds, limits, settings)


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
        raise InvalidRequest(f"the machine has {len(base.gpus)} GPUs: it cannot lose {-v.gpus}")
    extra: tuple[GpuSpec, ...] = (base.gpus[-1],) * max(v.gpus, 0)
    return replace(base, name=f"{base.name} {v.gpus:+d} GPUs", gpus=(base.gpus + extra)[:count])


def run(h: History, v: Variation) -> Replay:
    """Replay the history under a variation."""
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
    return replay(
        h.trace,
        policy,
        inventory=machine_for(h.machine, v),
        dynamic_mig=dynamic,
        setup=setup,
    )


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
) -> dict[str, Any]:
    ordered = sorted(waits)
    p95 = ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)] if ordered else 0.0
    return {
        "requests": len(ordered),
        "mean_wait_s": sum(ordered) / len(ordered) if ordered else 0.0,
        "p95_wait_s": p95,
        "max_wait_s": ordered[-1] if ordered else 0.0,
        "gpu_hours_held": gpu_hours,
        "kernels_lost": reclaimed,
        "cost": cost,
        "refused": refused,
    }


def replayed(run: Replay, prices: Prices | None) -> dict[str, Any]:
    """A replay's figures; kernels lost are not known (holds are replayed as recorded, and
    nothing reclaims them)."""
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
    return figures(waits, hours, None, _cost(rows, prices), sum(run.skipped.values()))


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
    out = {
        "recorded": figures(h.waits_s, h.gpu_hours, h.reclaimed, _cost(h.holds, prices)),
        "replayed": replayed(run(h, Variation()), prices),
    }
    if v.varied or prices_if is not None:
        out["what_if"] = replayed(run(h, v), prices_if or prices)
    return out
