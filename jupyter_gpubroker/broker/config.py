"""The broker's own knobs (the policy has its own: ``policy.Policy``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..wire.errors import InvalidRequest
from ..wire.sizes import MAX_DURATION_S, number
from .limitrules import LimitKey, LimitRule, check_key
from .models import JobClass
from .sharing import Sharing

MAX_EXTENSIONS = 1000
"""The most extensions a class's leases may be allowed: more is "no bound" in disguise."""
ASSUMED_HOLD_S = {"interactive": 2 * 3600.0, "batch": 4 * 3600.0}
"""The hold the scheduler assumes per job class before any history, where the admin
stated no typical hold."""


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
    typical_hold_s: dict[str, float] = field(default_factory=dict)
    """How long a hold of each job class typically lasts, as the deployment's admin states
    it: the expected hold before any history exists, and a basis for start estimates on
    day one. A class not named: the scheduler assumes ``ASSUMED_HOLD_S``, and start
    estimates do not use it (nobody stated it)."""
    default_limit_s: dict[str, float] = field(default_factory=dict)
    """Time limit of a request that states none, per job class (absent: no limit)."""
    max_limit_s: dict[str, float] = field(default_factory=dict)
    """The longest time limit a request may state, per job class (absent: a year)."""
    default_limit_by_profile_s: dict[str, float] = field(default_factory=dict)
    """Time limit of a request that states none, per profile ("1g.10gb", "gpus=2")."""
    max_limit_by_profile_s: dict[str, float] = field(default_factory=dict)
    """The longest time limit a request may state, per profile."""
    default_limit_by_group_s: dict[str, float] = field(default_factory=dict)
    """Time limit of a request that states none, per group."""
    max_limit_by_group_s: dict[str, float] = field(default_factory=dict)
    """The longest time limit a request may state, per group (``limitrules`` says which
    default and maximum of a class, profile and group a request gets)."""
    limit_required: bool = False
    """Refuse a request with no time limit (stated or a class default)."""
    limit_warning_s: float = 600.0
    """How long before its time limit ends the holder is warned."""
    limit_grace_s: float = 60.0
    """How long after its time limit ends a lease is reclaimed."""
    max_extensions: dict[str, int] = field(default_factory=dict)
    """How often a lease's time limit may be extended, per job class (absent: 3)."""
    sharing: Sharing = field(default_factory=Sharing)
    """Which GPUs are lent whole, which shared, and when (``sharing``)."""
    promise_stretch: float = 2.0
    """A waiting request is promised a start this many times as far off as its worst
    case (at least 1): room for the policy to let others go first while every promise
    still holds (``limits.Promises``)."""

    def expected_hold_s(self, job_class: str) -> float:
        """A hold of ``job_class`` before any history: the stated typical hold, else the
        assumed one."""
        return self.typical_hold_s.get(job_class, ASSUMED_HOLD_S[job_class])

    def __post_init__(self) -> None:
        if not 1 <= self.lease_ttl_s <= MAX_DURATION_S:
            raise InvalidRequest("lease_ttl_s must be between 1 s and a year")
        if self.request_ttl_s is not None and not 1 <= self.request_ttl_s <= MAX_DURATION_S:
            raise InvalidRequest("request_ttl_s must be between 1 s and a year")
        if not 0 <= self.vacate_timeout_s <= MAX_DURATION_S:
            raise InvalidRequest("vacate_timeout_s must be between 0 and a year")
        if not self.default_share > 0:
            raise InvalidRequest("default_share must be positive")
        for k, v in self.typical_hold_s.items():
            _check_class(k, "the typical hold")
            _check_seconds(v, f"the typical hold of class {k!r}", low=1.0)
        self.limit_rules()
        _check_seconds(self.limit_warning_s, "limit_warning_s")
        _check_seconds(self.limit_grace_s, "limit_grace_s")
        if (
            isinstance(self.promise_stretch, bool)
            or not isinstance(self.promise_stretch, (int, float))
            or not (1 <= self.promise_stretch <= 100)
        ):
            raise InvalidRequest(
                f"promise_stretch must be between 1 and 100, not {self.promise_stretch!r}"
            )
        for k, n in self.max_extensions.items():
            _check_class(k, "max_extensions")
            number(n, f"max_extensions of class {k!r}", 0, MAX_EXTENSIONS, whole=True)

    def limit_rules(self) -> dict[LimitKey, LimitRule]:
        """The configured time-limit rules, keyed as ``limitrules`` keeps them; a clear
        ``InvalidRequest`` for a bad one."""
        rules: dict[LimitKey, LimitRule] = {}
        for kind, defaults, maxima in (
            ("class", self.default_limit_s, self.max_limit_s),
            ("profile", self.default_limit_by_profile_s, self.max_limit_by_profile_s),
            ("group", self.default_limit_by_group_s, self.max_limit_by_group_s),
        ):
            given = _by_key(kind, defaults), _by_key(kind, maxima)
            for key in {**given[0], **given[1]}:
                try:
                    rules[key] = LimitRule(given[0].get(key), given[1].get(key))
                except InvalidRequest as e:
                    raise InvalidRequest(f"{kind} {key[1]!r}: {e.message}") from None
        return rules


def _by_key(kind: str, values: dict[str, float]) -> dict[LimitKey, float]:
    """``values`` keyed as ``limitrules`` keeps rules (a profile in its short form)."""
    found: dict[LimitKey, float] = {}
    for name, v in values.items():
        key = check_key(kind, name)
        if key in found:
            raise InvalidRequest(f"the time limits of {kind} {key[1]!r} are set twice")
        found[key] = v
    return found


def _check_class(name: str, what: str) -> None:
    if name not in {c.value for c in JobClass}:
        raise InvalidRequest(f"{what} names {name!r}: job classes are 'interactive' and 'batch'")


def _check_seconds(v: object, what: str, low: float = 0.0) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not low <= v <= MAX_DURATION_S:
        raise InvalidRequest(f"{what} must be between {low:g} s and a year, not {v!r}")
