"""How long holds last (``c.GPUBroker.*``): the time limits (the default and longest
limit of each job class, profile and group, whether a limit is required, the warning, the
grace and how often a lease may be extended), which the core (``broker.limits``,
``broker.limitrules``) enforces, and the typical hold an admin states, which start
estimates use before there is any history."""

from __future__ import annotations

from typing import Any

from traitlets import Bool, Dict, HasTraits, TraitError, Unicode, validate

from ..broker.config import BrokerConfig
from ..wire.errors import InvalidRequest
from ..wire.sizes import parse_duration
from ..wire.traits import Duration, Number

_FIELDS = {
    "default_time_limit": "default_limit_s",
    "max_time_limit": "max_limit_s",
    "default_time_limit_by_profile": "default_limit_by_profile_s",
    "max_time_limit_by_profile": "max_limit_by_profile_s",
    "default_time_limit_by_group": "default_limit_by_group_s",
    "max_time_limit_by_group": "max_limit_by_group_s",
    "time_limit_required": "limit_required",
    "time_limit_warning": "limit_warning_s",
    "time_limit_grace": "limit_grace_s",
    "max_extensions": "max_extensions",
    "promise_stretch": "promise_stretch",
    "typical_hold": "typical_hold_s",
}
"""Each trait and the ``BrokerConfig`` field it sets."""


DURATION_MAPS = {
    name for name in _FIELDS if name.startswith(("default_time_limit", "max_time_limit"))
} | {"typical_hold"}
"""The traits that map names to durations."""
PRECEDENCE = (
    "A request gets the tightest maximum of its class's, its profile's and its groups', "
    "and the default of the most specific that has one (group, then profile, then class), "
    "never above that maximum. A rule an admin sets at run time (PUT limits, the hub's "
    "admin page) replaces the one configured here for its class, profile or group."
)


def _duration_trait(default: float, help: str) -> Duration:
    return Duration(default_value=default, help=help).tag(config=True)


def _durations(help: str) -> Dict:
    return Dict(key_trait=Unicode(), help=help).tag(config=True)  # each value: _limit_setting


class LimitSettings(HasTraits):
    """Time limits as Slurm's ``--time``: stated by the request, bounded per job class, profile
    and group."""

    default_time_limit = _durations(
        "The time limit of a request that states none, per job class, in seconds or "
        "words like '2h', e.g. {'interactive': '4h'}; a class not named has none. " + PRECEDENCE
    )
    max_time_limit = _durations(
        "The longest time limit a request may state (or reach by extending), per job "
        "class, e.g. {'interactive': '8h', 'batch': '2d'}; a class not named: a year. " + PRECEDENCE
    )
    default_time_limit_by_profile = _durations(
        "The time limit of a request that states none, per size as a request names it: a "
        "MIG profile or whole GPUs, e.g. {'1g.10gb': '2h', 'gpus=8': '1h'}. " + PRECEDENCE
    )
    max_time_limit_by_profile = _durations(
        "The longest time limit a request may state, per MIG profile or number of whole "
        "GPUs, e.g. {'7g.80gb': '4h', 'gpus=8': '12h'}. " + PRECEDENCE
    )
    default_time_limit_by_group = _durations(
        "The time limit of a request that states none, per group of its user, e.g. "
        "{'students': '1h'} (of several groups: the shortest). " + PRECEDENCE
    )
    max_time_limit_by_group = _durations(
        "The longest time limit a request may state, per group of its user, e.g. "
        "{'students': '2h'}. " + PRECEDENCE
    )
    time_limit_required = Bool(
        False,
        help="Refuse a request that states no time limit and gets no default (the admin "
        "page may also require one per class, profile or group).",
    ).tag(config=True)
    time_limit_warning = _duration_trait(
        600.0, "How long before its time limit ends the holder is warned (seconds or '10min')."
    )
    time_limit_grace = _duration_trait(
        60.0, "How long after its time limit ends the lease is reclaimed (seconds or '1min')."
    )
    max_extensions = Dict(
        key_trait=Unicode(),
        help="How often a lease's time limit may be extended, per job class, e.g. "
        "{'interactive': 2}; a class not named: 3.",
    ).tag(config=True)

    promise_stretch = Number(
        2.0,
        1.0,
        100.0,
        help="Where every lease ahead of a waiting request has a time limit, the broker "
        "promises it a start ('starts by 14:30 at the latest') and keeps the promise: "
        "this many times as far off as its worst case (1 to 100). 1 promises the earliest "
        "but lets nobody go ahead of a promised request; 2, the default, leaves the "
        "fair-share order room (see benchmarks/README.md).",
    ).tag(config=True)

    typical_hold = _durations(
        "How long a GPU session of each job class typically lasts, e.g. "
        "{'interactive': '2h'}: start estimates rest on it until the broker has seen "
        "sessions end (a fresh deployment's ETAs are otherwise unknown), and the "
        "scheduler expects it; a class not named: no estimate from it."
    )

    @validate(*_FIELDS)
    def _limit_setting(self, proposal: dict[str, Any]) -> Any:
        name, value = proposal["trait"].name, proposal["value"]
        try:
            if name in DURATION_MAPS:
                value = {k: parse_duration(v, f"{name}[{k!r}]") for k, v in value.items()}
            elif name in ("time_limit_warning", "time_limit_grace"):
                value = 0.0 if value in (0, "0") else parse_duration(value, name)
            BrokerConfig(**{_FIELDS[name]: value})
        except InvalidRequest as e:
            raise TraitError(f"GPUBroker.{name}: {e.message}") from None
        return value

    def limit_fields(self) -> dict[str, Any]:
        """The ``BrokerConfig`` fields these settings set."""
        return {
            "default_limit_s": dict(self.default_time_limit),
            "max_limit_s": dict(self.max_time_limit),
            "default_limit_by_profile_s": dict(self.default_time_limit_by_profile),
            "max_limit_by_profile_s": dict(self.max_time_limit_by_profile),
            "default_limit_by_group_s": dict(self.default_time_limit_by_group),
            "max_limit_by_group_s": dict(self.max_time_limit_by_group),
            "limit_required": self.time_limit_required,
            "limit_warning_s": float(self.time_limit_warning),
            "limit_grace_s": float(self.time_limit_grace),
            "max_extensions": dict(self.max_extensions),
            "promise_stretch": float(self.promise_stretch),
            "typical_hold_s": dict(self.typical_hold),
        }
