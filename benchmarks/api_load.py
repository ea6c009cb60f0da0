"""API load: clients submitting, renewing and cancelling over HTTP while event streams are open.

A real ``jupyter server`` with the extension (``tests/live_server.py``), or with ``--hub``
the broker as a JupyterHub service under a real hub (``tests/live_hub.py``; the load goes
straight to the service, as user servers reach it, with a hub user's API token), on a
simulated ``dgx-h100-mig:8`` (56 1g.10gb slices). For each level of open event streams (each a
kernel-scoped token of its own, as idle kernels hold them, or with ``--viewer user`` the
submitting user's own, which get every event in full), ``--clients`` coroutines
loop for ``--seconds``: submit a request, renew it (its lease when granted, the request
when queued), cancel it. The same clients first make bare ``GET me`` calls (there is no
``api/status``: ``me`` is the cheapest authenticated call) for the baseline the
submissions are compared with.

    python benchmarks/api_load.py [--streams 0,200,1000] [--clients 32] [--seconds 10]
                                  [--viewer kernel|user] [--hub] [--json]
    python benchmarks/api_load.py --fanout 200,1000 [--json]
    python benchmarks/api_load.py --bound [--clients 32] [--seconds 10] [--json]

``--bound``: the same clients against a bare tornado handler (no auth, no broker, no
logging) in a process of its own: the most HTTP requests per second this machine serves
from one event loop, so a submission cycle (three requests) can never beat a third of it.

Not a test: speed belongs here. One process drives every client and stream (asyncio,
keep-alive HTTP/1.1), so on a small machine the figures include the load generator's
own share of the CPU. Each level also reports the server process's CPU time per
submission cycle and per bare ``GET me`` (from ``/proc``): on a machine others share,
rates follow their load, while CPU time per operation stays what the server spends.
One stream in ``SAMPLE_EVERY``, read by a process of its own (``Sampler``), also times
its messages' arrival against their ``at`` (``state_age_p99_s``, ``state_age_max_s``):
how old a state its front shows can be, the window's wait and the server's delays
included.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from live_hub import API as HUB_API  # noqa: E402
from live_hub import Hub  # noqa: E402
from live_server import TOKEN, LiveServer, free_port  # noqa: E402

from jupyter_gpubroker.api import API_PREFIX, TOKEN_HEADER  # noqa: E402
from jupyter_gpubroker.api.rules import BrokerAPI  # noqa: E402
from jupyter_gpubroker.events import frame  # noqa: E402
from jupyter_gpubroker.runtime import GPUBroker  # noqa: E402

SLICE = json.dumps({"profile": "1g.10gb", "holder": "bench"})
SAMPLE_EVERY = 20
"""One stream in this many measures its messages' age (``state_age_*``)."""


class Connection:
    """One keep-alive HTTP/1.1 connection (the load generator must stay cheap)."""

    def __init__(self, port: int, headers: dict[str, str], prefix: str = f"/{API_PREFIX}") -> None:
        self.port, self.prefix = port, prefix
        self.head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def call(self, method: str, path: str, body: str = "") -> tuple[int, Any]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        data = body.encode()
        self.writer.write(
            (
                f"{method} {self.prefix}/{path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
                f"{self.head}Content-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n\r\n"
            ).encode()
            + data
        )
        head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        status = int(head.split(" ", 2)[1])
        length = 0
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.lower() == "content-length":
                length = int(value)
        raw = await self.reader.readexactly(length) if length else b""
        return status, json.loads(raw) if raw else None


AT = re.compile(rb'data: ?\{"v": ?1, ?"id": ?\d+, ?"type": ?"\w+", ?"at": ?"([^"]+)"')
"""A message's envelope up to its ``at``: when what it shows happened."""


