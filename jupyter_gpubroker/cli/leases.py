"""The queue and one's own requests and leases: ``queue``, ``request``, ``renew``,
``release``, ``extend`` and ``run``, all through the broker's API."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from asyncio.subprocess import Process
from datetime import datetime
from typing import Any

from ..client import BrokerAPIError, BrokerClient, keep_alive
from ..wire.sizes import extension, time_limit
from ..wire.text import (
    CLI_RUN_HOLDER,
    clock,
    count,
    eta_text,
    limit_extended,
    limit_until,
    reclaim_warning,
    size_text,
)
from .common import (
    client,
    connection_args,
    interruptible,
    print_result,
    seconds,
    table,
)

STOP_GRACE_S = 5.0
"""Seconds ``run`` gives its command after SIGTERM before it kills it."""
NEWS_WAIT_S = 2.0
"""Seconds ``run`` waits, once a renewal is refused, for the broker's event saying why."""


def add_queue(p: argparse.ArgumentParser) -> None:
    p.description = (
        "List the requests waiting for a GPU, in the order the broker will "
        "grant them, with each one's size, class, submission time and estimated grant time."
    )
    connection_args(p)
    p.set_defaults(func=cmd_queue)


def _sized(p: argparse.ArgumentParser) -> None:
    connection_args(p)
    p.add_argument(
        "size",
        help="a MIG profile (1g.10gb), a GPU count (2), memory (20GB: a device of at least "
        "20 GB) or a share (share=8GB: 8 GB of a GPU shared with others; share=8GB,compute=50)",
    )
    p.add_argument(
        "--class", dest="job_class", default="interactive", choices=["interactive", "batch"]
    )
    p.add_argument(
        "--time",
        type=time_limit,
        default=None,
        help="the time limit, e.g. 2h or 1h30m (as Slurm's --time): warned before it ends, "
        "the GPU is taken back after it (default: the broker's for the class, if any)",
    )


def add_request(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Submit a request and (by default) wait for the grant. The lease expires "
        "unless renewed within its TTL: use 'renew', or 'run' for a command."
    )
    _sized(p)
    p.add_argument("--no-wait", action="store_true", help="return once queued")
    p.add_argument(
        "--timeout",
        type=seconds,
        default=600.0,
        help="seconds to wait; then the request is withdrawn",
    )
    p.set_defaults(func=cmd_request)


