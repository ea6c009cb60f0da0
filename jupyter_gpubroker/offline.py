"""A broker's state file read offline and read-only: what ``jupyter gpubroker status
--state`` and ``usage`` read when no broker answers, or need the ledger itself.

A host of the core's store, as ``runtime`` is of the broker: the CLI is a front and
reaches the core only through the API or through here. The file is opened ``mode=ro``,
its schema checked and never migrated (``Store(read_only=True)``).
"""

from __future__ import annotations

from datetime import tzinfo
from pathlib import Path
from typing import Any

import yaml

from .broker.accounting import GROUPINGS as GROUPINGS
from .broker.accounting import Prices as Prices
from .broker.accounting import UsageRow as UsageRow
from .broker.accounting import usage as _usage
from .broker.forecast import Forecast, spans
from .broker.forecast import forecast as _forecast
from .broker.recorded import demand
from .broker.store import Store
from .wire.errors import InvalidRequest


def state_view(state: Path) -> tuple[dict[str, Any], dict[str, tuple[str, float]], dict[str, str]]:
    """Device uuid -> active lease, drained uuid -> (reason, since) and who drained it
    (none when there is no file yet)."""
    if not state.exists():
        return {}, {}, {}
    store = Store(state, read_only=True)
    try:
        holders = {d: lease for lease, _ in store.active_leases() for d in lease.devices}
        return holders, store.drains(), store.drain_causes()
    finally:
        store.close()


def usage(
    state: Path,
    *,
    since: float,
    until: float,
    now: float,
    by: str,
    tz: tzinfo,
    prices: Prices | None,
) -> list[UsageRow]:
    """GPU-hours (and their cost) per ``by`` of the leases inside [since, until)."""
    store = Store(state, read_only=True)
    try:
        rows = store.holdings(since, until, now)
    finally:
        store.close()
    return _usage(rows, since=since, until=until, by=by, tz=tz, prices=prices)


def forecast(
    state: Path, *, now: float, tz: tzinfo, weeks: int, backtest_weeks: int, level: bool = True
) -> Forecast:
    """Demand per hour of the week from the state file's history (``broker.forecast``)."""
    store = Store(state, read_only=True)
    try:
        rows = demand(store, now - (weeks + backtest_weeks) * 7 * 86400.0, now)
    finally:
        store.close()
    return _forecast(
        spans(rows), now, tz=tz, weeks=weeks, backtest_weeks=backtest_weeks, level=level
    )


def load_prices(path: Path) -> Prices:
    """Prices per GPU-hour from a YAML or JSON file (:meth:`Prices.from_dict`)."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise InvalidRequest(f"cannot read prices file {path}: {e}") from None
    if not isinstance(data, dict):
        raise InvalidRequest(f"prices file {path} must hold a mapping")
    return Prices.from_dict(data)
