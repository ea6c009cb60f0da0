"""Sizes and amounts as the API takes them: what a request asks for (``Size``), the
bounds of every number (hold times, quotas), and the words for them in its errors.
The core checks its input with these and every front (the magic, the spawner's form,
the CLI) with the same ones, so a front refuses what the broker would, in its words.
"""

from __future__ import annotations

import argparse
import math
import re
import reprlib
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from functools import cached_property
from typing import Any

from .errors import InvalidRequest, UnknownProfile
from .profiles import ALL_PROFILE_NAMES

RESOLUTION = 1e-3
"""The finest non-zero amount the broker takes, in every unit (GPU-equivalents, GB,
GPU-hours, shares, seconds): a smaller one, a subnormal like 5e-324 above all, is a slip
or a probe, never a size or a limit anyone means (a 1e-320 GPU quota refuses everything)."""
MAX_GPUS = 1024
MAX_MEMORY_GB = 4096.0
MIB_PER_GB = 1e9 / 2**20
"""A GB is 10^9 bytes, as NVIDIA names its cards and MIG profiles: every device NVIDIA
calls N GB has at least N of them (a 1g.10gb slice of an H100: 9984 MiB, 10.4 GB), so a
request for ``min_memory_gb`` 20 takes a 3g.20gb slice. NVML counts MiB (2^20 bytes)."""


def gb_to_mib(gb: float) -> float:
    """``min_memory_gb`` in the MiB NVML reports devices' memory in."""
    return gb * MIB_PER_GB


def mib_to_gb(mib: float) -> float:
    """A device's memory (NVML's MiB) in GB."""
    return mib / MIB_PER_GB


MEMORY_WORDS = "a size in GB such as 20GB (or, said so, 18.6GiB)"
"""What ``parse_memory`` takes, in words."""
_MEMORY = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(gb|gib)?", re.IGNORECASE)


def parse_memory(text: str) -> float:
    """GB from what a person types: "20GB", "20 GB", "20" or, said so, "18.6GiB"
    (converted exactly); a clear ``InvalidRequest`` otherwise."""
    match = _MEMORY.fullmatch(text.strip())
    if match is None:
        raise InvalidRequest(f"the memory must be {MEMORY_WORDS}, not {text.strip()!r}")
    number, unit = float(match.group(1)), (match.group(2) or "gb").lower()
    return number * 2**30 / 1e9 if unit == "gib" else number


MAX_DURATION_S = 366 * 86400.0
DURATIONS = f"seconds, at least {RESOLUTION:g} and at most a year"
"""What a hold time takes (``hold_seconds``: an expected duration, a limit, an
extension), in words."""
QUOTA_BOUNDS = {
    "share": (1e-3, 1e6),
    "max_gpus": (0.0, 1e6),
    "gpu_hours": (0.0, 1e9),
    "period_s": (60.0, 10 * 366 * 86400.0),
}
"""Each quota field's inclusive range (a non-zero value is at least ``RESOLUTION``):
a share outside it would make fair-share factors divide by zero, a period shorter than a
minute would make budget periods overflow."""


def finite_number(value: object) -> bool:
    """A JSON number that fits a float: not a bool, NaN, an infinity or a huge integer."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer beyond the largest float
        return False


def quantity(value: object, lo: float, hi: float) -> bool:
    """A JSON number fit to be an amount from ``lo`` to ``hi``: finite, and 0 or at least
    ``RESOLUTION``."""
    return (
        finite_number(value)
        and lo <= value <= hi  # type: ignore[operator]
        and (value == 0 or abs(value) >= RESOLUTION)  # type: ignore[arg-type]
    )


def amounts(lo: float, hi: float) -> str:
    """The words for what ``quantity(value, lo, hi)`` takes: "0 or a number from 0.001 to 10"."""
    lo_text = f"0 or a number from {RESOLUTION:g}" if lo == 0 else f"a number from {lo:.15g}"
    return f"{lo_text} to {hi:.15g}"


def seconds_between(lo: float, hi: float) -> str:
    """The words for a number of seconds from ``lo`` to ``hi``: "seconds, at least 1 and at
    most a year" (a bound of whole years, days, hours or minutes said so)."""
    zero = f"0 or at least {RESOLUTION:g}" if lo == 0 else f"at least {lo:g}"
    return f"seconds, {zero} and at most {_span_words(hi)}"


def _span_words(seconds: float) -> str:
    """A bound in seconds as a person says it: "a year", "10 years", "an hour", else "90"."""
    for size, one, many in _SPANS:
        n = seconds / size
        if n == int(n) and n >= 1:
            return one if n == 1 else f"{n:g} {many}"
    return f"{seconds:g}"


