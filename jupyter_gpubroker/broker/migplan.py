"""Dynamic MIG's plans: how to cut a new slice of a profile from idle capacity.

When no free slice of a wanted profile exists, a GPU in MIG mode may be re-cut: idle
slices that overlap a valid placement are destroyed and a new one created there. The
plan picks the placement that destroys the least compute, on the busiest GPU, at the
highest start (small profiles at the top of the GPU keep slot 0 free for the large
ones). The placer (``placement.Placer.plan_mig``) asks; ``devices.Devices`` carries a
plan out.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass
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


def plan(
    placer: Placer, profile_name: str, exclude: AbstractSet[str] = frozenset()
) -> MigPlan | None:
    """How to cut a new ``profile_name`` slice from idle capacity, if any GPU can."""
    best: tuple[tuple[int, int, int], MigPlan] | None = None
    for gpu in placer.gpus.values():
        found = _cheapest_cut(placer, gpu, profile_name, exclude)
        if found is not None and (best is None or found[0] < best[0]):
            best = found
    return best[1] if best else None


def _cheapest_cut(
    placer: Placer, gpu: Gpu, profile_name: str, exclude: AbstractSet[str]
) -> tuple[tuple[int, int, int], MigPlan] | None:
    """The cheapest cut of ``profile_name`` on ``gpu`` and its cost: the fewest compute
    slices destroyed, then the busiest GPU, then the highest start."""
    if gpu.uuid in placer.drained:
        return None
    model = CATALOG.get(gpu.model or "")
    profile = model.profile(profile_name) if model and gpu.mig_enabled else None
    if model is None or profile is None:
        return None
    best: tuple[tuple[int, int, int], MigPlan] | None = None
    slices = [d for d in placer.under(gpu.uuid) if d.kind == "mig"]
    for start in profile.starts:
        overlap = _idle_overlap(placer, model, profile, start, slices, exclude)
        if overlap is None:
            continue
        cost = (sum(d.compute_slices for d in overlap), -placer.busy_slices[gpu.uuid], -start)
        if best is None or cost < best[0]:
            best = (cost, MigPlan(gpu, profile, start, tuple(overlap)))
    return best


def _idle_overlap(
    placer: Placer,
    model: GpuModel,
    profile: MigProfile,
    start: int,
    slices: list[Device],
    exclude: AbstractSet[str],
) -> list[Device] | None:
    """The slices a new ``profile`` slice at ``start`` would replace; None when one of
    them is held or excluded, or the GPU has as many of ``profile`` as it may."""
    span = set(profile.slots(start))
    overlap = [d for d in slices if span & _memory_slices(model, d)]
    if any(not placer.is_free(d.uuid) or d.uuid in exclude for d in overlap):
        return None
    kept = sum(1 for d in slices if d.profile == profile.name and d not in overlap)
    return None if kept >= profile.max_count else overlap


def _memory_slices(model: GpuModel, d: Device) -> set[int]:
    """The memory slices MIG slice ``d`` occupies on a GPU of ``model``."""
    p = model.profile(d.profile or "")
    return set(p.slots(d.start or 0)) if p else set()
