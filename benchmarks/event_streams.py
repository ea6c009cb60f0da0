"""Event streams opened and closed in rounds: does the server keep anything of them? And
with ``--windows``: what writing a window to every open stream costs the server.

A real ``jupyter server`` with the extension (``tests/live_server.py``) on a simulated
``dgx-h100-mig:1``, with this file loaded into it as a second server extension that
answers ``GET /bench/memory``: the process's RSS after a full collection, the broker's
subscriber count, the object types that grew since the warm-up and, with ``--trace``
(``tracemalloc``, whose own tables cost several MiB of RSS: leave it off to measure RSS),
the source lines whose memory grew most. A warm-up round (one stream, the same
submissions) comes first; then each round opens ``--streams`` event streams (the server
owner's, or with ``--viewer kernel`` a kernel token's each, as idle kernels hold them),
sends ``--events`` submissions and cancellations through them, keeps them open
``--hold`` seconds (the devices' readings go to them every 5 s, keepalives every 15 s),
closes every stream and waits until the broker has no subscriber left.

    python benchmarks/event_streams.py [--rounds 10] [--streams 200] [--events 20]
                                       [--hold 0] [--viewer user|kernel] [--trace]
                                       [--event-buffer 1000] [--baseline] [--json]
    python benchmarks/event_streams.py --windows 20 [--streams 1000] [--events 20]

``--baseline``: the same streams go to a plain jupyter-server event stream of this file's
(a reading's worth of bytes every 5 s, nothing of the broker), so what open connections
cost the host itself is measured in the same run of the same server.

``kept_mib``: a round's RSS once its streams closed, less the warm-up's. A leak grows it
every round; so does the broker's ring of recent events (``event_buffer``, kept for
streams that reconnect), until it holds that many events (about three per submission
and cancellation), and then stays.

``--windows W``: ``--streams`` user streams read as fast as they come, then W windows of
``--events`` submissions and cancellations each (about 1.5 kB a message); the server
process's CPU time per window (from ``/proc``) with those streams and with one, so
``per_stream_window_us`` is what one more stream costs a window. Set ``PYTHONPATH`` to
another checkout to measure its server (the load generator is this one's).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import sys
import tempfile
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

MIB = 1024 * 1024
TRACE_ENV = "GPUBROKER_BENCH_TRACE"
"""Set to 1 (``--trace``): the server traces its allocations (which costs memory too)."""


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# ------------------------------------------------- in the server: the memory probe


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "event_streams"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from jupyter_server.base.handlers import APIHandler
    from tornado import web
    from tornado.iostream import StreamClosedError

    tracing = os.environ.get(TRACE_ENV) == "1"
    if tracing:
        tracemalloc.start(8)
    first: list[tracemalloc.Snapshot] = []
    first_types: list[Counter[str]] = []

    class MemoryHandler(APIHandler):
        @web.authenticated
        def get(self) -> None:
            gc.collect()
            snapshot = (
                tracemalloc.take_snapshot().filter_traces(
                    [tracemalloc.Filter(False, tracemalloc.__file__)]
                )
                if tracing
                else None
            )
            types = Counter(type(o).__qualname__ for o in gc.get_objects())
            if not first_types or self.get_argument("first", "") == "1":
                first[:], first_types[:] = [snapshot] if snapshot else [], [types.copy()]
            types.subtract(first_types[0])
            grown = snapshot.compare_to(first[0], "lineno")[:8] if snapshot else []
            runtime = self.settings["gpubroker"]
            self.finish(
                {
                    "rss_mib": _rss_mib(),
                    "traced_mib": tracemalloc.get_traced_memory()[0] / MIB,
                    "subscribers": runtime.events.subscribers + open_streams[0],
                    "kernel_groups": len(runtime.events._by_kernel),
                    "top_growth": [
                        f"{s.size_diff / 1024:+.1f} KiB {s.count_diff:+d} blocks "
                        f"{s.traceback[0].filename.rsplit('site-packages/', 1)[-1]}:"
                        f"{s.traceback[0].lineno}"
                        for s in grown
                    ],
                    "object_growth": [f"{n:+d} {t}" for t, n in types.most_common(6) if n > 0],
                }
            )

    open_streams = [0]

    class StreamHandler(APIHandler):
        """The baseline (``--baseline``): an event stream of jupyter-server's alone, held
        open with a reading's worth of bytes every 5 s and nothing of the broker."""

        closed: asyncio.Event

        @web.authenticated
        async def get(self) -> None:
            self.closed = asyncio.Event()
            self.set_header("Content-Type", "text/event-stream")
            self.set_header("Cache-Control", "no-cache")
            open_streams[0] += 1
            try:
                message = "data: {}\n\n"
                while not self.closed.is_set():
                    self.write(message)
                    await self.flush()
                    message = f"data: {'x' * 1500}\n\n"
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self.closed.wait(), 5)
            except StreamClosedError:
                pass
            finally:
                open_streams[0] -= 1

        def on_connection_close(self) -> None:
            self.closed.set()

    serverapp.web_app.settings["bench_streams"] = open_streams
    serverapp.web_app.add_handlers(
        ".*$", [("/bench/memory", MemoryHandler), ("/bench/events", StreamHandler)]
    )


