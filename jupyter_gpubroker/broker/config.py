"""The broker's own knobs (the policy has its own: ``policy.Policy``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..wire.errors import InvalidRequest
from ..wire.sizes import MAX_DURATION_S
from .models import JobClass


@dataclass
class BrokerConfig:
    """Knobs of the broker itself (the policy has its own)."""

    lease_ttl_s: float = 120.0
    """A lease whose holder stops renewing for this long expires."""
    request_ttl_s: float | None = None
    """A queued request whose holder stops renewing for this long expires (None: the
    lease TTL)."""
    vacate_timeout_s: float = 60.0
    """How long an ended lease's devices wait for its processes to exit before they are
    drained (only with a process probe)."""
    dynamic_mig: bool = False
    """Re-cut idle MIG GPUs to fit waiting profiles (needs a partitioner)."""
    default_share: float = 1.0
    default_duration_s: dict[str, float] = field(
        default_factory=lambda: {"interactive": 2 * 3600.0, "batch": 4 * 3600.0}
    )
    """Expected hold time before any history exists, per job class."""

    def __post_init__(self) -> None:
        if not 1 <= self.lease_ttl_s <= MAX_DURATION_S:
            raise InvalidRequest("lease_ttl_s must be between 1 s and a year")
        if self.request_ttl_s is not None and not 1 <= self.request_ttl_s <= MAX_DURATION_S:
            raise InvalidRequest("request_ttl_s must be between 1 s and a year")
        if not 0 <= self.vacate_timeout_s <= MAX_DURATION_S:
            raise InvalidRequest("vacate_timeout_s must be between 0 and a year")
        if not self.default_share > 0:
            raise InvalidRequest("default_share must be positive")
        for k, v in self.default_duration_s.items():
            if k not in {c.value for c in JobClass} or not 0 < v <= MAX_DURATION_S:
                raise InvalidRequest(f"bad default duration {k!r}: {v!r}")