def add_renew(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Renew a lease (l-...) or a queued request (r-..., e.g. one made with "
        "'request --no-wait') for another TTL. A lease or request nobody renews expires: the "
        "GPU goes to the next request, and a waiting request leaves the queue."
    )
    connection_args(p)
    p.add_argument("id", help="a lease id (l-...) or request id (r-...)")
    p.set_defaults(func=cmd_renew)


def add_release(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Give a lease's GPU back (l-...) or withdraw a request (r-...), queued "
        "or granted; the next request in the queue is granted at once."
    )
    connection_args(p)
    p.add_argument("id", help="a lease id (l-...) or request id (r-...)")
    p.add_argument(
        "--reason", default=None, help="why (an admin withdrawing another user's request)"
    )
    p.set_defaults(func=cmd_release)


def add_extend(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Give your lease's time limit more time, e.g. when its warning comes: 'extend --by "
        "1h'. Granted only where no waiting request was promised an earlier start on its "
        "GPU, and within the class's limits; otherwise it says why and when the GPU is needed."
    )
    connection_args(p)
    p.add_argument(
        "lease", nargs="?", help="the lease (l-...); may be left out while you hold only one"
    )
    p.add_argument(
        "--by",
        type=extension,
        required=True,
        metavar="TIME",
        help="how much more time, e.g. 30min, 1h or 1h30m",
    )
    p.set_defaults(func=cmd_extend)


def add_run(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Wait for a grant, run COMMAND with CUDA_VISIBLE_DEVICES set, renew the "
        "lease while it runs, release it when it ends. Exits with the command's status. A "
        "time limit's warning is printed when it comes, with the command that extends it. If "
        "the lease is lost (ended by the broker, or not renewable within its TTL) the "
        "command is stopped (SIGTERM, then SIGKILL)."
    )
    _sized(p)
    p.add_argument("--timeout", type=seconds, default=600.0, help="seconds to wait for a grant")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    p.set_defaults(func=cmd_run)


def cmd_queue(args: argparse.Namespace) -> int:
    queue = asyncio.run(client(args).queue())
    rows = [("POS", "USER", "SIZE", "CLASS", "SUBMITTED", "ETA")]
    for e in queue:
        size = size_text(e)
        rows.append(
            (
                str(e["position"]),
                e["user"],
                size,
                e["job_class"],
                e["submitted_at"][11:19],
                eta_text(e),
            )
        )
    print_result(args, queue, table(rows) + f"\n{len(queue)} waiting")
    return 0


def _size_fields(text: str) -> dict[str, Any]:
    from ..wire.errors import InvalidRequest
    from ..wire.sizes import Size

    if text.strip().startswith("-"):
        digits = text.strip()[1:].isdigit()
        raise InvalidRequest(
            f"a GPU count must be positive, not {text}"
            if digits
            else f"sizes cannot be negative: {text} (give e.g. 1g.10gb, 2 or 20GB)"
        )
    return Size.parse(text).to_json()


async def _granted(broker: BrokerClient, args: argparse.Namespace, holder: str) -> dict[str, Any]:
    """Submit the request and wait for its grant (unless --no-wait). A request whose
    wait ends (timeout, Ctrl-C, error) is withdrawn by ``wait_for_grant``: nothing is
    granted to a caller who left."""
    fields = _size_fields(args.size)
    r = await broker.submit(**fields, job_class=args.job_class, holder=holder, limit_s=args.time)
    if r["state"] != "queued" or getattr(args, "no_wait", False):
        return r
    print(f"queued at position {r['position']} (request {r['id']})", file=sys.stderr)
    try:
        return await broker.wait_for_grant(
            r["id"],
            args.timeout,
            on_notice=lambda m: print(f"request {r['id']}: {m}", file=sys.stderr),
        )
    except BaseException:
        args.withdrawn = f": request {r['id']} withdrawn"
        raise


def cmd_request(args: argparse.Namespace) -> int:
    r = interruptible(_granted(client(args), args, "cli"))
    if r["state"] != "granted":
        print_result(
            args,
            r,
            f"request {r['id']} is {r['state']} at position {r['position']}\n"
            f"# renew within {r['ttl_s']:g} s or it leaves the queue: "
            f"jupyter gpubroker renew {r['id']}",
        )
        return 0
    lease = r["lease"]
    print_result(
        args,
        r,
        f"CUDA_VISIBLE_DEVICES={','.join(lease['devices'])}\n"
        + "".join(f"{k}={v}\n" for k, v in ((lease.get("share") or {}).get("env") or {}).items())
        + (f"# {lease['share']['text']}\n" if lease.get("share") else "")
        + f"GPUBROKER_LEASE_ID={lease['id']}\n"
        f"# renew within {lease['ttl_s']:g} s: jupyter gpubroker renew {lease['id']}"
        + _ends(lease),
    )
    return 0


def _ends(lease: dict[str, Any]) -> str:
    """The lease's time limit, where it has one, as a line of its own."""
    if not lease.get("ends_at"):
        return ""
    return f"\n# time limit ends at {clock(_when(lease['ends_at']))}"


def _when(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def cmd_renew(args: argparse.Namespace) -> int:
    broker = client(args)
    if args.id.startswith("r-"):
        r = asyncio.run(broker.renew_request(args.id))
        print_result(args, r, f"request {r['id']} is {r['state']}; expires at {r['expires_at']}")
        return 0
    lease = asyncio.run(broker.renew(args.id))
    print_result(args, lease, f"lease {lease['id']} expires at {lease['expires_at']}")
    return 0


def cmd_release(args: argparse.Namespace) -> int:
    broker = client(args)
    if args.id.startswith("r-"):
        done = asyncio.run(broker.cancel(args.id, args.reason))
    else:
        done = asyncio.run(broker.release(args.id))
    print_result(args, done, f"{args.id}: {done['state']}")
    return 0


def cmd_extend(args: argparse.Namespace) -> int:
    broker = client(args)

    async def extend() -> dict[str, Any]:
        return await broker.extend(args.lease or await _only_lease(broker), args.by)

    lease = asyncio.run(extend())
    print_result(args, lease, f"lease {lease['id']}: {limit_extended(_when(lease['ends_at']))}")
    return 0


async def _only_lease(broker: BrokerClient) -> str:
    """The one lease the caller holds; a sentence listing them where that is not one."""
    me = (await broker.me())["user"]
    mine = [x for x in await broker.leases() if x["user"] == me]
    if len(mine) == 1:
        return str(mine[0]["id"])
    if not mine:
        raise BrokerAPIError(0, "no_lease", "you hold no lease to extend")
    held = ", ".join(
        f"{x['id']} ({', '.join(x['devices'])}, "
        + (limit_until(_when(x["ends_at"])) if x.get("ends_at") else "no time limit")
        + ")"
        for x in mine
    )
    raise BrokerAPIError(
        0, "which_lease", f"you hold {count(len(mine), 'lease')}; name the one to extend: {held}"
    )


def cmd_run(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.command and args.command[0] != "--" and args.command[0].startswith("-"):
        print(
            f"error: {args.command[0]} comes after the size: give options first, e.g. "
            f"jupyter gpubroker run --time 2h {args.size} -- COMMAND",
            file=sys.stderr,
        )
        return 2
    if not command:
        print("error: give the command to run after --", file=sys.stderr)
        return 2
    return interruptible(_run(client(args), args, command))


async def _run(broker: BrokerClient, args: argparse.Namespace, command: list[str]) -> int:
    r = await _granted(broker, args, CLI_RUN_HOLDER)
    try:
        lease = r["lease"]
        devices = ",".join(lease["devices"])
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": devices, "NVIDIA_VISIBLE_DEVICES": devices}
        env.update((lease.get("share") or {}).get("env") or {})  # its MPS daemon and limits
        try:
            proc = await asyncio.create_subprocess_exec(*command, env=env)
        except OSError as e:  # as a shell says it: 127 not found, 126 not runnable
            print(f"error: cannot run {command[0]}: {e.strerror}", file=sys.stderr)
            return 127 if isinstance(e, FileNotFoundError) else 126
        try:
            return await _hold(broker, lease, proc, _extend_command(args, lease))
        finally:
            if proc.returncode is None:  # lost lease, Ctrl-C: never leave it running
                await _stop(proc)
    finally:
        with contextlib.suppress(BrokerAPIError, OSError):
            await broker.cancel(r["id"])


def _extend_command(args: argparse.Namespace, lease: dict[str, Any]) -> str:
    """The command that extends ``lease`` from another terminal, as the user would type it."""
    where = f" --url {args.url}" if args.url else ""
    return f"jupyter gpubroker extend {lease['id']} --by 1h{where}"


async def _hold(
    broker: BrokerClient, lease: dict[str, Any], proc: Process, extend_command: str = ""
) -> int:
    """Renew the lease while the command runs (``keep_alive``), saying what the broker
    says of it meanwhile (``_notices``); its exit status, or 1 once the lease is lost:
    ended by the broker, refused, or not renewed within its TTL."""
    renewing = asyncio.ensure_future(keep_alive(broker.renew, lease))
    watching = asyncio.ensure_future(_notices(broker, lease, extend_command))
    exiting = asyncio.ensure_future(proc.wait())
    pending: set[asyncio.Future[Any]] = {renewing, watching, exiting}
    try:
        while True:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if exiting in done:
                return exiting.result()
            if watching in done and watching.exception() is None:  # a refused stream: no news
                why = watching.result()
                break
            if renewing in done:  # the event that says why is often a moment behind
                lost = renewing.result()
                why = f"lost lease {lease['id']} ({lost.message if lost else 'no longer renewed'})"
                told, _ = await asyncio.wait({watching}, timeout=NEWS_WAIT_S)
                if told and watching.exception() is None:
                    why = watching.result()
                break
        print(f"error: {why}: stopping the command", file=sys.stderr)
        return 1
    finally:
        renewing.cancel()
        watching.cancel()
        exiting.cancel()


async def _notices(broker: BrokerClient, lease: dict[str, Any], extend_command: str) -> str:
    """Print the broker's warnings about the lease (a time limit's with how to extend it)
    and its extensions, as they come; once it ends, why, in a sentence."""
    lease_id = lease["id"]
    async with contextlib.aclosing(broker.follow()) as events:
        async for message in events:
            kind, data = message["type"], message["data"]
            if data.get("lease_id") != lease_id:
                continue
            if kind == "warning":
                cause = data.get("cause", "")
                text = reclaim_warning(data["reason"], _when(data["deadline"]), cause)
                if cause == "time_limit" and extend_command:
                    text += f": {extend_command}"
                print(f"warning: lease {lease_id}: {text}", file=sys.stderr)
            elif kind == "extended":
                extended = limit_extended(_when(data["ends_at"]))
                print(f"lease {lease_id}: {extended}", file=sys.stderr)
            elif kind in ("released", "expired", "reclaimed"):
                if data.get("cause") == "time_limit":
                    return f"the broker took lease {lease_id} back: {data['reason']}"
                return f"lost lease {lease_id} ({data.get('reason') or kind})"
    raise AssertionError("follow() ends only with an error")


async def _stop(proc: Process) -> None:
    """SIGTERM, then SIGKILL if it has not exited after ``STOP_GRACE_S``."""
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
    except asyncio.TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
