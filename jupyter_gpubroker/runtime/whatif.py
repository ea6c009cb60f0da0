"""What-if replays asked of a running broker (``POST whatif``, the admin page's form).

The JSON body is checked field by field into a ``replay.whatif.Variation`` (each field by
its type, so a field added there is taken here; a few fields also by what they name), and
the replay (``replay.whatif.history`` and ``compare``, as ``jupyter gpubroker whatif``
runs them) reads the live state file in a worker thread, one replay at a time, so the
event loop keeps serving while it runs. The last run's outcome is kept for the admin
page, which shows it once done.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path
from types import NoneType, UnionType
from typing import Any, get_args, get_type_hints

from ..api.parse import only
from ..broker.accounting import Prices
from ..broker.budgets import Quota
from ..broker.models import check_name
from ..broker.policy import POLICIES, Window
from ..nvml.presets import PRESETS, TopologyError, load_topology
from ..replay.whatif import QUOTA_FIELDS, Variation, compare, history
from ..wire.errors import BrokerError, Conflict, InvalidRequest
from ..wire.sizes import said
from ..wire.times import iso, zone

MOST_GPUS = 4096
"""The most GPUs a what-if adds or takes away (a bound on the simulated machine)."""
PRICES = ("prices", "prices_if")
"""Besides the variation: prices for the cost (``--prices``), other prices for the
what-if's (``--prices-if``), each as a prices file holds them."""

KINDS = {int: "an integer", float: "a number", str: "text", bool: "true or false"}


def _typed(name: str, hint: Any) -> Callable[[Any], Any]:
    """The check of a field of one plain type (or that or null)."""
    args = get_args(hint) if isinstance(hint, UnionType) else (hint,)
    kinds = [a for a in args if a is not NoneType]
    if len(kinds) != 1 or kinds[0] not in KINDS:
        raise TypeError(f"field {name} is of no plain type ({hint}): give it a parser in PARSED")
    kind, nullable = kinds[0], NoneType in args

    def check(value: Any) -> Any:
        if value is None and nullable:
            return None
        if kind in (bool, str):
            ok = isinstance(value, kind)
        else:  # a JSON number: no bool, no NaN or infinity, an int where it must be one
            ok = (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and math.isfinite(value)
                and (kind is float or isinstance(value, int))
            )
        if ok:
            return float(value) if kind is float else value
        takes = KINDS[kind] + (" or null" if nullable else "")
        raise InvalidRequest(f"'{name}' must be {takes}, not {said(value)}")

    return check


def _windows(value: Any) -> tuple[dict[str, Any], ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(w, dict) for w in value):
        raise InvalidRequest("'windows' must be a list of windows, as c.GPUBroker.windows")
    for w in value:
        Window.from_dict(w)  # refused here, in a sentence, not in the replay
    return tuple(value)


def _quotas(value: Any) -> tuple[tuple[str, str, Quota], ...]:
    takes = (
        "'quotas' must be a list of {kind: user or group, name, and any of "
        f"{', '.join(QUOTA_FIELDS)}}}"
    )
    if not isinstance(value, list) or not all(isinstance(q, dict) for q in value):
        raise InvalidRequest(takes)
    found = []
    for q in value:
        only(q, ("kind", "name", *QUOTA_FIELDS))
        kind, name = q.get("kind"), q.get("name")
        if kind not in ("user", "group"):
            raise InvalidRequest(takes)
        check_name(name, kind)
        numbers = {k: _typed(k, float | None)(q.get(k)) for k in QUOTA_FIELDS}
        found.append((kind, name, Quota(**numbers)))
    return tuple(found)


PARSED: dict[str, Callable[[Any], Any]] = {"windows": _windows, "quotas": _quotas}
"""The fields of more than one plain type, each read by its own parser."""


def _gpus(n: int) -> None:
    if abs(n) > MOST_GPUS:
        raise InvalidRequest(f"'gpus' adds or takes away at most {MOST_GPUS:,} GPUs, not {n:,}")


