"""A broker restarted on its file carries on where the last one stopped."""

from __future__ import annotations

import pytest
from broker_helpers import allocations, make_inventory, whole_inventory, without

from jupyter_gpubroker.broker.budgets import Quota
from jupyter_gpubroker.broker.core import Broker, BrokerConfig
from jupyter_gpubroker.broker.models import LeaseState, RequestState
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.wire.errors import QuotaExceeded
from jupyter_gpubroker.wire.sizes import Size

HOUR = 3600.0


@pytest.fixture
def reopen(state_file, clock):
    def make(inventory, **kwargs) -> Broker:
        return Broker(Store(state_file), inventory, clock=clock, **kwargs)

    return make


def snapshot(broker: Broker):
    return (
        {d: lease.id for d, lease in broker.holders().items()},
        [(e.position, e.request.id, e.eta) for e in broker.queue()],
    )


def test_a_restarted_broker_sees_the_same_leases_queue_and_positions(reopen, clock):
    inv = make_inventory([None, None, ("3g.40gb", "3g.40gb")])
    first = reopen(inv)
    first.submit("alice", Size(gpus=2), expected_duration_s=HOUR)
    first.submit("bob", Size(profile="3g.40gb"), groups=["chem"])
    clock.advance(2 * HOUR)  # alice piles up usage
    first.submit("carol", Size(profile="3g.40gb"), expected_duration_s=600)
    for user in ("alice", "dave", "alice", "erin"):
        clock.advance(60)
        first.submit(user, Size(gpus=1), job_class="batch")
    clock.advance(60)
    first.submit("frank", Size(min_memory_gb=30))
    before = snapshot(first)
    assert len(before[0]) == 4 and len(before[1]) == 5
    head = first.queue()[0].request

    second = reopen(inv)
    assert snapshot(second) == before
    assert allocations(second.store) == before[0]
    # and it goes on granting from there, not from scratch
    lease = second.leases("alice")[0]
    second.release(lease.id, "alice")
    assert second.request(head.id).state is RequestState.GRANTED


def test_restart_keeps_the_usage_of_live_leases(reopen, clock):
    inv = whole_inventory(2)
    first = reopen(inv)
    first.submit("alice", Size(gpus=2))
    clock.advance(5 * HOUR)
    first.submit("alice", Size(gpus=1))
    clock.advance(60)
    first.submit("bob", Size(gpus=1))
    assert [e.request.user for e in first.queue()] == ["bob", "alice"]
    second = reopen(inv)
    assert [e.request.user for e in second.queue()] == ["bob", "alice"]
    assert second.fairshare("alice", "") == pytest.approx(first.fairshare("alice", ""), rel=0.1)


def test_restart_remembers_quotas_and_past_usage(reopen, clock):
    inv = whole_inventory(2)
    first = reopen(inv)
    first.set_quota("user", "alice", Quota(max_gpus=1, gpu_hours=3, period_s=86400))
    r = first.submit("alice", Size(gpus=1))
    clock.advance(3 * HOUR)
    first.release(r.lease_id)
    second = reopen(inv)
    assert second.quotas() == first.quotas()
    with pytest.raises(QuotaExceeded, match="budget"):
        second.submit("alice", Size(gpus=1))
    assert second.usage() == pytest.approx({"alice": 3.0})


def test_a_lease_whose_device_left_the_inventory_is_reclaimed(reopen, clock):
    inv = whole_inventory(3)
    first = reopen(inv)
    kept = first.submit("alice", Size(gpus=1))
    lost = first.submit("bob", Size(gpus=2))
    gone = first.lease(lost.lease_id).devices[1]
    waiting = first.submit("carol", Size(gpus=1))
    assert waiting.state is RequestState.QUEUED
    clock.advance(60)

    second = reopen(without(inv, gone))
    lease = second.lease(lost.lease_id)
    assert lease.state is LeaseState.RECLAIMED
    assert gone in lease.reason and "no longer in the inventory" in lease.reason
    assert second.request(lost.id).state is RequestState.RECLAIMED
    assert set(allocations(second.store)) == set(second.lease(kept.lease_id).devices)
    assert second.lease(kept.lease_id).state is LeaseState.ACTIVE
    # the surviving GPU of bob's lease goes to the queue at the next pass
    second.tick()
    assert second.request(waiting.id).state is RequestState.GRANTED
    assert second.usage()["bob"] == pytest.approx(2 * 60 / 3600)


def test_a_queued_request_the_new_inventory_cannot_serve_is_refused(reopen):
    inv = make_inventory([None, ("7g.80gb",)])
    first = reopen(inv)
    first.submit("alice", Size(profile="7g.80gb"))
    waiting = first.submit("bob", Size(profile="7g.80gb"))
    second = reopen(whole_inventory(1))
    r = second.request(waiting.id)
    assert r.state is RequestState.REFUSED and "7g.80gb" in r.reason
    assert second.queue() == []


def test_a_queued_memory_request_survives_restarts_exactly(reopen):
    inv = whole_inventory(1)
    first = reopen(inv)
    first.submit("alice", Size(gpus=1))
    exact = 81559 / 1024  # all of an H100's memory, to the MiB
    waiting = first.submit("bob", Size(min_memory_gb=exact))
    second = reopen(inv)
    r = second.request(waiting.id)
    assert r.state is RequestState.QUEUED and r.size == Size(min_memory_gb=exact)


def test_restart_gives_live_holders_a_fresh_ttl(reopen, clock):
    first = reopen(whole_inventory(1), config=BrokerConfig(lease_ttl_s=60))
    r = first.submit("alice", Size(gpus=1))
    clock.advance(600)  # the broker was down for ten minutes
    second = reopen(whole_inventory(1), config=BrokerConfig(lease_ttl_s=60))
    second.tick()
    assert second.lease(r.lease_id).state is LeaseState.ACTIVE
    clock.advance(60)
    second.tick()
    assert second.lease(r.lease_id).state is LeaseState.EXPIRED


def test_request_ids_keep_their_order_across_restarts(reopen, clock):
    first = reopen(whole_inventory(1))
    ids = [first.submit(u, Size(gpus=1)).id for u in ("a", "b")]
    second = reopen(whole_inventory(1))
    ids.append(second.submit("c", Size(gpus=1)).id)
    assert [r.id for r in second.store.live_requests()] == ids
