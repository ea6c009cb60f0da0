"""``jupyter gpubroker usage``: GPU-hours (and their cost) from the broker's state file.

Read-only, like ``status``: it opens the state file, reads the ledger and the active
leases, and prints a table or CSV. Prices come from a YAML or JSON file
(:meth:`jupyter_gpubroker.broker.accounting.Prices.from_dict`).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import time
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml

from .api.shapes import parse_iso
from .broker.accounting import GROUPINGS, Prices, holdings, usage
from .broker.errors import InvalidRequest
from .broker.store import Store
from .paths import STATE_FILE_ENV, default_state_path


def add_usage_command(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "usage",
        help="GPU-hours (and cost) per user, group, profile or day, from the state file",
        description="GPU-hours (GPU-equivalents x hours; a MIG slice counts its compute "
        "slices out of 7) of leases inside [--since, --until), live leases up to now, read "
        "from the broker's state file without changing it.",
    )
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
    try:
        tz = ZoneInfo(args.timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidRequest(f"unknown time zone {args.timezone!r}") from None
    now = time.time()
    since = _time(args.since, "--since") if args.since else float("-inf")
    until = _time(args.until, "--until") if args.until else now
    prices = _prices(args.prices) if args.prices else None
    state = args.state or Path(os.environ.get(STATE_FILE_ENV) or default_state_path())
    if not state.exists():
        raise InvalidRequest(f"no broker state file at {state}")
    store = Store(state)
    try:
        rows = usage(
            holdings(store, now), since=since, until=until, by=args.by, tz=tz, prices=prices
        )
    finally:
        store.close()
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
        return 0
    widths = [max(len(str(x)) for x in col) for col in zip(header, *table, strict=False)]
    for line in [header, *table]:
        print("  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
    total = sum(r.gpu_hours for r in rows)
    cost = sum(r.cost or 0.0 for r in rows)
    currency = f" {prices.currency}".rstrip() if prices else ""
    print(f"total {total:.4f} GPU-hours" + (f", {cost:.2f}{currency}" if prices else ""))
    return 0


def _time(text: str, flag: str) -> float:
    try:
        return parse_iso(text)
    except ValueError:
        raise InvalidRequest(f"{flag} must be an ISO 8601 time or date, not {text!r}") from None


def _prices(path: Path) -> Prices:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise InvalidRequest(f"cannot read prices file {path}: {e}") from None
    if not isinstance(data, dict):
        raise InvalidRequest(f"prices file {path} must hold a mapping")
    return Prices.from_dict(data)