# ------------------------------------------------------------ the load generator


async def _memory(conn: Any, first: bool = False) -> dict[str, Any]:
    status, body = await conn.call("GET", "memory" + ("?first=1" if first else ""))
    assert status == 200, body
    return dict(body)


async def _submit_and_cancel(api: Any, n: int) -> None:
    from api_load import SLICE

    for _ in range(n):
        status, r = await api.call("POST", "requests", SLICE)
        assert status == 201, r
        status, _ = await api.call("DELETE", f"requests/{r['id']}")
        assert status == 200


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _windows(server: Any, api: Any, n_streams: int, args: argparse.Namespace) -> float:
    """The server's CPU seconds per window with ``n_streams`` user streams open: each
    window is over once every stream has the same bytes and got none for a second."""
    from api_load import open_stream
    from live_server import TOKEN

    from jupyter_gpubroker.api import API_PREFIX

    counts = [[0] for _ in range(n_streams)]
    auth = f"Authorization: token {TOKEN}"
    streams = [await open_stream(server.port, auth, c, f"/{API_PREFIX}") for c in counts]
    await asyncio.sleep(1.0)
    try:
        cpu = _cpu_s(server.proc.pid)
        for _ in range(args.windows):
            before = [c[0] for c in counts]
            await _submit_and_cancel(api, args.events)
            while True:
                now = [c[0] for c in counts]
                await asyncio.sleep(1.0)
                if now != before and now == [c[0] for c in counts] and len(set(now)) == 1:
                    break
        return (_cpu_s(server.proc.pid) - cpu) / args.windows
    finally:
        for s in streams:
            s.cancel()
        await asyncio.gather(*streams, return_exceptions=True)


