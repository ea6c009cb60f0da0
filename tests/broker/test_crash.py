"""A broker killed at any instant restarts from its file with nothing half-done.

A worker process (``crash_worker.py``) storms a broker with random calls and
prints every acknowledged one; we SIGKILL it at random moments, check the
SQLite file against what it acknowledged, and start it again on the same file.
The same again over REST: client threads storm a real ``jupyter server`` over HTTP,
and what they got a success for is what was acknowledged.
"""

from __future__ import annotations

import importlib.util
import json
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from broker_helpers import allocations
from live_server import LiveServer

from jupyter_gpubroker.broker.store import SCHEMA_VERSION, Store

HERE = Path(__file__).parent
WORKER = HERE / "crash_worker.py"
ROUNDS = 15
SEED = 20240515


def load_worker():
    spec = importlib.util.spec_from_file_location("broker_crash_worker", WORKER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_and_kill(path: Path, seed: int, after_s: float, log: Path) -> list[str]:
    """Start the worker, let it storm ``after_s`` seconds past READY, SIGKILL it;
    return the complete lines it printed."""
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), str(path), str(seed)],
            stdout=out,
            stderr=subprocess.PIPE,
            cwd=HERE,
        )
        deadline = time.monotonic() + 20
        while "READY\n" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                err = proc.communicate()[1].decode()
                pytest.fail(f"the worker did not start (exit {proc.returncode}):\n{err}")
            time.sleep(0.01)
        time.sleep(after_s)
        if proc.poll() is not None:
            pytest.fail(f"the worker died by itself:\n{proc.communicate()[1].decode()}")
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    text = log.read_text()
    lines = text.split("\n")[:-1]  # a line cut by the kill is not acknowledged
    return [line for line in lines if line != "READY"]


def check_file(path: Path, acked: list[str]) -> tuple[int, int]:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        requests = {r["id"]: r for r in conn.execute("SELECT * FROM requests")}
        leases = {r["id"]: r for r in conn.execute("SELECT * FROM leases")}
        allocated = dict(conn.execute("SELECT device, lease_id FROM allocations").fetchall())
    finally:
        conn.close()
    active = {lid: lease for lid, lease in leases.items() if lease["state"] == "active"}

    held = [(d, lid) for lid, lease in active.items() for d in json.loads(lease["devices"])]
    devices = [d for d, _ in held]
    assert len(devices) == len(set(devices)), "a device is in two active leases"
    assert allocated == dict(held), "allocations differ from the active leases' devices"

    for lid, lease in active.items():
        r = requests[lease["request_id"]]
        assert r["state"] == "granted", f"active lease {lid} belongs to a {r['state']} request"
        assert r["lease_id"] == lid
    for rid, r in requests.items():
        if r["state"] == "granted":
            assert r["lease_id"] in active, f"granted request {rid} has no active lease"
        if r["state"] == "queued":
            assert r["lease_id"] is None
            assert all(lease["request_id"] != rid for lease in active.values())
    for lid, lease in leases.items():
        if lease["state"] != "active":
            assert lid not in allocated.values()

    for line in acked:
        kind, ident, *rest = line.split()
        if kind == "S":
            assert ident in requests, f"acknowledged request {ident} is not in the file"
        elif kind == "R":
            assert leases[ident]["state"] == "released", f"released lease {ident} is active"
        elif kind == "C":
            assert requests[ident]["state"] == rest[0], f"cancelled {ident} is not {rest[0]}"
        else:
            pytest.fail(f"unexpected worker output {line!r}")
    return len(active), sum(r["state"] == "queued" for r in requests.values())


@pytest.mark.slow
def test_killed_broker_restarts_consistent(tmp_path):
    worker = load_worker()
    path = tmp_path / "state.sqlite"
    rng = random.Random(SEED)
    acked: list[str] = []
    busy_rounds = 0
    for _ in range(ROUNDS):
        lines = run_and_kill(path, rng.randrange(2**32), rng.uniform(0.05, 0.5), tmp_path / "out")
        acked += lines
        active, queued = check_file(path, acked)
        busy_rounds += bool(active and queued)

        broker = worker.open_broker(str(path))  # a fresh broker opens it without error
        try:
            holders = {d: lease.id for d, lease in broker.holders().items()}
            assert holders == allocations(broker.store)
            assert len({lease.id for lease in broker.leases()}) == active
        finally:
            broker.store.close()
        store = Store(path)
        assert store.schema_version == SCHEMA_VERSION and store.live_requests() is not None
        store.close()

    kinds = [line[0] for line in acked]
    assert kinds.count("S") >= 100 and kinds.count("R") >= 20 and kinds.count("C") >= 10
    assert busy_rounds >= ROUNDS // 2, "the storm should leave leases and a queue behind"