def _machine(name: str) -> None:
    if name.rpartition(":")[0] not in PRESETS:
        raise InvalidRequest(
            f"'machine' must be a preset with :N GPUs ({', '.join(PRESETS)}), not {said(name)}"
        )
    try:
        load_topology(name)
    except (TopologyError, InvalidRequest) as e:
        why = e.message if isinstance(e, InvalidRequest) else str(e)
        raise InvalidRequest(f"'machine' {said(name)}: {why}") from None


def _policy(name: str) -> None:
    if name not in POLICIES:
        raise InvalidRequest(f"'policy' must be one of {', '.join(POLICIES)}, not {said(name)}")


def _timezone(name: str) -> None:
    try:
        zone(name)
    except InvalidRequest:
        raise InvalidRequest(
            f"'timezone' must be an IANA time zone name, not {said(name)}"
        ) from None


NAMED: dict[str, Callable[[Any], None]] = {
    "gpus": _gpus,
    "machine": _machine,
    "policy": _policy,
    "timezone": _timezone,
}
"""What a field names, checked beyond its type (a value the replay could not use)."""


def _readers() -> dict[str, Callable[[Any], Any]]:
    hints = get_type_hints(Variation)
    readers = {}
    for f in fields(Variation):
        readers[f.name] = PARSED.get(f.name) or _typed(f.name, hints[f.name])
    return readers


READERS = _readers()
"""Each field of ``Variation``, its reader."""


@dataclass(frozen=True)
class Asked:
    """A what-if as asked: what varies and the prices its costs are at."""

    variation: Variation
    prices: Prices | None
    prices_if: Prices | None


def asked(body: dict[str, Any]) -> Asked:
    """A what-if's JSON body, every field checked with a sentence; absent: as recorded."""
    only(body, (*READERS, *PRICES))
    values = {}
    for name, read in READERS.items():
        if name in body:
            values[name] = value = read(body[name])
            if value is not None and name in NAMED:
                NAMED[name](value)
    prices = {}
    for name in PRICES:
        value = body.get(name)
        if value is not None and not isinstance(value, dict):
            raise InvalidRequest(f"'{name}' must be prices as a prices file holds them")
        prices[name] = Prices.from_dict(value) if value is not None else None
    return Asked(Variation(**values), prices["prices"], prices["prices_if"])


class WhatIfRuns:
    """One what-if replay at a time, in a worker thread; the last one's outcome kept."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="gpubroker-whatif")
        self._lock = threading.Lock()
        self._running: dict[str, Any] | None = None
        self._last: dict[str, Any] | None = None

    def start(self, state: Path, now: float, by: str, body: dict[str, Any]) -> Future[Any]:
        """Replay ``state``'s history as ``body`` asks, its figures the future's result
        (a broker error its exception); a 409 while another runs."""
        what = asked(body)
        with self._lock:
            running = self._running
            if running is not None:
                replaying = (
                    f"of {running['requests']:,} recorded requests "
                    if running["requests"] is not None
                    else ""
                )
                raise Conflict(
                    f"a what-if replay {replaying}asked by {running['by']} is running: one "
                    "runs at a time, ask again once it is done"
                )
            self._running = {"by": by, "since": iso(now), "requests": None}
        return self._pool.submit(self._run, state, now, by, body, what)

    def _run(
        self, state: Path, now: float, by: str, body: dict[str, Any], what: Asked
    ) -> dict[str, Any]:
        began = time.monotonic()
        done: dict[str, Any] = {"by": by, "asked": body}
        try:
            found = history(state, now, what.variation.machine)
            with self._lock:
                assert self._running is not None
                self._running["requests"] = len(found.trace.jobs)
            figures = compare(found, what.variation, what.prices, what.prices_if)
            done.update(requests=len(found.trace.jobs), left_out=found.left_out, **figures)
            return done
        except BrokerError as e:
            done["error"] = e.message
            raise
        finally:
            done.update(at=iso(now + time.monotonic() - began), took_s=time.monotonic() - began)
            with self._lock:
                self._last, self._running = done, None

    def state(self) -> dict[str, Any]:
        """The replay running now (who asked, since when, how many requests once read),
        the last one done (its figures, or why it could not run) and the policies a
        what-if may order by."""
        with self._lock:
            running = dict(self._running) if self._running is not None else None
            return {"running": running, "last": self._last, "policies": list(POLICIES)}

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