async def fanout(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from api_load import Connection
    from live_server import TOKEN, LiveServer

    from jupyter_gpubroker.api import API_PREFIX

    with tempfile.TemporaryDirectory() as home:
        server = LiveServer(
            Path(home), Path(home) / "state.sqlite", simulate="dgx-h100-mig:1", lease_ttl=600
        )
        server.start()
        try:
            api = Connection(server.port, {"Authorization": f"token {TOKEN}"}, f"/{API_PREFIX}")
            await _windows(server, api, 1, args)  # warm-up
            one = await _windows(server, api, 1, args)
            many = await _windows(server, api, args.streams, args)
        finally:
            server.stop()
    return {
        "streams": args.streams,
        "events_per_window": args.events,
        "server_cpu_ms_per_window_1_stream": round(1000 * one, 2),
        f"server_cpu_ms_per_window_{args.streams}_streams": round(1000 * many, 2),
        "per_stream_window_us": round(1e6 * (many - one) / max(1, args.streams - 1), 1),
    }


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from api_load import Connection, open_stream
    from live_server import TOKEN, LiveServer

    from jupyter_gpubroker.api import API_PREFIX, TOKEN_HEADER

    if args.trace:
        os.environ[TRACE_ENV] = "1"
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")]
    )
    headers = {"Authorization": f"token {TOKEN}"}
    with tempfile.TemporaryDirectory() as home:
        server = LiveServer(
            Path(home),
            Path(home) / "state.sqlite",
            extensions={"event_streams": True},
            simulate="dgx-h100-mig:1",
            lease_ttl=600,
            event_buffer=args.event_buffer,
        )
        server.start()
        try:
            api = Connection(server.port, headers, f"/{API_PREFIX}")
            probe = Connection(server.port, headers, "/bench")
            start = await _memory(probe)
            rounds = [{"round": "start", "rss_mib": start["rss_mib"]}]
            for n in range(args.rounds + 1):  # round 0: the warm-up, one stream, no hold
                streams = []
                for i in range(args.streams if n else 1):
                    auth = f"Authorization: token {TOKEN}"
                    if args.viewer == "kernel":
                        body = json.dumps({"kernel_id": f"bench-{n}-{i}"})
                        status, t = await api.call("POST", "tokens", body)
                        assert status == 201, t
                        auth = f"{TOKEN_HEADER}: {t['token']}"
                    prefix = "/bench" if args.baseline else f"/{API_PREFIX}"
                    streams.append(await open_stream(server.port, auth, [0], prefix))
                await _submit_and_cancel(api, args.events)
                await asyncio.sleep(args.hold if n else 0)
                opened = await _memory(probe)
                for s in streams:
                    s.cancel()
                await asyncio.gather(*streams, return_exceptions=True)
                for _ in range(200):
                    if not (await _memory(probe))["subscribers"]:
                        break
                    await asyncio.sleep(0.05)
                await asyncio.sleep(1.0)  # the closed connections' last callbacks run
                closed = await _memory(probe, first=n == 0)
                warm = closed["rss_mib"] if n == 0 else rounds[1]["rss_mib"]
                rounds.append(
                    {
                        "round": n,
                        "kept_mib": round(closed["rss_mib"] - warm, 2),
                        "rss_open_mib": opened["rss_mib"],
                        "subscribers_open": opened["subscribers"],
                        "rss_mib": closed["rss_mib"],
                        "traced_mib": closed["traced_mib"],
                        "subscribers": closed["subscribers"],
                        "kernel_groups": closed["kernel_groups"],
                    }
                )
                if not args.json:
                    print(json.dumps(rounds[-1]), flush=True)
            rounds.append(
                {
                    "top_growth_since_warm_up": closed["top_growth"],
                    "object_growth_since_warm_up": closed["object_growth"],
                }
            )
            return rounds
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--events", type=int, default=20)
    parser.add_argument("--hold", type=float, default=0.0, help="seconds the streams stay open")
    parser.add_argument("--windows", type=int, default=0, help="measure W windows' cost")
    parser.add_argument("--viewer", choices=("user", "kernel"), default="user")
    parser.add_argument(
        "--event-buffer", type=int, default=1000, help="c.GPUBroker.event_buffer (its default)"
    )
    parser.add_argument("--trace", action="store_true", help="trace allocations (tracemalloc)")
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="the streams go to a plain jupyter-server stream of this file's, not the broker's",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.windows:
        print(json.dumps(asyncio.run(fanout(args)), indent=1))
        return
    rounds = asyncio.run(run(args))
    if args.json:
        print(json.dumps(rounds, indent=1))
    else:
        print(json.dumps(rounds[-1], indent=1))
        first, last = rounds[2], rounds[-2]
        closed = ", ".join(f"{r['rss_mib']:.1f}" for r in rounds[2:-1])
        kept = ", ".join(f"{r['kept_mib']:+.1f}" for r in rounds[2:-1])
        print(
            f"RSS {rounds[0]['rss_mib']:.1f} MiB at start, {rounds[1]['rss_mib']:.1f} after the "
            f"warm-up, {first['rss_open_mib']:.1f} with {args.streams} streams open; after each "
            f"round closed: {closed}; kept since the warm-up: {kept} MiB"
        )
        if args.trace:
            per_round = (last["traced_mib"] - first["traced_mib"]) / max(1, last["round"] - 1)
            print(
                f"traced Python memory {first['traced_mib']:.2f} -> {last['traced_mib']:.2f} "
                f"MiB ({per_round * 1024:+.1f} KiB per round after the first)"
            )


if __name__ == "__main__":
    main()