REST_ROUNDS = 4
REST_CLIENTS = 3
REST_SIZES = ({"profile": "1g.10gb"}, {"min_memory_gb": 5}, {"min_memory_gb": 9.5})


def rest_storm(server: LiveServer, seed: int, acked: list[str], lock: threading.Lock) -> None:
    """One client: random submits, cancels, releases and renews until the server dies.
    Appends what it got a success for, as ``check_file`` reads it (S, R, C lines), and
    anything else that went wrong as an ``E`` line."""
    rng = random.Random(seed)
    conn = server.connection()
    mine: list[str] = []

    def ack(line: str) -> None:
        with lock:
            acked.append(line)

    try:
        while True:
            op = rng.random()
            if op < 0.45:
                body = {**rng.choice(REST_SIZES), "holder": f"k-{rng.randrange(1000)}"}
                if rng.random() < 0.5:
                    body["job_class"] = "batch"
                status, reply = server.call("POST", "requests", body, conn)
                assert status == 201, reply
                ack(f"S {reply['id']}")
                mine.append(reply["id"])
            elif op < 0.7:
                leases = server.call("GET", "leases", conn=conn)[1]["leases"]
                if not leases:
                    continue
                lease_id = rng.choice(leases)["id"]
                status, reply = server.call("DELETE", f"leases/{lease_id}", conn=conn)
                assert status in (200, 409), reply  # another client may have released it
                if status == 200:
                    ack(f"R {lease_id}")
            elif op < 0.85 and mine:
                rid = mine.pop(rng.randrange(len(mine)))
                status, reply = server.call("DELETE", f"requests/{rid}", conn=conn)
                assert status in (200, 409), reply  # it ended meanwhile
                if status == 200:
                    ack(f"C {rid} {reply['state']}")
            else:
                for lease in server.call("GET", "leases", conn=conn)[1]["leases"]:
                    status, reply = server.call("POST", f"leases/{lease['id']}/renew", conn=conn)
                    assert status in (200, 409), reply
    except OSError:  # killed: a refused or cut connection
        return
    except Exception as e:  # reported by the test, not lost in a thread
        ack(f"E {e!r}")
    finally:
        conn.close()


@pytest.mark.slow
def test_killed_server_restarts_consistent_over_rest(tmp_path):
    path = tmp_path / "state.sqlite"
    server = LiveServer(tmp_path, path, lease_ttl=5.0, tick_interval=0.1)
    rng = random.Random(SEED)
    acked: list[str] = []
    lock = threading.Lock()
    for _ in range(REST_ROUNDS):
        server.start()  # on the file the last round's kill left
        clients = [
            threading.Thread(target=rest_storm, args=(server, rng.randrange(2**32), acked, lock))
            for _ in range(REST_CLIENTS)
        ]
        for c in clients:
            c.start()
        time.sleep(rng.uniform(0.5, 2.0))
        server.kill()
        for c in clients:
            c.join(timeout=30)
        assert not any(c.is_alive() for c in clients)
        assert not [line for line in acked if line.startswith("E ")]
        check_file(path, acked)

    server.start()
    try:
        for line in acked:  # every acknowledged request is there after the restart
            kind, ident, *_ = line.split()
            if kind == "S":
                assert server.call("GET", f"requests/{ident}")[0] == 200, ident
        held = [d for x in server.call("GET", "leases")[1]["leases"] for d in x["devices"]]
        assert len(held) == len(set(held)), "a device is in two active leases"
    finally:
        server.stop()
    kinds = [line[0] for line in acked]
    assert kinds.count("S") >= 40 and kinds.count("R") >= 5 and kinds.count("C") >= 5
