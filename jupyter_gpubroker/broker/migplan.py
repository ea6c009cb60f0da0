"""Dynamic MIG's plans: how to cut a new slice of a profile from idle capacity.

When no free slice of a wanted profile exists, a GPU in MIG mode may be re-cut: idle
slices that overlap a valid placement are destroyed and a new one created there. The
plan picks the placement that destroys the least compute, on the busiest GPU, at the
highest start (small profiles at the top of the GPU keep slot 0 free for the large
ones). The placer (``placement.Placer.plan_mig``) asks each GPU's cheapest cut and keeps
it until a device on that GPU changes; ``devices.Devices`` carries a plan out.
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


def cheapest_cut(
    placer: Placer, gpu: Gpu, profile_name: str, exclude: AbstractSet[str]
) -> Cut | None:
    """The cheapest cut of ``profile_name`` on ``gpu`` and its cost: the fewest compute
    slices destroyed, then the busiest GPU, then the highest start. A start is out when
    a held or excluded slice overlaps it, or when the GPU would keep as many slices of
    the profile as it may have."""
    if gpu.uuid in placer.drained:
        return None
    model = CATALOG.get(gpu.model or "")
    profile = model.profile(profile_name) if model and gpu.mig_enabled else None
    if model is None or profile is None:
        return None
    slices = [(d, _memory_slices(model, d)) for d in placer.under(gpu.uuid) if d.kind == "mig"]
    blocked = frozenset[int]().union(
        *(m for d, m in slices if d.uuid in exclude or not placer.is_free(d.uuid))
    )
    same = sum(1 for d, _ in slices if d.profile == profile.name)
    busy = -placer.busy_slices[gpu.uuid]
    best: Cut | None = None
    for start in profile.starts:
        span = _slots(model.key, profile.name, start)
        if span & blocked:
            continue
        overlap = [d for d, m in slices if span & m]
        if same - sum(1 for d in overlap if d.profile == profile.name) >= profile.max_count:
            continue
        cost = (sum(d.compute_slices for d in overlap), busy, -start)
        if best is None or cost < best[0]:
            best = (cost, MigPlan(gpu, profile, start, tuple(overlap)))
    return best


def _memory_slices(model: GpuModel, d: Device) -> frozenset[int]:
    """The memory slices MIG slice ``d`` occupies on a GPU of ``model``."""
    return _slots(model.key, d.profile or "", d.start or 0)


@cache
def _slots(model_key: str, profile_name: str, start: int) -> frozenset[int]:
    """The memory slices a ``profile_name`` slice at ``start`` covers (none for a profile
    the model lacks); asked for every slice of every GPU in each plan, so kept."""
    p = CATALOG[model_key].profile(profile_name)
    return frozenset(p.slots(start)) if p else frozenset()
