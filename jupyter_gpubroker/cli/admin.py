"""Commands for the broker's admins (anyone else is refused by the broker): drains,
reclassing, the audit log, reclaims and health alerts, through the broker's API."""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from .common import client, connection_args, print_result, table

MOVE_WAIT_S = 120.0
"""How long ``drain --move`` waits for its kernels' moves before it says they go on."""


def add_drain(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Drain a GPU (and its slices) or one slice: nothing new is granted on it "
        "until an admin undrains it, whatever its health; holders keep their leases and are "
        "told. Recorded in the audit log."
    )
    connection_args(p)
    p.add_argument("uuid", help="a GPU or MIG UUID (GPU-..., MIG-...; see 'status')")
    p.add_argument("--reason", required=True, help="why, shown to the holders")
    p.add_argument(
        "--move",
        action="store_true",
        help="move its kernels to free GPUs of its model (suspended there, restored there, "
        "their cells paused meanwhile); those that cannot move keep their GPU, told why",
    )
    p.set_defaults(func=cmd_drain)


def add_undrain(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Lift an admin's drain. A GPU its health check drained is lifted by the "
        "health check once it recovers, never by hand; one still faulty stays drained by its "
        "health check. Recorded in the audit log."
    )
    connection_args(p)
    p.add_argument("uuid", help="a GPU or MIG UUID")
    p.add_argument("--reason", default=None, help="why, shown to the holders")
    p.set_defaults(func=cmd_undrain)


def add_reclass(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Make a waiting request interactive or batch; its place in the queue "
        "follows at once. Recorded in the audit log."
    )
    connection_args(p)
    p.add_argument("id", help="a waiting request's id (r-...)")
    p.add_argument("job_class", choices=["interactive", "batch"])
    p.add_argument("--reason", default=None, help="why, shown to its holder")
    p.set_defaults(func=cmd_reclass)


def add_audit(p: argparse.ArgumentParser) -> None:
    p.description = (
        "The audit log, oldest first: who cancelled, reclassed, drained or "
        "undrained what, and who changed which quota, with their reasons."
    )
    connection_args(p)
    p.add_argument("--since", default=None, help="from this time on (ISO 8601, UTC)")
    p.add_argument("--actor", default=None, help="only this admin's actions")
    p.set_defaults(func=cmd_audit)


def add_reclaims(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Every reclaimed lease, oldest first: whose, when, why (idle, stalled, "
        "preempted, lost, admin) and what the decision saw (idle time, utilization, the "
        "kernel's last activity); --json prints the whole evidence."
    )
    connection_args(p)
    p.add_argument("--user", default=None, help="only this user's leases")
    p.add_argument("--since", default=None, help="from this time on (ISO 8601, UTC)")
    p.add_argument("--until", default=None, help="before this time (ISO 8601, UTC)")
    p.set_defaults(func=cmd_reclaims)


def add_alerts(p: argparse.ArgumentParser) -> None:
    p.description = (
        "The active health alerts (over-temperature, power capping, ECC and "
        "Xid errors, a lost GPU, memory nearly full), oldest first, each with its device, "
        "severity and what to do; --history N adds the N most recently started ended ones."
    )
    connection_args(p)
    p.add_argument(
        "--history",
        type=int,
        default=0,
        metavar="N",
        help="also show the last N ended alerts (1 to 1000)",
    )
    p.set_defaults(func=cmd_alerts)


def cmd_drain(args: argparse.Namespace) -> int:
    state = asyncio.run(_drain(args))
    said = [state["message"]] + [f"  {lease}: {m}" for lease, m in state.get("moves", {}).items()]
    print_result(args, state, "\n".join(said))
    return 0


async def _drain(args: argparse.Namespace) -> dict[str, Any]:
    """Drain; with ``--move``, wait for the moves started to end (a suspend and a restore
    each, seconds), so that what is printed is what moved, not only what began."""
    broker = client(args)
    state = await broker.drain(args.uuid, args.reason, args.move)
    moves: dict[str, str] = state.get("moves", {})
    since = (state.get("drained") or {}).get("since", "")
    deadline = time.monotonic() + MOVE_WAIT_S
    while (going := [x for x, m in moves.items() if m == "moving"]) and (
        time.monotonic() < deadline
    ):
        for lease_id in going:
            moved = (await broker.lease(lease_id)).get("moved")
            if moved and args.uuid in moved["from"] and moved["at"] >= since:
                moves[lease_id] = moved["text"]
        await asyncio.sleep(0.2)
    for lease_id in going:
        moves[lease_id] = "still moving; 'jupyter gpubroker status' shows where it ends up"
    return state


def cmd_undrain(args: argparse.Namespace) -> int:
    state = asyncio.run(client(args).undrain(args.uuid, args.reason))
    print_result(args, state, state["message"])
    return 0


def cmd_reclass(args: argparse.Namespace) -> int:
    r = asyncio.run(client(args).change_class(args.id, args.job_class, args.reason))
    print_result(args, r, f"request {r['id']} is {r['job_class']}, at position {r['position']}")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    records = asyncio.run(client(args).audit(since=args.since, actor=args.actor))
    rows = [("AT", "ACTOR", "ACTION", "TARGET", "REASON")]
    rows += [
        (a["at"][:19], a["actor"], a["action"], a["target"], a["detail"].get("reason", ""))
        for a in records
    ]
    print_result(args, records, table(rows) + f"\n{len(records)} record(s)")
    return 0


def cmd_alerts(args: argparse.Namespace) -> int:
    found = asyncio.run(client(args).alerts(limit=args.history or None))
    history = found["history"] if args.history else []
    rows = [("SINCE", "ENDED", "SEVERITY", "DEVICE", "KIND", "MESSAGE")]
    rows += [
        (
            a["since"][:19],
            (a["ended"] or "-")[:19],
            a["severity"],
            a["label"],
            a["kind"],
            a["message"],
        )
        for a in [*found["active"], *history]
    ]
    summary = f"{len(found['active'])} active alert(s)"
    if args.history:
        summary += f", {len(history)} ended"
    print_result(args, found if args.history else found["active"], table(rows) + f"\n{summary}")
    return 0


def cmd_reclaims(args: argparse.Namespace) -> int:
    found = asyncio.run(client(args).reclaims(user=args.user, since=args.since, until=args.until))
    rows = [("AT", "USER", "CAUSE", "LEASE", "REASON")]
    rows += [(x["at"][:19], x["user"], x["cause"], x["lease_id"], x["reason"]) for x in found]
    print_result(args, found, table(rows) + f"\n{len(found)} reclaim(s)")
    return 0
