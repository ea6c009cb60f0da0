"""How long holds last (``c.GPUBroker.*``): the time limits (each class's default and
longest limit, whether a limit is required, the warning, the grace and how often a lease
may be extended), which the core (``broker.limits``) enforces, and the typical hold an
admin states, which start estimates use before there is any history."""

from __future__ import annotations

from typing import Any

from traitlets import Bool, Dict, HasTraits, Int, TraitError, Unicode, Union, validate
from traitlets import Float as FloatTrait

from ..broker.config import BrokerConfig
from ..wire.errors import InvalidRequest
from ..wire.sizes import parse_duration

_FIELDS = {
    "default_time_limit": "default_limit_s",
    "max_time_limit": "max_limit_s",
    "time_limit_required": "limit_required",
    "time_limit_warning": "limit_warning_s",
    "time_limit_grace": "limit_grace_s",
    "max_extensions": "max_extensions",
    "typical_hold": "typical_hold_s",
}
"""Each trait and the ``BrokerConfig`` field it sets."""


def _duration_trait(default: float, help: str) -> Union:
    return Union([FloatTrait(), Unicode()], default_value=default, help=help).tag(config=True)


class LimitSettings(HasTraits):
    """Time limits as Slurm's ``--time``: stated by the request, bounded per job class."""

    default_time_limit = Dict(
        key_trait=Unicode(),
        value_trait=Union([FloatTrait(), Unicode()]),
        help="The time limit of a request that states none, per job class, in seconds or "
        "words like '2h', e.g. {'interactive': '4h'}; a class not named has none.",
    ).tag(config=True)
    max_time_limit = Dict(
        key_trait=Unicode(),
        value_trait=Union([FloatTrait(), Unicode()]),
        help="The longest time limit a request may state, per job class, e.g. "
        "{'interactive': '8h', 'batch': '2d'}; a class not named: a year.",
    ).tag(config=True)
    time_limit_required = Bool(
        False, help="Refuse a request that states no time limit and whose class has no default."
    ).tag(config=True)
    time_limit_warning = _duration_trait(
        600.0, "How long before its time limit ends the holder is warned (seconds or '10min')."
    )
    time_limit_grace = _duration_trait(
        60.0, "How long after its time limit ends the lease is reclaimed (seconds or '1min')."
    )
    max_extensions = Dict(
        key_trait=Unicode(),
        value_trait=Int(),
        help="How often a lease's time limit may be extended, per job class, e.g. "
        "{'interactive': 2}; a class not named: 3.",
    ).tag(config=True)

    typical_hold = Dict(
        key_trait=Unicode(),
        value_trait=Union([FloatTrait(), Unicode()]),
        help="How long a GPU session of each job class typically lasts, e.g. "
        "{'interactive': '2h'}: start estimates rest on it until the broker has seen "
        "sessions end (a fresh deployment's ETAs are otherwise unknown), and the "
        "scheduler expects it; a class not named: no estimate from it.",
    ).tag(config=True)

    @validate(*_FIELDS)
    def _limit_setting(self, proposal: dict[str, Any]) -> Any:
        name, value = proposal["trait"].name, proposal["value"]
        try:
            if name in ("default_time_limit", "max_time_limit", "typical_hold"):
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
            "limit_required": self.time_limit_required,
            "limit_warning_s": float(self.time_limit_warning),
            "limit_grace_s": float(self.time_limit_grace),
            "max_extensions": dict(self.max_extensions),
            "typical_hold_s": dict(self.typical_hold),
        }
