"""What the broker's watch holds a share to, where nothing else does: the reclaimer's
verdict on a share whose kernel goes past its share.

- ``watched`` (time-slicing): nothing holds the share, so its processes' memory (NVML's
  per-process use) over the share is the fault.
- ``mps``: MPS holds its clients only. A process of the share's kernel that NVML lists
  without an MPS compute context (it changed its environment before CUDA started) is
  held to nothing; so is memory past the share, however it got there.
- ``driver``: the driver's limits hold every process of the share; never judged.

Either fault is warned, then reclaimed ``over_share_grace_s`` later if it still holds,
as an idle lease is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..wire.text import outside_mps, over_share

if TYPE_CHECKING:
    from .models import Lease
    from .reclaim import Observation

JUDGED = ("watched", "mps")
"""The mechanisms whose shares the watch judges."""


def share_fault(lease: Lease, obs: Observation, mechanism: str, label: str) -> str | None:
    """Why ``lease``'s share is past what holds it (its holder reads it); None: it is not,
    or there is no evidence."""
    if not lease.shared or mechanism not in JUDGED:
        return None
    used = obs.memory_used_mib
    if used is not None and used > lease.share_mib:
        return over_share(used, lease.share_mib, label)
    if mechanism == "mps" and obs.outside_mps:
        return outside_mps(label, lease.share_mib)
    return None
