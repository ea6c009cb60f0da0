"""Dynamic MIG's plans: how to cut a new slice of a profile from idle capacity.

When no free slice of a wanted profile exists, a GPU in MIG mode may be re-cut: idle
slices that overlap a valid placement are destroyed and a new one created there. The
plan picks the placement that destroys the least compute, on the busiest GPU, at the
highest start (small profiles at the top of the GPU keep slot 0 free for the large
ones). The placer (``placement.Placer.plan_mig``) asks, and keeps each GPU's cheapest cut
until a device on that GPU changes; ``devices.Devices`` carries a plan out.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from ..wire.profiles import CATALOG, GpuModel, MigProfile
from .models import Device, Gpu

if TYPE_CHECKING:
    from .placement import Placer


@dataclass(frozen=True)
class MigPlan:
    """Re-cut ``gpu``: destroy the idle ``destroy`` slices, then create ``profile`` at ``start``."""

    gpu: Gpu
    profile: MigProfile
    start: int
    destroy: tuple[Device, ...]


Cut = tuple[tuple[int, int, int], MigPlan]
"""A plan and its cost: compute slices destroyed, minus the GPU's busy slices, minus the start."""


def plan(
    placer: Placer,
    profile_name: str,
    exclude: AbstractSet[str],
    kept: dict[str, dict[tuple[str, AbstractSet[str]], Cut | None]],
) -> MigPlan | None:
    """How to cut a new ``profile_name`` slice from idle capacity, if any GPU can: the
    cheapest of each GPU's cheapest cut, each taken from ``kept`` (GPU -> its cuts per
    profile and excluded devices on it, which the placer empties for a GPU whose devices
    change) or worked out and kept there."""
    best: Cut | None = None
    for gpu in placer.gpus.values():
        mine: frozenset[str] = frozenset()
        if exclude:
            mine = frozenset(d.uuid for d in placer.under(gpu.uuid) if d.uuid in exclude)
        asked = (profile_name, mine)
        cuts = kept.setdefault(gpu.uuid, {})
        if asked not in cuts:
            cuts[asked] = cheapest_cut(placer, gpu, profile_name, asked[1])
        found = cuts[asked]
        if found is not None and (best is None or found[0] < best[0]):
            best = found
    return best[1] if best else None


def cheapest_cut(
    placer: Placer, gpu: Gpu, profile_name: str, exclude: AbstractSet[str]
) -> Cut | None:
    """The cheapest cut of ``profile_name`` on ``gpu`` and its cost: the fewest compute
    slices destroyed, then the busiest GPU, then the highest start."""
    model = CATALOG.get(gpu.model or "")
    profile = model.profile(profile_name) if model and gpu.mig_enabled else None
    if gpu.uuid in placer.drained or model is None or profile is None:
        return None
    slices = [(d, _memory_slices(model, d)) for d in placer.under(gpu.uuid) if d.kind == "mig"]
    held = [m for d, m in slices if d.uuid in exclude or not placer.is_free(d.uuid)]
    same = sum(1 for d, _ in slices if d.profile == profile.name)
    on = _Gpu(gpu, slices, frozenset[int]().union(*held), same, -placer.busy_slices[gpu.uuid])
    cuts = (_cut(on, model, profile, start) for start in profile.starts)
    return min((c for c in cuts if c is not None), key=lambda c: c[0], default=None)


@dataclass(frozen=True)
class _Gpu:
    """What a cut on one GPU depends on: its slices with their memory slices, the memory
    slices held or excluded, its slices of the profile cut, and minus its busy compute
    slices."""

    gpu: Gpu
    slices: list[tuple[Device, frozenset[int]]]
    blocked: frozenset[int]
    same: int
    busy: int


def _cut(on: _Gpu, model: GpuModel, profile: MigProfile, start: int) -> Cut | None:
    """The cut of ``profile`` at ``start``; None where a held or excluded slice overlaps
    it, or where the GPU would keep as many slices of the profile as it may have."""
    span = _slots(model.key, profile.name, start)
    if span & on.blocked:
        return None
    overlap = [d for d, m in on.slices if span & m]
    if on.same - sum(1 for d in overlap if d.profile == profile.name) >= profile.max_count:
        return None
    cost = (sum(d.compute_slices for d in overlap), on.busy, -start)
    return cost, MigPlan(on.gpu, profile, start, tuple(overlap))


def _memory_slices(model: GpuModel, d: Device) -> frozenset[int]:
    """The memory slices MIG slice ``d`` occupies on a GPU of ``model``."""
    return _slots(model.key, d.profile or "", d.start or 0)


@cache
def _slots(model_key: str, profile_name: str, start: int) -> frozenset[int]:
    """The memory slices a ``profile_name`` slice at ``start`` covers (none for a profile
    the model lacks); asked for every slice of every GPU in each plan, so kept."""
    p = CATALOG[model_key].profile(profile_name)
    return frozenset(p.slots(start)) if p else frozenset()
