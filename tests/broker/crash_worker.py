"""Crash-test worker: a broker on a state file, driven by a storm of random calls.

    python crash_worker.py STATE_FILE SEED

Runs until killed. After each call returns it prints, flushed at once, what the
broker acknowledged:

    S <request id>            a submit
    R <lease id>              a release
    C <request id> <state>    a cancel, and the state it left the request in

``test_crash.py`` kills it with SIGKILL at random moments and checks the file.
"""

from __future__ import annotations

import os
import random
import sys
import time

from jupyter_gpubroker.broker.core import Broker, BrokerConfig
from jupyter_gpubroker.broker.policy import BrokerPolicy
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.wire.errors import Conflict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from broker_helpers import SIZES, make_inventory  # noqa: E402

INVENTORY = make_inventory([None, None, ("1g.10gb",) * 7, ("3g.40gb", "2g.20gb", "1g.10gb")])
USERS = ("ada", "bob", "cy", "dee", "eve")
LEASE_TTL_S = 5.0
SPEED = 20.0


class FastClock:
    """Wall time running SPEED times faster, the same function in every process, so
    leases expire within a round and a restart never sees time go backwards."""

    EPOCH = 1_700_000_000.0

    def now(self) -> float:
        return self.EPOCH + SPEED * (time.time() - self.EPOCH)


def open_broker(path: str) -> Broker:
    return Broker(
        Store(path),
        INVENTORY,
        clock=FastClock(),
        policy=BrokerPolicy(),
        config=BrokerConfig(lease_ttl_s=LEASE_TTL_S),
    )


def storm(path: str, seed: int) -> None:
    rng = random.Random(seed)
    broker = open_broker(path)
    requests = [(r.id, r.user) for r in broker.store.live_requests()]
    say = sys.stdout.write
    say("READY\n")
    sys.stdout.flush()
    while True:
        op = rng.random()
        leases = broker.leases()
        if op < 0.4:
            user = rng.choice(USERS)
            r = broker.submit(
                user,
                rng.choice(SIZES),
                groups=[rng.choice(("lab", "ml"))] if rng.random() < 0.5 else [],
                job_class=rng.choice(("interactive", "batch")),
                expected_duration_s=rng.choice((None, 1.0, 30.0, 600.0)),
            )
            say(f"S {r.id}\n")
            sys.stdout.flush()
            requests.append((r.id, user))
        elif op < 0.65 and leases:
            lease = rng.choice(leases)
            broker.release(lease.id, lease.user)
            say(f"R {lease.id}\n")
            sys.stdout.flush()
        elif op < 0.8 and requests:
            rid, user = requests.pop(rng.randrange(len(requests)))
            try:
                r = broker.cancel(rid, user)
            except Conflict:
                continue  # it ended meanwhile
            say(f"C {rid} {r.state.value}\n")
            sys.stdout.flush()
        elif op < 0.9 and leases:
            lease = rng.choice(leases)
            broker.renew(lease.id, lease.user)
        else:
            broker.tick()


if __name__ == "__main__":
    storm(sys.argv[1], int(sys.argv[2]))
