"""``jupyter gpubroker forecast``: demand per hour of the week, and how far to trust it.

From the running broker's API (``GET forecast``, admins only) when there is one, else from
the state file opened read-only (``--state``), which also takes a time zone for the hours.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from ..paths import STATE_FILE_ENV, default_state_path
from .common import ask_broker, connection_args, table


def add_forecast(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Demand per hour of the week (GPU-equivalents held, waiting, and both together; "
        "p50 and p90 over past weeks) from the broker's history, and its error over the last "
        "weeks, each forecast from what came before it. Says so when there is not a day of "
        "history yet. From the running broker (admins), else from its state file (--state), "
        "read without changing it."
    )
    connection_args(p)
    p.add_argument(
        "--state", type=Path, help=f"the broker's state file (default ${STATE_FILE_ENV})"
    )
    p.add_argument(
        "--weeks", type=int, default=8, metavar="N", help="past weeks to learn from (default 8)"
    )
    p.add_argument(
        "--backtest-weeks",
        type=int,
        default=4,
        metavar="N",
        help="past weeks whose forecast is checked against what happened (default 4)",
    )
    p.add_argument(
        "--timezone", default="UTC", help="time zone of the hours (IANA name; --state only)"
    )
    p.add_argument(
        "--all", action="store_true", help="every hour of the week, also those with no demand"
    )
    p.set_defaults(func=cmd_forecast)


def cmd_forecast(args: argparse.Namespace) -> int:
    from ..wire.errors import InvalidRequest

    if not 1 <= args.weeks <= 52 or not 0 <= args.backtest_weeks <= 52:
        raise InvalidRequest("--weeks is 1 to 52 and --backtest-weeks 0 to 52")
    found = None
    if args.state is None and args.timezone == "UTC":
        query = {"weeks": args.weeks, "backtest_weeks": args.backtest_weeks}
        found = ask_broker(args, lambda broker: broker.forecast(**query))
    data = found[0] if found is not None else _from_state(args)
    print(json.dumps(data, indent=2) if args.json else text(data, args.all))
    return 0


def _from_state(args: argparse.Namespace) -> dict[str, Any]:
    from .. import offline
    from ..wire.errors import InvalidRequest
    from ..wire.times import zone

    tz = zone(args.timezone)
    state = args.state or Path(os.environ.get(STATE_FILE_ENV) or default_state_path())
    if not state.exists():
        raise InvalidRequest(
            f"no broker state file at {state}"
            + ("" if args.state else ", and no running broker found: pass --url or --state")
        )
    found = offline.forecast(
        state, now=time.time(), tz=tz, weeks=args.weeks, backtest_weeks=args.backtest_weeks
    )
    return found.to_json()


def text(data: dict[str, Any], every_hour: bool = False) -> str:
    """The forecast as a table, its error below it."""
    if not data["ready"]:
        return str(data["message"]).capitalize() + "."
    daily = data["basis"] == "hour of day"  # every day alike: one day's hours
    first = "hour of every day" if daily else "hour"
    head = (first, "demand p50", "p90", "held p50", "waiting p50")
    rows = [head] + [
        (
            h["label"][4:] if daily else h["label"],
            f"{h['demand']['p50']:.2f}",
            f"{h['demand']['p90']:.2f}",
            f"{h['held']['p50']:.2f}",
            f"{h['waiting']['p50']:.2f}",
        )
        for h in data["hours"][: 24 if daily else None]
        if every_hour or h["demand"]["p90"] > 0
    ]
    lines = [f"Demand in GPU-equivalents, {data['message']}."]
    lines.append(table(rows) if len(rows) > 1 else "No demand in any hour yet.")
    if data["backtest"]:
        tests = [("week from", "mean demand", "mean error", "error", "within p90")]
        for b in data["backtest"]:
            rel = b["relative_error"]
            tests.append(
                (
                    b["week_start"][:10],
                    f"{b['mean_actual']:.2f}",
                    f"{b['mean_abs_error']:.2f}",
                    "-" if rel is None else f"{rel:.0%}",
                    f"{b['p90_covered']:.0%}",
                )
            )
        lines += ["", "How far it held: each week forecast from the weeks before it.", table(tests)]
    return "\n".join(lines)
