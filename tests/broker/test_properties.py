"""Property tests of the core's invariants under random sequences of operations.

- a device is never held by two leases, in memory or in the SQLite file;
- a grant never takes a user past their concurrent quota;
- queue positions are always exactly 1..n;
- under aging, every request is eventually granted (none starves);
- nothing is granted to a holder that stopped renewing its request.
"""

from __future__ import annotations

import hypothesis.strategies as st
from broker_helpers import SIZES, allocations, make_inventory
from hypothesis import HealthCheck, given, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from jupyter_gpubroker.broker.budgets import Quota
from jupyter_gpubroker.broker.clock import VirtualClock
from jupyter_gpubroker.broker.core import Broker
from jupyter_gpubroker.broker.models import Inventory, RequestState
from jupyter_gpubroker.broker.policy import make_policy
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.wire.errors import QuotaExceeded
from jupyter_gpubroker.wire.sizes import Size

USERS = ("ada", "bob", "cy", "dee")


def mixed_inventory() -> Inventory:
    """Two whole H100s and one in MIG mode cut 3g@0 + 2g@4 + 1g@6."""
    return make_inventory([None, None, (("3g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6))])


class BrokerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = VirtualClock(1_750_000_000)
        self.store = Store()
        self.broker = Broker(self.store, mixed_inventory(), clock=self.clock)
        self.limits: dict[str, float] = {}
        self.violations: list[str] = []
        self.broker.subscribe(self._on_event)

    def _on_event(self, event) -> None:  # type: ignore[no-untyped-def]
        if event.kind != "granted":
            return
        if event.user == "dee" and event.detail["waited_s"] >= self.broker.request_ttl_s:
            self.violations.append(f"{event.request_id} granted after its holder left")
        limit = self.limits.get(event.user)
        held = sum(x.gpu_equivalents for x in self.broker.leases(event.user))
        if limit is not None and held > limit + 1e-9:
            self.violations.append(f"{event.user} holds {held} > quota {limit}")

    @rule(
        user=st.sampled_from(USERS),
        size=st.sampled_from(SIZES),
        batch=st.booleans(),
        duration=st.one_of(st.none(), st.floats(60, 36000)),
    )
    def submit(self, user: str, size: Size, batch: bool, duration: float | None) -> None:
        try:
            r = self.broker.submit(
                user,
                size,
                groups=["lab"] if user in ("ada", "bob") else [],
                job_class="batch" if batch else "interactive",
                expected_duration_s=duration,
            )
        except QuotaExceeded:
            return
        assert r.state in (RequestState.QUEUED, RequestState.GRANTED)

    @precondition(lambda self: self.broker.leases())
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(sorted(self.broker.leases(), key=lambda x: x.devices)))
        self.broker.release(lease.id, lease.user)

    @precondition(lambda self: self.broker.queue())
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        entry = data.draw(st.sampled_from(self.broker.queue()))
        self.broker.cancel(entry.request.id, entry.request.user)

    @rule(seconds=st.floats(0, 400))
    def time_passes(self, seconds: float) -> None:
        self.clock.advance(seconds)
        for lease in self.broker.leases():
            if lease.user != "dee":  # dee's kernels die silently: their leases must expire
                self.broker.renew(lease.id, lease.user)
        for entry in self.broker.queue():
            if entry.request.user != "dee":  # and so must the requests they left queued
                self.broker.renew_request(entry.request.id, entry.request.user)
        self.broker.tick()
        assert all(e.request.expires_at > self.clock.now() for e in self.broker.queue())

    @rule(user=st.sampled_from(USERS), limit=st.one_of(st.none(), st.sampled_from([1.0, 2.0, 3.0])))
    def set_quota(self, user: str, limit: float | None) -> None:
        if limit is None:
            self.limits.pop(user, None)
        else:
            self.limits[user] = limit
        self.broker.set_quota("user", user, Quota(max_gpus=limit))

    @invariant()
    def never_double_granted(self) -> None:
        held = [d for lease in self.broker.leases() for d in lease.devices]
        assert len(held) == len(set(held))
        assert allocations(self.store) == {
            d: lease.id for lease in self.broker.leases() for d in lease.devices
        }

    @invariant()
    def quotas_respected_and_nothing_granted_to_who_left(self) -> None:
        assert not self.violations, self.violations

    @invariant()
    def positions_are_a_permutation(self) -> None:
        queue = self.broker.queue()
        assert [e.position for e in queue] == list(range(1, len(queue) + 1))
        assert all(e.request.state is RequestState.QUEUED for e in queue)
        assert len({e.request.id for e in queue}) == len(queue)

    @invariant()
    def nothing_fits_while_queue_waits_under_best_fit(self) -> None:
        # After a pass, no free device may sit next to a waiting request it could
        # serve, unless quota or an EASY reservation holds it back.
        for e in self.broker.queue():
            r = e.request
            if self.limits.get(r.user) is not None or r.size.gpus == 2:
                continue
            free = self.broker.placer.find(r.size, "best_fit")
            assert free is None or self._reserved_elsewhere(), (r.size, free)

    def _reserved_elsewhere(self) -> bool:
        # a blocked 2-GPU request may hold a free whole GPU for itself
        return any(e.request.size.gpus == 2 for e in self.broker.queue())


BrokerMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestBrokerInvariants = BrokerMachine.TestCase


@settings(max_examples=100, deadline=None)
@given(
    jobs=st.lists(
        st.tuples(
            st.sampled_from(USERS),
            st.sampled_from(SIZES),
            st.floats(0, 3600),  # submit offset
            st.floats(60, 7200),  # how long it holds its grant
        ),
        min_size=1,
        max_size=40,
    ),
    policy=st.sampled_from(["broker", "slurm", "fcfs"]),
)
def test_every_request_is_eventually_granted(jobs, policy) -> None:  # type: ignore[no-untyped-def]
    """Holders give devices back after their run; every request must get its turn."""
    clock = VirtualClock(1_750_000_000)
    broker = Broker(Store(), mixed_inventory(), clock=clock, policy=make_policy(policy))
    holds: dict[str, float] = {}
    runs: dict[str, float] = {}
    ids = []
    for user, size, offset, run in sorted(jobs, key=lambda j: j[2]):
        clock.set(1_750_000_000 + offset)
        _finish(broker, holds, clock.now())
        r = broker.submit(user, size, expected_duration_s=run)
        runs[r.id] = run
        ids.append(r.id)
        _started(broker, holds, runs)
    # Total work bounds the time to drain: nothing may wait longer than all of it.
    horizon = clock.now() + sum(j[3] for j in jobs) + 60
    while broker.queue() and clock.now() < horizon:
        clock.set(min(holds.values(), default=clock.now() + 60))
        _finish(broker, holds, clock.now())
        broker.schedule()
        _started(broker, holds, runs)
    assert not broker.queue(), "requests left waiting: " + str([e.request for e in broker.queue()])
    assert all(broker.request(i).state is not RequestState.QUEUED for i in ids)


def _started(broker: Broker, holds: dict[str, float], runs: dict[str, float]) -> None:
    for lease in broker.leases():
        holds.setdefault(lease.id, lease.granted_at + runs[lease.request_id])


def _finish(broker: Broker, holds: dict[str, float], now: float) -> None:
    for lease_id, end in list(holds.items()):
        if end <= now:
            del holds[lease_id]
            lease = broker.lease(lease_id)
            broker.renew(lease_id)  # still alive up to its last moment
            broker.release(lease.id)
