"""The machine a broker serves, as the state file records it (``machines``): each GPU's
catalog model and MIG slices. A replay of the file's history rebuilds that machine, and
what-ifs add GPUs to it or take some away (``replay.whatif``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from .models import Inventory


def machine(inventory: Inventory) -> list[dict[str, Any]]:
    """Per GPU, in index order: ``model`` (the catalog's, else NVML's name) and ``mig``
    (profile -> slices; null with MIG off)."""
    slices: dict[str, Counter[str]] = {g.uuid: Counter() for g in inventory.gpus}
    for d in inventory.devices:
        if d.kind == "mig" and d.profile:
            slices[d.gpu_uuid][d.profile] += 1
    return [
        {
            "model": g.model or g.name,
            "mig": dict(sorted(slices[g.uuid].items())) if g.mig_enabled else None,
        }
        for g in sorted(inventory.gpus, key=lambda g: (g.node, g.index))
    ]
