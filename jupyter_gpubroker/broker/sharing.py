"""Which GPUs are lent whole, which are shared, and when: the admin's sharing rules.

Each GPU without MIG is, at each moment, ``whole`` (lent to one request at a time, as
before), ``shared`` (only shares of it: parts of its memory, packed beside each other)
or ``both`` (whichever comes: a GPU holding shares takes no whole request, and a GPU
held whole takes no share). A MIG GPU is always ``whole``: its slices are devices of
their own, and NVIDIA shares none of them. A rule names GPUs (by UUID, index or
catalog model; none: every GPU) and, optionally, a time-of-day window, read in the
policy's time zone like the class windows; the first rule that applies decides.
A switch never takes back what is held: a GPU turned ``whole`` keeps its shares until
they end, and takes no new one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from ..wire.errors import InvalidRequest
from ..wire.sizes import said
from ..wire.times import zone
from .models import Gpu
from .policy import Window

MODES = ("whole", "shared", "both")
SHARES_ALLOWED = frozenset({"shared", "both"})


@dataclass(frozen=True)
class SharingRule:
    """GPUs and, optionally, the hours during which they are lent as ``mode`` says."""

    mode: str
    gpus: frozenset[str] = frozenset()
    """Selectors: a GPU's UUID, its index (``"3"``) or its catalog model
    (``"L40S-48GB"``); empty: every GPU."""
    window: Window | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InvalidRequest(
                f"a GPU is lent 'whole', 'shared' or 'both', not {said(self.mode)}"
            )

    def names(self, gpu: Gpu) -> bool:
        return not self.gpus or bool({gpu.uuid, str(gpu.index), gpu.model or ""} & self.gpus)

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> SharingRule:
        """From config: ``{"mode": "shared", "gpus": ["0", "1"], "start": "08:00",
        "end": "19:00", "days": "mon-fri"}`` (``gpus`` and the hours optional)."""
        unknown = set(d) - {"mode", "gpus", "start", "end", "days"}
        if unknown or "mode" not in d:
            raise InvalidRequest(
                f"a sharing rule names its 'mode', and optionally 'gpus', 'start', 'end' and "
                f"'days', not {said(dict(d))}"
            )
        gpus = d.get("gpus") or ()
        if isinstance(gpus, (str, int)) or not isinstance(gpus, Iterable):
            gpus = (gpus,)
        window = None
        if "start" in d or "end" in d:
            hours = {k: d[k] for k in ("start", "end", "days") if k in d}
            window = Window.from_dict({"name": f"{d['mode']} GPUs", **hours})
        return cls(str(d["mode"]), frozenset(str(g) for g in gpus), window)


@dataclass(frozen=True)
class Sharing:
    """The rules and the mode outside them (``default``)."""

    default: str = "whole"
    rules: tuple[SharingRule, ...] = ()
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        SharingRule(self.default)  # the same check of the mode
        object.__setattr__(self, "_tz", zone(self.timezone))

    def mode(self, gpu: Gpu, now: float) -> str:
        """How ``gpu`` is lent at ``now``."""
        if gpu.mig_enabled:
            return "whole"
        local = datetime.fromtimestamp(now, self._tz)  # type: ignore[attr-defined]
        for rule in self.rules:
            if rule.names(gpu) and (rule.window is None or rule.window.contains(local)):
                return rule.mode
        return self.default

    def ever_shared(self, gpu: Gpu) -> bool:
        """Whether ``gpu`` takes shares at some hour (its MIG off)."""
        if gpu.mig_enabled:
            return False
        modes = set()
        for rule in self.rules:
            if rule.names(gpu):
                modes.add(rule.mode)
                if rule.window is None:  # the rules after it never apply to this GPU
                    break
        else:
            modes.add(self.default)
        return bool(modes & SHARES_ALLOWED)

    @classmethod
    def from_config(
        cls, default: str, rules: Iterable[Mapping[str, object]], tz: str = "UTC"
    ) -> Sharing:
        return cls(default, tuple(SharingRule.from_dict(r) for r in rules), tz)
