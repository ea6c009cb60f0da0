"""What users see of a crashed hub service: the broker as a JupyterHub service under a
real hub (``tests/live_hub.py``), SIGKILLed again and again while clients call it
through the hub's proxy, as users' servers, kernels and the command line do.

    python benchmarks/service_crash.py [--kills 5] [--plain-kills 3] [--json]

Two hubs in turn: the service under its supervisor (``configure``'s default), then the
service alone, which the hub starts again at its next poll (every 30 s). Each kill
SIGKILLs the process holding the state file; under the supervisor, a last kill ends the
supervisor itself (``--supervisor-kills``). Per kill: the seconds from the SIGKILL to
the first successful ``GET me`` through the proxy, fetched raw (no retry, as a page or
the panel's first try) once the killed process (and its service) ended, one after
another, 0.1 s after a failure; how many of those fetches failed; and, of the calls
that ``--clients`` clients made meanwhile with ``BrokerClient`` and its retries
(``GET overview``, ``GET queue``, a submit and its release or cancel), those that
failed after their retries. Loopback only; every loop is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from live_hub import Hub  # noqa: E402

from jupyter_gpubroker.client import BrokerClient  # noqa: E402

SLICE = "1g.10gb"
PAUSE_S = 0.1
BACK_LIMIT_S = 120.0
"""A kill whose service is not back by then ends the run."""


class Tally:
    """Every client call: when it ended and whether it failed; what the failed ones said."""

    def __init__(self) -> None:
        self.done: list[tuple[float, bool]] = []
        self.errors: list[str] = []

    async def one(self, call: Any) -> Any:
        failed, result = False, None
        try:
            result = await call
        except Exception as e:  # noqa: BLE001 - what a user would have seen
            failed = True
            self.errors.append(str(e))
        self.done.append((time.monotonic(), failed))
        return result

    def since(self, at: float) -> tuple[int, int]:
        """(calls, failed) of those that ended since ``at``."""
        ended = [failed for end, failed in self.done if end >= at]
        return len(ended), sum(ended)


async def client_loop(client: BrokerClient, tally: Tally, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await tally.one(client.overview())
        await tally.one(client.queue())
        request = await tally.one(client.submit(profile=SLICE, holder="bench"))
        if request is None:
            continue
        lease = request.get("lease")
        if lease:
            await tally.one(client.release(lease["id"]))
        else:
            await tally.one(client.cancel(request["id"]))


def dead(pid: int) -> bool:
    """Has ``pid`` ended (gone, or a zombie nobody reaped yet)?"""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


async def back_after(raw: BrokerClient, pid: int, service: int) -> tuple[float, int]:
    """SIGKILL ``pid``; the seconds until a raw ``GET me`` through the proxy succeeds,
    and how many failed before it. The fetches start once ``pid`` and the ``service``
    (itself, or its child) have ended: an answer from a service still dying is none."""
    os.kill(pid, signal.SIGKILL)
    killed, failed = time.monotonic(), 0
    while not (dead(pid) and dead(service)):
        await asyncio.sleep(0.001)
    while time.monotonic() - killed < BACK_LIMIT_S:
        try:
            if (await raw.fetch("GET", "me")).status_code == 200:
                return time.monotonic() - killed, failed
        except Exception:  # noqa: BLE001 - no answer at all
            pass
        failed += 1
        await asyncio.sleep(PAUSE_S)
    raise SystemExit(f"the service was not back {BACK_LIMIT_S:.0f} s after a kill")


async def one_hub(
    supervised: bool, kills: int, supervisor_kills: int, args: Any
) -> tuple[list[dict[str, Any]], list[str]]:
    """The kills of one hub: what each cost; what the failed client calls said."""
    with tempfile.TemporaryDirectory() as home:
        hub = Hub(Path(home), supervised=supervised, lease_ttl=120)
        hub.start()
        try:
            token = hub.user("bench")
            clients = [BrokerClient(hub.api_url, token=token) for _ in range(args.clients)]
            raw = BrokerClient(hub.api_url, token=token, retry_for=0, timeout=60)
            tally, stop = Tally(), asyncio.Event()
            tasks = [asyncio.ensure_future(client_loop(c, tally, stop)) for c in clients]
            results = []
            for what in ["service"] * kills + ["supervisor"] * supervisor_kills:
                await asyncio.sleep(args.settle)
                service = hub.service_pid()
                assert service is not None, "no broker service runs"
                pid = hub.supervisor_pid() if what == "supervisor" else service
                at = time.monotonic()
                back_s, failed = await back_after(raw, pid, service)
                await asyncio.sleep(args.settle)  # the calls that waited finish
                calls, calls_failed = tally.since(at)
                results.append(
                    {
                        "killed": what,
                        "back_s": round(back_s, 2),
                        "raw_failed": failed,
                        "calls": calls,
                        "calls_failed": calls_failed,
                    }
                )
                print(f"{'supervised' if supervised else 'plain'}: {results[-1]}", file=sys.stderr)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 150)
            return results, sorted(set(tally.errors))[:5]
        finally:
            hub.stop()


def summary(kills: list[dict[str, Any]]) -> dict[str, Any]:
    back = [k["back_s"] for k in kills]
    return {
        "kills": len(kills),
        "back_s_median": round(statistics.median(back), 2),
        "back_s_max": max(back),
        "raw_failed": sum(k["raw_failed"] for k in kills),
        "calls": sum(k["calls"] for k in kills),
        "calls_failed": sum(k["calls_failed"] for k in kills),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {}
    hubs = [("supervised", True, args.kills, args.supervisor_kills)]
    if args.plain_kills:
        hubs.append(("plain", False, args.plain_kills, 0))
    for name, supervised, kills, supervisor_kills in hubs:
        each, errors = await one_hub(supervised, kills, supervisor_kills, args)
        by_what = {
            what: summary([k for k in each if k["killed"] == what])
            for what in ("service", "supervisor")
            if any(k["killed"] == what for k in each)
        }
        result[name] = {"each": each, **by_what, "errors": errors}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=5, help="of the supervised service")
    parser.add_argument(
        "--supervisor-kills", type=int, default=1, help="of its supervisor, after those"
    )
    parser.add_argument(
        "--plain-kills", type=int, default=3, help="of the service alone (0: not run)"
    )
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--settle", type=float, default=6.0, help="seconds around each kill")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    if args.json:
        print(json.dumps(result, indent=1))
        return
    for name, hub in result.items():
        for i, k in enumerate(hub["each"], 1):
            print(
                f"{name} hub, kill {i} ({k['killed']}): back {k['back_s']:.2f} s after the "
                f"SIGKILL; {k['raw_failed']} raw fetches failed; {k['calls_failed']} of "
                f"{k['calls']} client calls failed after retries"
            )
        for what in ("service", "supervisor"):
            if what in hub:
                s = hub[what]
                print(
                    f"{name} hub, {s['kills']} kills of the {what}: back in "
                    f"{s['back_s_median']:.2f} s (median), {s['back_s_max']:.2f} s at most; "
                    f"{s['raw_failed']} raw "
                    f"fetches and {s['calls_failed']} of {s['calls']} client calls failed"
                )


if __name__ == "__main__":
    main()
