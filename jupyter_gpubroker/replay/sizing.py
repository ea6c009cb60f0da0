"""How a trace's demand becomes a broker request on the replay's inventory.

A job asks for whole GPUs or a share of one GPU; what that means depends on
the machine it is replayed on:

- a share below 1, on an inventory with MIG GPUs: the smallest profile of the
  *ladder* whose share of the GPU (compute slices / 7) covers it. The ladder
  is one profile per compute size, the one with the least memory, without the
  media-engine variants: on an H100-80GB 1g.10gb, 2g.20gb, 3g.40gb, 4g.40gb,
  7g.80gb, so 0.05-0.14 -> 1g, -0.28 -> 2g, -0.42 -> 3g, -0.57 -> 4g, above -> 7g;
  on an inventory without MIG GPUs: one whole GPU;
- N whole GPUs: N GPUs with MIG off when the inventory has that many; one whole
  GPU on an inventory that has only MIG GPUs: the full-GPU profile (7g); more
  than one: nothing (a MIG slice is one device: the replay skips and counts it).

With GPUs of several models in MIG mode, the first one's ladder is used.
"""

from __future__ import annotations

from ..broker.models import Inventory
from ..wire.profiles import CATALOG, GpuModel, MigProfile
from ..wire.sizes import Size

_EPS = 1e-9


def ladder(model: GpuModel) -> tuple[MigProfile, ...]:
    """One profile per compute size, the one with the least memory, smallest first."""
    best: dict[int, MigProfile] = {}
    for p in model.profiles:
        if "+" in p.name:
            continue
        if p.compute_slices not in best or p.size < best[p.compute_slices].size:
            best[p.compute_slices] = p
    return tuple(best[c] for c in sorted(best))


class Sizer:
    """Maps a job's GPUs (whole or a share) to a :class:`Size` this inventory can host."""

    def __init__(self, inventory: Inventory) -> None:
        self.whole_gpus = sum(1 for d in inventory.devices if d.kind == "gpu")
        models = [g.model for g in inventory.gpus if g.mig_enabled and g.model in CATALOG]
        self.ladder = ladder(CATALOG[models[0]]) if models else ()
        self._eq = {p.name: p.gpu_equivalents for p in self.ladder}

    def size(self, gpus: float) -> Size | None:
        """The request for ``gpus``, or None when no device here could ever host it."""
        if gpus < 1:
            if self.ladder:
                fit = next(p for p in self.ladder if p.gpu_equivalents >= gpus - _EPS)
                return Size(profile=fit.name)
            return Size(gpus=1) if self.whole_gpus else None
        n = int(gpus)
        if self.whole_gpus >= n:
            return Size(gpus=n)
        if n == 1 and self.ladder:
            return Size(profile=self.ladder[-1].name)
        return None

    def gpu_equivalents(self, size: Size) -> float:
        """What ``size`` holds once granted, in GPU-equivalents."""
        return self._eq[size.profile] if size.profile else float(size.gpus or 0)
