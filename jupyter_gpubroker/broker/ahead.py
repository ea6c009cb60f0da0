"""MIG slices cut ahead of the forecast: before an hour whose requests the forecast
expects in profiles the idle GPUs are not cut to, idle capacity is re-cut so those
requests find their slices ready (small slices by day, whole-GPU slices by night).

Only idle slices are destroyed (``migplan``), never a held one or a drained GPU, and a
slice of a profile the forecast still wants is kept. ``runtime/mig_ahead.py`` decides
when (nobody waiting, the feature on) and audits each cut with its reason."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from .forecast import HourForecast
from .migplan import MigPlan

if TYPE_CHECKING:
    from .placement import Placer

PROFILE_SIZE = "profile="
"""How a request's size key names a MIG profile (``profile=1g.10gb``)."""


def slices_wanted(hours: Iterable[HourForecast]) -> dict[str, int]:
    """MIG slices of each profile the forecast's median asks at once in any of ``hours``:
    the GPU-equivalents asked in a profile over what one slice of it is."""
    wanted: dict[str, int] = {}
    for hour in hours:
        asked: defaultdict[str, float] = defaultdict(float)
        for key, gpu_equivalents in hour.asked.items():
            size = key.rpartition(" ")[2]
            if size.startswith(PROFILE_SIZE):
                asked[size.removeprefix(PROFILE_SIZE)] += gpu_equivalents
        for profile, gpu_equivalents in asked.items():
            n = math.ceil(gpu_equivalents / compute_fraction(profile) - 1e-9)
            wanted[profile] = max(wanted.get(profile, 0), n)
    return {p: n for p, n in wanted.items() if n > 0}


def compute_fraction(profile: str) -> float:
    """A profile's share of a GPU's compute: ``3g.40gb`` is three sevenths."""
    return int(profile.split("g", 1)[0]) / 7


def next_cut(placer: Placer, wanted: Mapping[str, int]) -> MigPlan | None:
    """The next re-cut towards ``wanted``: a slice of the largest profile short of it, cut
    from idle slices of profiles the forecast wants fewer of than there are."""
    have: defaultdict[str, int] = defaultdict(int)
    for d in placer.devices.values():
        if d.kind == "mig" and d.profile:
            have[d.profile] += 1
    keep = frozenset(
        d.uuid
        for d in placer.devices.values()
        if d.kind == "mig" and d.profile and have[d.profile] <= wanted.get(d.profile, 0)
    )
    short = [p for p, n in wanted.items() if have[p] < n]
    for profile in sorted(short, key=compute_fraction, reverse=True):
        found = placer.plan_mig(profile, exclude=keep)
        if found is not None:
            return found
    return None
