"""What users see of a crashed hub service: the broker as a JupyterHub service under a
real hub (``tests/live_hub.py``), SIGKILLed ``--kills`` times while clients call it
through the hub's proxy, as users' servers, kernels and the command line do.

    python benchmarks/service_crash.py [--kills 5] [--clients 4] [--json]

Each client loops over ``GET overview``, ``GET queue`` and a submit/cancel pair with
``jupyter_gpubroker.client.BrokerClient`` (its retries on: a proxy 502/503 or no answer
is tried again for up to $GPUBROKER_RETRY_S, default 120 s). A probe fetches ``GET me``
raw every 0.1 s (no retry). Per kill: the seconds the service was unreachable (the
probe's first failed fetch after the kill to its first good one); the calls that ended
from the kill to ``--settle`` seconds after the service was back, those that failed after
the client's retries, those under way while it was away that succeeded, the longest;
at the end the totals. Loopback only; every loop is
bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from live_hub import Hub  # noqa: E402

from jupyter_gpubroker.client import BrokerClient  # noqa: E402

SLICE = "1g.10gb"
PROBE_S = 0.1
OUTAGE_LIMIT_S = 120.0
"""A kill whose service is not back by then ends the run (the hub polls every 30 s)."""


class Tally:
    """Every client call: (start, end, failed), and what the failed ones said."""

    def __init__(self) -> None:
        self.done: list[tuple[float, float, bool]] = []
        self.errors: list[str] = []

    async def one(self, call: Any) -> Any:
        start, failed, result = time.monotonic(), False, None
        try:
            result = await call
        except Exception as e:  # noqa: BLE001 - what a user would have seen
            failed = True
            self.errors.append(str(e))
        self.done.append((start, time.monotonic(), failed))
        return result

    def window(self, since: float, down: float, up: float) -> dict[str, Any]:
        """The calls that ended since ``since``: how many, how many failed, how many were
        under way while the service was away (``down`` to ``up``), the longest."""
        ended = [c for c in self.done if c[1] >= since]
        waited = [c for c in ended if c[0] < up and c[1] > down]
        return {
            "calls": len(ended),
            "failed": sum(c[2] for c in ended),
            "rode_out": sum(not c[2] for c in waited),
            "longest_s": round(max((c[1] - c[0] for c in ended), default=0.0), 2),
        }


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


class Probe:
    """Raw ``GET me`` every 0.1 s: when the service answered last, and when it first
    failed since then."""

    def __init__(self, client: BrokerClient) -> None:
        self.client = client
        self.up = True
        self.first_failure: float | None = None
        self.recovered: float | None = None

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                good = (await self.client.fetch("GET", "me")).status_code == 200
            except Exception:  # noqa: BLE001 - no answer at all
                good = False
            now = time.monotonic()
            if not good and self.up:
                self.up, self.first_failure, self.recovered = False, now, None
            elif good and not self.up:
                self.up, self.recovered = True, now
            await asyncio.sleep(PROBE_S)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as home:
        hub = Hub(Path(home), lease_ttl=120)
        hub.start()
        try:
            token = hub.user("bench")
            clients = [BrokerClient(hub.api_url, token=token) for _ in range(args.clients)]
            probe = Probe(BrokerClient(hub.api_url, token=token, retry_for=0))
            tally, stop = Tally(), asyncio.Event()
            tasks = [asyncio.ensure_future(client_loop(c, tally, stop)) for c in clients]
            tasks.append(asyncio.ensure_future(probe.run(stop)))
            kills = []
            for _ in range(args.kills):
                await asyncio.sleep(args.settle)
                since = time.monotonic()
                pid = hub.service_pid()
                assert pid is not None, "no broker service runs"
                os.kill(pid, signal.SIGKILL)
                killed = time.monotonic()
                while probe.up and time.monotonic() - killed < 10:
                    await asyncio.sleep(PROBE_S / 2)
                while not probe.up and time.monotonic() - killed < OUTAGE_LIMIT_S:
                    await asyncio.sleep(PROBE_S / 2)
                down, up = probe.first_failure, probe.recovered
                if not probe.up or down is None or up is None or down < since:
                    raise SystemExit(
                        f"the service was not back {OUTAGE_LIMIT_S:.0f} s after a kill"
                    )
                await asyncio.sleep(args.settle)  # the calls that waited finish
                kills.append(
                    {"unreachable_s": round(up - down, 2), **tally.window(since, down, up)}
                )
                print(f"kill {len(kills)}: {kills[-1]}", file=sys.stderr)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 150)
        finally:
            hub.stop()
    gaps = [k["unreachable_s"] for k in kills]
    return {
        "kills": kills,
        "unreachable_s": {
            "min": min(gaps),
            "mean": round(sum(gaps) / len(gaps), 2),
            "max": max(gaps),
        },
        "calls": len(tally.done),
        "failed": sum(c[2] for c in tally.done),
        "errors": sorted(set(tally.errors))[:5],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument(
        "--settle", type=float, default=6.0, help="seconds between kills (over the 5 s pause)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    if args.json:
        print(json.dumps(result, indent=1))
        return
    for i, k in enumerate(result["kills"], 1):
        print(
            f"kill {i}: unreachable {k['unreachable_s']:.1f} s; {k['failed']} of {k['calls']} "
            f"calls failed, {k['rode_out']} waited it out (the longest {k['longest_s']:.1f} s)"
        )
    gaps = result["unreachable_s"]
    print(
        f"unreachable {gaps['min']:.1f} to {gaps['max']:.1f} s (mean {gaps['mean']:.1f}); "
        f"{result['failed']} of {result['calls']} client calls failed after retries"
    )


if __name__ == "__main__":
    main()
