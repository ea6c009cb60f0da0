"""Number settings (``c.GPUBroker.*``, the spawner's, the kernel provisioner's, ...) held
to the broker's one check of numbers (``sizes.number``): a value out of its range, an
integer too large for a float, NaN, an infinity, text or a list is a config error in one
sentence that names the setting, where traitlets' own ``Float`` would take NaN and
infinities and fail on a huge integer with a bare ``OverflowError``.

For the settings of every front, so traitlets is imported here and never by the core.
"""

from __future__ import annotations

from typing import Any

from traitlets import Float, HasTraits, Int, TraitError, TraitType

from .errors import InvalidRequest
from .sizes import DURATION_WORDS, number, said, seconds_between


class _Checked:
    """``sizes.number``'s check of a setting, refused as a ``TraitError`` naming it."""

    whole = False
    allow_none: bool
    name: str

    def __init__(self, default_value: Any, lo: float, hi: float, words: str = "", **kwargs: Any):
        super().__init__(default_value, **kwargs)  # type: ignore[call-arg]
        self.lo, self.hi, self.words = lo, hi, words

    def validate(self, obj: HasTraits, value: Any) -> Any:
        if value is None and self.allow_none:
            return None
        what = f"{type(obj).__name__}.{self.name}"
        try:
            return number(value, what, self.lo, self.hi, whole=self.whole, words=self.words)
        except InvalidRequest as e:
            raise TraitError(e.message) from None

    def info(self) -> str:
        kind = "a whole number" if self.whole else "a number"
        return self.words or f"{kind} from {self.lo:g} to {self.hi:g}"


class Number(_Checked, Float):  # type: ignore[misc, type-arg]
    """A float setting from ``lo`` to ``hi`` (0 or at least ``sizes.RESOLUTION``), said
    as ``words`` (default: the range)."""


class Whole(_Checked, Int):  # type: ignore[misc, type-arg]
    """A whole-number setting from ``lo`` to ``hi``."""

    whole = True


class Seconds(Number):
    """A duration setting in seconds from ``lo`` to ``hi`` ("seconds, at least 1 and at
    most a year"); 0, where ``lo`` is 0, usually means "off"."""

    def __init__(self, default_value: Any, lo: float, hi: float, **kwargs: Any):
        super().__init__(default_value, lo, hi, seconds_between(lo, hi), **kwargs)


class Duration(TraitType):  # type: ignore[type-arg]
    """A duration setting as a number of seconds or words like "2h", kept as given: the
    class's own ``@validate`` reads it (``sizes.parse_duration``) and says what is wrong;
    this only refuses what is neither (a list, a bool), as ``Union([Float(), Unicode()])``
    would, but takes an integer too large for a float, which that one fails on."""

    info_text = DURATION_WORDS

    def validate(self, obj: HasTraits, value: Any) -> Any:
        if isinstance(value, str) or (
            isinstance(value, (int, float)) and not isinstance(value, bool)
        ):
            return value
        raise TraitError(
            f"{type(obj).__name__}.{self.name} must be {DURATION_WORDS}, not {said(value)}"
        )