async def open_stream(
    port: int,
    auth: str,
    received: list[int],
    prefix: str = f"/{API_PREFIX}",
    ages: list[float] | None = None,
) -> asyncio.Task[None]:
    """An SSE stream (``auth``: its credential header), read and counted until cancelled;
    with ``ages``, each message's age when it arrived (seconds since its ``at``: how old
    the state its front shows is; messages a read splits are not counted)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"GET {prefix}/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"{auth}\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    await reader.readuntil(b"data:")  # the hello: subscribed

    async def read() -> None:
        try:
            while chunk := await reader.read(65536):
                received[0] += chunk.count(b"\ndata:")
                if ages is not None:
                    now = time.time()
                    ages.extend(
                        now - datetime.fromisoformat(at.decode()).timestamp()
                        for at in AT.findall(chunk)
                    )
        finally:
            writer.close()

    return asyncio.ensure_future(read())


class Sampler:
    """One stream in ``SAMPLE_EVERY``, in a process of its own that does nothing but read
    them: the age of the messages they get, when they arrive (``open_stream``), is then
    the server's delay and the window's, not the load generator's."""

    def __init__(self, port: int, prefix: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, theirs = context.Pipe()
        self.process = context.Process(
            target=Sampler.serve, args=(port, prefix, theirs), daemon=True
        )
        self.process.start()

    async def ask(self, command: str, arg: Any = None) -> Any:
        """``open`` streams with these credentials; ``read`` the messages counted and
        their ages since the last read; ``stop``."""
        self.conn.send((command, arg))
        answer = await asyncio.get_running_loop().run_in_executor(None, self.conn.recv)
        if command == "stop":
            self.process.join(10)
        return answer

    @staticmethod
    def serve(port: int, prefix: str, conn: Any) -> None:
        async def serve() -> None:
            received, ages, streams = [0], [], []
            while True:
                command, arg = await asyncio.get_running_loop().run_in_executor(None, conn.recv)
                if command == "open":
                    for auth in arg:
                        streams.append(await open_stream(port, auth, received, prefix, ages))
                    conn.send(None)
                elif command == "read":
                    conn.send((received[0], ages[:]))
                    received[0] = 0
                    ages.clear()
                else:
                    for s in streams:
                        s.cancel()
                    conn.send(None)
                    return

        asyncio.run(serve())


async def client_loop(conn: Connection, until: float, latencies: list[float], ops: list[int]):
    while time.perf_counter() < until:
        t = time.perf_counter()
        status, r = await conn.call("POST", "requests", SLICE)
        latencies.append(time.perf_counter() - t)
        assert status == 201, r
        ops[0] += 1
        renew = f"leases/{r['lease']['id']}/renew" if r["lease"] else f"requests/{r['id']}/renew"
        t = time.perf_counter()
        status, _ = await conn.call("POST", renew)
        latencies.append(time.perf_counter() - t)
        t = time.perf_counter()
        status, _ = await conn.call("DELETE", f"requests/{r['id']}")
        latencies.append(time.perf_counter() - t)
        assert status == 200


async def bare_loop(conn: Connection, until: float, latencies: list[float], ops: list[int]):
    while time.perf_counter() < until:
        t = time.perf_counter()
        status, _ = await conn.call("GET", "me")
        latencies.append(time.perf_counter() - t)
        assert status == 200
        ops[0] += 1


def cpu_s(pid: int) -> float:
    """A process's CPU time (user + system), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(
    target: Target, clients: int, seconds: float, loop: Any
) -> tuple[float, float, float]:
    """(operations/s of ``loop``'s first call, p99 ms over all its calls, the server's
    CPU ms per operation)."""
    conns = [target.connection() for _ in range(clients)]
    latencies: list[float] = []
    ops = [0]
    cpu = cpu_s(target.pid)
    start = time.perf_counter()
    await asyncio.gather(*(loop(c, start + seconds, latencies, ops) for c in conns))
    elapsed = time.perf_counter() - start
    cpu = cpu_s(target.pid) - cpu
    for c in conns:
        if c.writer is not None:
            c.writer.close()
    p99 = statistics.quantiles(latencies, n=100)[98] * 1000 if len(latencies) > 1 else 0.0
    return ops[0] / elapsed, p99, 1000 * cpu / max(ops[0], 1)


class Target:
    """Where the load goes: a port, the API's path there, a user's token, the server's pid."""

    def __init__(self, port: int, prefix: str, token: str, pid: int) -> None:
        self.port, self.prefix, self.pid = port, prefix, pid
        self.headers = {"Authorization": f"token {token}"}
        self.auth = f"Authorization: token {token}"  # as an event stream sends it

    def connection(self) -> Connection:
        return Connection(self.port, self.headers, self.prefix)


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    broker = {"simulate": "dgx-h100-mig:8", "lease_ttl": 600}
    with tempfile.TemporaryDirectory() as home:
        server: Hub | LiveServer
        if args.hub:
            server = Hub(Path(home), **broker)
            server.start()
            pid = server.service_pid()
            assert pid is not None
            target = Target(server.service_port, HUB_API, server.user("bench"), pid)
        else:
            server = LiveServer(Path(home), Path(home) / "state.sqlite", **broker)
            server.start()
            assert server.proc is not None
            target = Target(server.port, f"/{API_PREFIX}", TOKEN, server.proc.pid)
        try:
            port = target.port
            admin = target.connection()
            bare, bare_p99, bare_cpu = await measure(target, args.clients, args.seconds, bare_loop)
            results = []
            streams: list[asyncio.Task[None]] = []
            received = [0]
            sampler = Sampler(port, target.prefix)
            opened = 0
            for level in args.streams:
                sampled: list[str] = []
                while opened < level:
                    auth = target.auth
                    if args.viewer == "kernel":
                        kernel = json.dumps({"kernel_id": f"bench-{opened}"})
                        status, t = await admin.call("POST", "tokens", kernel)
                        assert status == 201, t
                        auth = f"{TOKEN_HEADER}: {t['token']}"
                    if opened % SAMPLE_EVERY == 0:
                        sampled.append(auth)
                    else:
                        streams.append(await open_stream(port, auth, received, target.prefix))
                    opened += 1
                await sampler.ask("open", sampled)
                await sampler.ask("read")  # from now on
                before = received[0]
                rate, p99, cpu = await measure(target, args.clients, args.seconds, client_loop)
                await asyncio.sleep(1.0)  # the last windows' messages arrive
                sampler_received, ages = await sampler.ask("read")
                results.append(
                    {
                        "streams": level,
                        "viewer": args.viewer,
                        "host": "hub service" if args.hub else "jupyter server",
                        "clients": args.clients,
                        "submissions_per_s": round(rate, 1),
                        "p99_ms": round(p99, 1),
                        "bare_get_me_per_s": round(bare, 1),
                        "bare_get_me_p99_ms": round(bare_p99, 1),
                        "ratio_to_bare_get": round(rate / bare, 3),
                        "server_cpu_ms_per_submission": round(cpu, 3),
                        "server_cpu_ms_per_bare_get": round(bare_cpu, 3),
                        "cpu_ratio_to_bare_get": round(bare_cpu / cpu, 3),
                        "messages_delivered": received[0] - before + sampler_received,
                        "state_age_p99_s": round(statistics.quantiles(ages, n=100)[98], 3)
                        if len(ages) > 1
                        else None,
                        "state_age_max_s": round(max(ages), 3) if ages else None,
                    }
                )
            for s in streams:
                s.cancel()
            await sampler.ask("stop")
            base = results[0]["server_cpu_ms_per_submission"] if args.streams[0] == 0 else None
            for r in results:  # the fan-out's cost: CPU per submission against no streams
                r["cpu_ratio_to_no_streams"] = (
                    round(r["server_cpu_ms_per_submission"] / base, 2) if base else None
                )
            return results
        finally:
            server.stop()


def fanout(waiting: int, events: int = 20) -> dict[str, Any]:
    """Event-loop (CPU) time per event with ``waiting`` kernels queued, each following its own
    stream: the broker in process (no HTTP), each event then its coalesced positions
    pass, every stream's share decided and encoded as the server does it."""
    with tempfile.TemporaryDirectory() as home:
        rt = GPUBroker(
            simulate="dgx-h100-mig:1",
            state_file=f"{home}/s.sqlite",
            gpu_lock_dir=f"{home}/gpu-locks",
            user_gpu_lock_dir=f"{home}/user-gpu-locks",
            identity="username",
        )
        rt.start()
        api = BrokerAPI(rt)
        alice = api.user_identity("alice")
        for _ in range(7):
            api.submit(alice, {"profile": "1g.10gb", "holder": "held"})
        sent = [0]
        for i in range(waiting):
            kernel = api.token_identity(api.issue_token(alice, {"kernel_id": f"k{i}"})["token"])
            assert kernel is not None
            api.submit(kernel, {"profile": "1g.10gb"})

            def send(message: dict[str, Any]) -> None:
                frame(message)
                sent[0] += 1

            api.follow(kernel, send)  # its hello is not sent
        rt.events.positions()
        sent[0] = 0
        start = time.process_time()
        for _ in range(events // 2):  # each moves every waiter's queue length
            r = api.submit(alice, {"profile": "1g.10gb", "holder": "x"})
            rt.events._positions_later()
            api.cancel(alice, r["id"])
            rt.events._positions_later()
        per_event = (time.process_time() - start) / events
        rt.stop()
    return {
        "waiting_kernels": waiting,
        "loop_ms_per_event": round(per_event * 1000, 1),
        "messages_per_event": sent[0] / events,
    }


class _Bare:
    """A tornado handler that answers every call with a fixed JSON object."""

    @staticmethod
    def serve(port: int) -> None:
        from tornado import web

        class Handler(web.RequestHandler):
            def get(self, _: str) -> None:
                self.set_header("Content-Type", "application/json")
                self.finish('{"user": "bench"}')

        async def forever() -> None:
            app = web.Application([(r"/api/(.*)", Handler)], log_function=lambda _: None)
            app.listen(port, "127.0.0.1")
            await asyncio.Event().wait()

        asyncio.run(forever())


async def bound(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The bare tornado request rate here (``--bound``)."""
    port = free_port()
    server = multiprocessing.Process(target=_Bare.serve, args=(port,), daemon=True)
    server.start()
    try:
        target = Target(port, "/api", "unused", server.pid or 0)
        for _ in range(100):  # until it listens
            try:
                await target.connection().call("GET", "me")
                break
            except OSError:
                await asyncio.sleep(0.1)
        rate, p99, cpu = await measure(target, args.clients, args.seconds, bare_loop)
    finally:
        server.terminate()
    return [
        {
            "host": "bare tornado",
            "clients": args.clients,
            "gets_per_s": round(rate, 1),
            "p99_ms": round(p99, 1),
            "server_cpu_ms_per_get": round(cpu, 3),
            "submissions_per_s_at_most": round(rate / 3, 1),
        }
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--streams", default="0,200,1000")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--viewer",
        choices=("kernel", "user"),
        default="kernel",
        help="who holds the streams: idle kernels (a kernel token each: they get only "
        "their own kernel's events) or the submitting user's own fronts (every event)",
    )
    parser.add_argument(
        "--fanout",
        default="",
        help="instead: event-loop time per event with these numbers of waiting kernels, "
        "each with its own stream, e.g. 200,1000 (in process, no HTTP)",
    )
    parser.add_argument(
        "--hub",
        action="store_true",
        help="load the broker as a JupyterHub service (needs configurable-http-proxy)",
    )
    parser.add_argument(
        "--bound",
        action="store_true",
        help="instead: the same clients against a bare tornado handler (the HTTP bound)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.bound:
        results = asyncio.run(bound(args))
    elif args.fanout:
        results = [fanout(int(n)) for n in args.fanout.split(",")]
    else:
        args.streams = [int(x) for x in args.streams.split(",")]
        results = asyncio.run(run(args))
    print(json.dumps(results, indent=2) if args.json else "\n".join(map(str, results)))


if __name__ == "__main__":
    main()
