"""``jupyter gpubroker usage``: GPU-hours (and their cost) per user, group, profile or day.

From the running broker's API when there is one (``GET usage``); else, and for what only
the ledger itself can give (prices by time of day, days in another time zone), from the
state file opened read-only. Prices come from a YAML or JSON file
(:meth:`jupyter_gpubroker.broker.accounting.Prices.from_dict`).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import time
from collections.abc import Sequence
from datetime import tzinfo
from pathlib import Path
from typing import TYPE_CHECKING

from ..paths import STATE_FILE_ENV, default_state_path
from .common import ask_broker, connection_args

if TYPE_CHECKING:
    from ..offline import Prices, UsageRow


def add_usage(p: argparse.ArgumentParser) -> None:
    from ..offline import GROUPINGS

    p.description = (
        "GPU-hours (GPU-equivalents x hours; a MIG slice counts its compute slices out of 7) "
        "of leases inside [--since, --until), live leases up to now: as the running Jupyter "
        "server's broker counts them (or the broker at --url), else read from the broker's "
        "state file (--state) without changing it. --prices and --timezone read the state "
        "file."
    )
    connection_args(p, json_output=False)
    p.add_argument(
        "--since", help="start, ISO 8601 (e.g. 2024-05-01; UTC without an offset); default: all"
    )
    p.add_argument("--until", help="end, ISO 8601, exclusive; default: now")
    p.add_argument("--by", choices=GROUPINGS, default="user", help="grouping (default user)")
    p.add_argument(
        "--prices",
        type=Path,
        help="a YAML or JSON file of prices per GPU-hour by profile and time-of-day bands: "
        '{currency: EUR, per_gpu_hour: {gpu: 4.0, "*": 3.0}, bands: [{name: off-peak, '
        'start: "20:00", end: "08:00", factor: 0.5}]}',
    )
    p.add_argument(
        "--timezone",
        default="UTC",
        help="time zone of days and price bands (IANA name, default UTC)",
    )
    p.add_argument(
        "--state",
        type=Path,
        help=f"the broker's state file (default ${STATE_FILE_ENV}, else {default_state_path()})",
    )
    p.add_argument("--csv", action="store_true", help="print CSV instead of a table")
    p.set_defaults(func=cmd_usage)


def cmd_usage(args: argparse.Namespace) -> int:
    from ..offline import UsageRow, load_prices
    from ..wire.times import zone

    tz = zone(args.timezone)
    now = time.time()
    since = _time(args.since, "--since") if args.since else float("-inf")
    until = _time(args.until, "--until") if args.until else now
    prices = load_prices(args.prices) if args.prices else None
    found = None
    if args.state is None and prices is None and args.timezone == "UTC":
        found = ask_broker(
            args, lambda broker: broker.usage(by=args.by, since=args.since, until=args.until)
        )
    if found is not None:
        hours: dict[str, float] = found[0]["gpu_hours"]
        rows = [UsageRow(key, gpu_hours) for key, gpu_hours in hours.items()]
    else:
        rows = _from_state(args, since, until, now, tz, prices)
    _print(args, rows, prices)
    return 0


def _from_state(
    args: argparse.Namespace,
    since: float,
    until: float,
    now: float,
    tz: tzinfo,
    prices: Prices | None,
) -> list[UsageRow]:
    """Usage from the state file, opened read-only: never migrated, never written."""
    from .. import offline
    from ..wire.errors import InvalidRequest

    state = args.state or Path(os.environ.get(STATE_FILE_ENV) or default_state_path())
    if not state.exists():
        raise InvalidRequest(
            f"no broker state file at {state}"
            + ("" if args.state else ", and no running broker found: pass --url or --state")
        )
    return offline.usage(state, since=since, until=until, now=now, by=args.by, tz=tz, prices=prices)


def _print(args: argparse.Namespace, rows: Sequence[UsageRow], prices: Prices | None) -> None:
    header = [args.by, "gpu_hours"] + (["cost"] if prices else [])
    table = [
        [r.key, f"{r.gpu_hours:.4f}"] + ([f"{r.cost:.2f}"] if r.cost is not None else [])
        for r in rows
    ]
    if args.csv:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(table)
        print(out.getvalue(), end="")
        return
    widths = [max(len(str(x)) for x in col) for col in zip(header, *table, strict=False)]
    for line in [header, *table]:
        print("  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
    total = sum(r.gpu_hours for r in rows)
    cost = sum(r.cost or 0.0 for r in rows)
    currency = f" {prices.currency}".rstrip() if prices else ""
    print(f"total {total:.4f} GPU-hours" + (f", {cost:.2f}{currency}" if prices else ""))


def _time(text: str, flag: str) -> float:
    from ..api.shapes import parse_iso
    from ..wire.errors import InvalidRequest

    try:
        return parse_iso(text)
    except ValueError:
        raise InvalidRequest(f"{flag} must be an ISO 8601 time or date, not {text!r}") from None