_SPANS = (
    (MAX_DURATION_S, "a year", "years"),
    (86400.0, "a day", "days"),
    (3600.0, "an hour", "hours"),
    (60.0, "a minute", "minutes"),
)


def said(value: object) -> str:
    """``value`` as a refusal quotes it: a number as a person writes it (``1e+400``, not
    its 400 digits, also inside a list), anything else as Python shows it, cut short."""
    return _SAID.repr(value)


class _Said(reprlib.Repr):
    """``reprlib``'s short forms, with a number of more than 15 digits shortened: an
    integer in scientific notation, a float to 6 significant digits, a run of digits in
    text to its ends ("922337...775808")."""

    def repr_str(self, x: str, level: int) -> str:
        shown = super().repr_str(x, level)
        return _LONG_DIGITS.sub(lambda m: f"{m[0][:6]}...{m[0][-6:]}", shown)

    def repr_int(self, x: int, level: int) -> str:
        return str(x) if abs(x) < 10**15 else _scientific(Decimal(x))

    def repr_float(self, x: float, level: int) -> str:
        exact = repr(x)
        return exact if sum(c.isdigit() for c in exact) <= 15 else f"{x:.6g}"


_LONG_DIGITS = re.compile(r"\d{16,}")


def _scientific(x: Decimal) -> str:
    """Three significant digits and the exponent: "1e+400", "9.22e+18"."""
    mantissa, _, exponent = f"{x:.2e}".partition("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{exponent}"


_SAID = _Said()
_SAID.maxstring = _SAID.maxother = 30
_SAID.maxlevel = 3


def number(
    value: object, what: str, lo: float, hi: float, *, whole: bool = False, words: str = ""
) -> float:
    """``value`` if it is a JSON number from ``lo`` to ``hi`` (``whole``: an integer; else
    0 or at least ``RESOLUTION``, the finest amount anyone means), as a float (an int if
    ``whole``); otherwise an ``InvalidRequest`` in one sentence: "{what} must be {words},
    not {value}" (``words``: by default the range, as ``amounts`` says it). The one check
    of every number the broker takes: a request's, a quota's, a time limit's, a setting's."""
    if whole:
        fits = isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi
    else:
        fits = quantity(value, lo, hi)
    if not fits:
        taken = words or (
            f"a whole number from {lo:.15g} to {hi:.15g}" if whole else amounts(lo, hi)
        )
        raise InvalidRequest(f"{what} must be {taken}, not {said(value)}")
    assert isinstance(value, (int, float))
    return int(value) if whole else float(value) + 0.0  # -0.0 is 0


def hold_seconds(value: object, what: str) -> float:
    """A hold time as the API takes it (an expected duration, a time limit, an extension):
    ``number``'s check, from ``RESOLUTION`` to a year, said as ``DURATIONS``."""
    return number(value, what, RESOLUTION, MAX_DURATION_S, words=DURATIONS)


DURATION_WORDS = "a number of seconds or a duration like '90s', '30min', '2h' or '1h30m'"
"""What ``parse_duration`` takes, in words."""
_UNIT_S = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(sec|min|s|m|h|d)", re.IGNORECASE)


def parse_duration(value: object, what: str = "the time limit") -> float:
    """Seconds from a number or words like "2h" or "1h30m" (Slurm's ``--time`` and the
    hosted notebooks' session lengths are said so); a clear ``InvalidRequest`` otherwise."""
    given = value  # as the person wrote it, for the refusal
    if isinstance(value, str):
        text = given = value.strip()
        try:
            value = float(text)
        except ValueError:
            parts = _PART.findall(text)
            if not parts or _PART.sub("", text).strip():
                raise InvalidRequest(f"{what} must be {DURATION_WORDS}, not {said(text)}") from None
            value = sum(float(n) * _UNIT_S[unit.lower()] for n, unit in parts)
    if not quantity(value, RESOLUTION, MAX_DURATION_S) or value == 0:
        if finite_number(value) and value <= 0:  # type: ignore[operator]
            raise InvalidRequest(f"{what} must be more than zero, such as '2h', not {said(given)}")
        if finite_number(value) and value > MAX_DURATION_S:  # type: ignore[operator]
            raise InvalidRequest(f"{what} must be at most a year, not {said(given)}")
        raise InvalidRequest(f"{what} must be {DURATION_WORDS}, up to a year, not {said(given)}")
    return float(value)  # type: ignore[arg-type]


def option(parse: Callable[[str], float]) -> Callable[[str], float]:
    """``parse`` as a command-line option's type: its refusal in argparse's terms."""

    def parsed(text: str) -> float:
        try:
            return parse(text)
        except InvalidRequest as e:
            raise argparse.ArgumentTypeError(e.message) from None

    return parsed


def duration_option(what: str) -> Callable[[str], float]:
    """A duration as a command-line option takes it: ``parse_duration``'s, its refusal
    naming ``what``."""
    return option(lambda text: parse_duration(text, what))


time_limit = duration_option("the time")
"""A time limit: ``--time``, ``%gpu request ... --for``."""
extension = duration_option("the extension")
"""More time on a lease's limit: ``extend --by``, ``%gpu extend``."""
memory_option = option(parse_memory)
"""A memory size: ``--min-memory 20GB`` of ``%gpu request`` and the CLI."""


@dataclass(frozen=True)
class Size:
    """What a request asks for: exactly one of N whole GPUs, a MIG profile, any device
    with at least ``min_memory_gb`` of memory, or ``share_gb`` of one GPU that others
    share too (MIG off: placed by memory beside other shares, ``compute_percent`` the
    most of its compute it may use); whole GPUs may be of one ``model`` (a suspended
    kernel's resume: CUDA restores its memory only onto the same chip)."""

    gpus: int | None = None
    profile: str | None = None
    min_memory_gb: float | None = None
    model: str | None = None
    """Whole GPUs of this model only, as ``GET devices`` names it (``H100-80GB``)."""
    share_gb: float | None = None
    """This much memory of a GPU shared with other requests (never a MIG slice)."""
    compute_percent: int | None = None
    """With ``share_gb``: the most of the GPU's compute the share may use, in percent (a
    cap, as MPS's active thread percentage is, not a reservation); None: no cap."""

    def __post_init__(self) -> None:
        self._check_fields_given()
        self._check_values()
        self._check_model()

    def _check_fields_given(self) -> None:
        """Which fields a request names together: exactly one size, and a compute cap
        only with a share."""
        if self.share_gb is not None and self.profile is not None:
            raise InvalidRequest(
                "a MIG slice is never shared: ask for the slice itself, or for part of a "
                "GPU without MIG"
            )
        if self.compute_percent is not None and self.share_gb is None:
            raise InvalidRequest("a compute share goes with a share of a GPU's memory only")
        given = [
            f
            for f in ("gpus", "profile", "min_memory_gb", "share_gb")
            if getattr(self, f) is not None
        ]
        if len(given) != 1:
            raise InvalidRequest(
                "a request asks for exactly one of 'gpus', 'profile', 'min_memory_gb' or "
                "'share_gb'" + (f" (got {', '.join(given)})" if given else "")
            )

    def _check_values(self) -> None:
        """Each size field given is of its type and within its bounds."""
        if self.gpus is not None:
            number(self.gpus, "'gpus'", 1, MAX_GPUS, whole=True)
        if self.profile is not None and not isinstance(self.profile, str):
            raise InvalidRequest(f"'profile' must be a MIG profile name, not {self.profile!r}")
        if self.profile is not None and self.profile not in ALL_PROFILE_NAMES:
            raise UnknownProfile(
                f"unknown MIG profile {self.profile!r}; known profiles: "
                + ", ".join(sorted(ALL_PROFILE_NAMES))
            )
        if self.min_memory_gb is not None:
            number(self.min_memory_gb, "'min_memory_gb'", RESOLUTION, MAX_MEMORY_GB)
        if self.share_gb is not None:
            number(self.share_gb, "a share's memory", RESOLUTION, MAX_MEMORY_GB, words=_GB)
        if self.compute_percent is not None:
            number(self.compute_percent, "the compute share", 1, 100, whole=True, words=_PERCENT)

    def _check_model(self) -> None:
        """A model names whole GPUs only, in the spelling ``GET devices`` uses."""
        if self.model is None:
            return
        if self.gpus is None:
            raise InvalidRequest("'model' goes with 'gpus' only: it picks whole GPUs")
        if not isinstance(self.model, str) or not _MODEL.fullmatch(self.model):
            raise InvalidRequest(
                f"'model' must be a GPU model as GET devices names it (H100-80GB), "
                f"not {self.model!r}"
            )

    @property
    def shared(self) -> bool:
        """Whether it asks for part of a shared GPU."""
        return self.share_gb is not None

    @cached_property
    def key(self) -> str:
        """A short stable text form, also the queue's shape key: ``gpus=2``
        (``gpus=2@H100-80GB``), ``profile=1g.10gb``, ``min_memory_gb=20`` or
        ``share_gb=8`` (``share_gb=8,compute_percent=50``)."""
        if self.gpus is not None:
            return f"gpus={self.gpus}" + (f"@{self.model}" if self.model else "")
        if self.profile is not None:
            return f"profile={self.profile}"
        if self.share_gb is not None:
            cap = "" if self.compute_percent is None else f",compute_percent={self.compute_percent}"
            return f"share_gb={_exact(self.share_gb)}{cap}"
        return f"min_memory_gb={_exact(float(self.min_memory_gb or 0))}"

    @classmethod
    def parse(cls, text: str) -> Size:
        """Parse the short form a person types: ``2`` or ``gpus=2`` (``2@H100-80GB``),
        ``1g.10gb``, ``20GB`` (``20GiB``) or ``min_memory_gb=20`` (a device with at least 20 GB),
        ``share=8GB`` or ``share_gb=8`` (8 GB of a shared GPU; ``share=8GB,compute=50``
        with at most half its compute)."""
        t = text.strip()
        if "=" in t:
            fields = dict(_field(part, text) for part in t.split(","))
            shared = {k: fields.pop(k) for k in _SHARE_KEYS if k in fields}
            if shared:
                return cls._share(shared, fields, text)
            if len(fields) != 1:
                raise InvalidRequest(f"name one size, not {len(fields)}, in {text!r}")
            k, v = next(iter(fields.items()))
            if k == "gpus":
                return cls._gpus(v)
            if k == "profile":
                return cls(profile=v)
            if k == "min_memory_gb":
                return cls(min_memory_gb=_float(v))
            raise InvalidRequest(f"unknown size field {k!r} in {text!r}")
        if t.partition("@")[0].isdigit():
            return cls._gpus(t)
        if _MEMORY.fullmatch(t) and t[-1:].lower() == "b":
            return cls(min_memory_gb=parse_memory(t))
        return cls(profile=t)

    @classmethod
    def _share(cls, shared: dict[str, str], rest: dict[str, str], text: str) -> Size:
        """A share's fields (``share``/``share_gb``, ``compute``/``compute_percent``)."""
        memory = [shared[k] for k in ("share", "share_gb") if k in shared]
        if len(memory) != 1:
            raise InvalidRequest(f"say a share's memory once, as share=8GB, in {text!r}")
        if "profile" in rest:
            cls(profile=rest["profile"], share_gb=1.0)  # the refusal of a shared MIG slice
        if rest:
            raise InvalidRequest(f"a share names its memory and compute only, not {text!r}")
        cap = [shared[k] for k in ("compute", "compute_percent") if k in shared]
        if len(cap) > 1:
            raise InvalidRequest(f"say a share's compute once, as compute=50, in {text!r}")
        percent = _int(cap[0].removesuffix("%").strip()) if cap else None
        return cls(share_gb=parse_memory(memory[0]), compute_percent=percent)

    @classmethod
    def _gpus(cls, text: str) -> Size:
        n, at, model = text.partition("@")
        return cls(gpus=_int(n), model=model.strip() if at else None)

    def to_json(self) -> dict[str, Any]:
        # field by field, not ``asdict``: its deep copy is a visible share of an API call
        sizes = {
            "gpus": self.gpus,
            "profile": self.profile,
            "min_memory_gb": self.min_memory_gb,
            "model": self.model,
            "share_gb": self.share_gb,
            "compute_percent": self.compute_percent,
        }
        return {k: v for k, v in sizes.items() if v is not None}


_GB = f"a number of GB from {RESOLUTION:g} to {MAX_MEMORY_GB:g}"
_PERCENT = "a whole percent from 1 to 100"
_SHARE_KEYS = ("share", "share_gb", "compute", "compute_percent")


def _exact(gb: float) -> str:
    """``gb`` in 6 significant digits where that reads back exactly, else in full."""
    short = f"{gb:g}"
    return short if float(short) == gb else repr(gb)


def _field(part: str, text: str) -> tuple[str, str]:
    k, eq, v = part.partition("=")
    if not eq:
        raise InvalidRequest(f"{part.strip()!r} in {text!r} is not field=value")
    return k.strip(), v.strip()


_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
"""A GPU model's name as the catalog writes it."""


def _int(v: str) -> int:
    try:
        return int(v)
    except ValueError:
        raise InvalidRequest(f"{v!r} is not a whole number") from None


def _float(v: str) -> float:
    try:
        return float(v)
    except ValueError:
        raise InvalidRequest(f"{v!r} is not a number") from None
