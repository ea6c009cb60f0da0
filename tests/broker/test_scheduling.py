"""Scheduling passes: EASY backfill around a reserved big request, and aging."""

from __future__ import annotations

import pytest
from broker_helpers import make_inventory, whole_inventory

from jupyter_gpubroker.broker.budgets import Quota
from jupyter_gpubroker.broker.models import RequestState
from jupyter_gpubroker.broker.policy import BrokerPolicy, SlurmPolicy
from jupyter_gpubroker.wire.sizes import Size

HOUR = 3600.0


@pytest.fixture
def reserved(make_broker, clock):
    """Four GPUs, three held for another hour, a 4-GPU request ranked first and waiting."""
    broker = make_broker(whole_inventory(4), policy=SlurmPolicy())
    for user in ("a", "b", "c"):
        broker.submit(user, Size(gpus=1), expected_duration_s=HOUR)
    clock.advance(60)
    big = broker.submit("bigjob", Size(gpus=4), expected_duration_s=8 * HOUR)
    assert big.state is RequestState.QUEUED
    return broker, big


def test_a_short_request_backfills_a_gpu_the_big_one_cannot_use_yet(reserved, clock):
    broker, big = reserved
    short = broker.submit("dave", Size(gpus=1), expected_duration_s=30 * 60)
    assert short.state is RequestState.GRANTED, "ends before the reservation: backfilled"
    assert big.state is RequestState.QUEUED
    assert [e.request.id for e in broker.queue()] == [big.id]


def test_a_long_request_does_not_delay_the_reservation(reserved, clock):
    broker, big = reserved
    long = broker.submit("dave", Size(gpus=1), expected_duration_s=2 * HOUR)
    assert long.state is RequestState.QUEUED, "would still hold a reserved GPU at its start"
    assert len(broker.holders()) == 3  # one GPU kept idle for the big request
    assert broker.queue()[0].request.id == big.id


def test_the_reserved_request_starts_when_the_holders_leave(reserved, clock):
    broker, big = reserved
    long = broker.submit("dave", Size(gpus=1), expected_duration_s=2 * HOUR)
    for lease in broker.leases():
        broker.release(lease.id)
    assert big.state is RequestState.GRANTED
    assert long.state is RequestState.QUEUED


def test_a_long_request_may_use_devices_the_reservation_does_not_need(make_broker, clock):
    broker = make_broker(make_inventory([None, None, ("1g.10gb",) * 7]), policy=SlurmPolicy())
    broker.submit("a", Size(gpus=1), expected_duration_s=HOUR)
    clock.advance(60)
    big = broker.submit("bigjob", Size(gpus=2), expected_duration_s=8 * HOUR)
    small = broker.submit("dave", Size(min_memory_gb=8), expected_duration_s=10 * HOUR)
    large = broker.submit("erin", Size(min_memory_gb=40), expected_duration_s=10 * HOUR)
    assert big.state is RequestState.QUEUED
    assert small.state is RequestState.GRANTED  # onto a MIG slice: no GPU of the reservation
    assert broker.lease(small.lease_id).profile == "1g.10gb"
    assert large.state is RequestState.QUEUED  # only the reserved whole GPU is large enough


def test_without_a_blocked_request_nothing_is_held_back(make_broker, clock):
    broker = make_broker(whole_inventory(2), policy=SlurmPolicy())
    broker.submit("a", Size(gpus=1), expected_duration_s=HOUR)
    long = broker.submit("dave", Size(gpus=1), expected_duration_s=100 * HOUR)
    assert long.state is RequestState.GRANTED


@pytest.mark.parametrize(("holder_hours", "backfilled"), [(4, True), (2, False)])
def test_broker_policy_backfills_around_its_reservation(
    make_broker, clock, holder_hours, backfilled
):
    # without max_wait_s, age counts from submission
    broker = make_broker(whole_inventory(2), policy=BrokerPolicy(max_wait_s=None))
    holder = broker.submit("a", Size(gpus=1), expected_duration_s=holder_hours * HOUR)
    big = broker.submit("bigjob", Size(gpus=2), expected_duration_s=HOUR)
    clock.advance(3 * HOUR)  # the big request's age puts it first
    broker.renew(holder.lease_id)
    short = broker.submit("dave", Size(gpus=1), expected_duration_s=30 * 60)
    assert big.state is RequestState.QUEUED
    if backfilled:  # the holder leaves in an hour: dave is done by then
        assert short.state is RequestState.GRANTED
        assert broker.queue()[0].request.id == big.id
    else:  # the holder is overdue: the reservation starts now, nothing may backfill
        assert short.state is RequestState.QUEUED
        assert [e.request.id for e in broker.queue()] == [big.id, short.id]


# ---------------------------------------------------------------- aging


def starve_scenario(make_broker, clock, policy: BrokerPolicy, rounds: int = 60):
    """One GPU; 'hog' has huge past usage, 'fav' a huge share and an endless stream of
    requests, each held for ten minutes. Returns (hog's request, rounds played)."""
    broker = make_broker(whole_inventory(1), policy=policy)
    broker.set_quota("user", "fav", Quota(share=1000))
    past = broker.submit("hog", Size(gpus=1))
    clock.advance(48 * HOUR)
    broker.release(past.lease_id)
    broker.submit("fav", Size(gpus=1))
    hog = broker.submit("hog", Size(gpus=1))
    for n in range(1, rounds + 1):
        (lease,) = broker.leases()
        assert lease.user == "fav"
        broker.submit("fav", Size(gpus=1))  # fav always has one more waiting
        clock.advance(600)
        broker.release(lease.id)
        if hog.state is RequestState.GRANTED:
            return hog, n
    return hog, rounds


def test_a_starved_request_is_granted_before_it_waited_max_wait(make_broker, clock):
    policy = BrokerPolicy(weight_age_per_hour=0, max_wait_s=2 * HOUR)
    hog, rounds = starve_scenario(make_broker, clock, policy)
    assert hog.state is RequestState.GRANTED
    assert 1.5 * HOUR <= rounds * 600 <= 1.5 * HOUR + 600  # the tier starts at 3/4 of it


def test_without_aging_the_low_share_user_starves(make_broker, clock):
    policy = BrokerPolicy(weight_age_per_hour=0, max_wait_s=None)
    hog, rounds = starve_scenario(make_broker, clock, policy, rounds=40)
    assert hog.state is RequestState.QUEUED and rounds == 40


def test_age_weight_alone_eventually_wins(make_broker, clock):
    policy = BrokerPolicy(weight_age_per_hour=300, max_wait_s=None)
    hog, rounds = starve_scenario(make_broker, clock, policy)
    assert hog.state is RequestState.GRANTED and rounds * 600 < 6 * HOUR


def test_requests_that_cannot_fit_at_all_do_not_use_up_the_backfill_depth(make_broker, clock):
    """A pass examines at most ``backfill_depth`` blocked candidates. A size with no
    room anywhere (2 GPUs while one is free) is dropped at its first candidate, so a
    request that fits further down is still found."""
    broker = make_broker(whole_inventory(4), policy=SlurmPolicy(backfill_depth=3))
    for user, hours in (("a", 1), ("b", 4), ("c", 4)):
        broker.submit(user, Size(gpus=1), expected_duration_s=hours * HOUR)
    clock.advance(60)
    big = broker.submit("bigjob", Size(gpus=3), expected_duration_s=8 * HOUR)
    pairs = [broker.submit(f"p{i}", Size(gpus=2), expected_duration_s=HOUR) for i in range(5)]
    one = broker.submit("dave", Size(gpus=1), expected_duration_s=2 * HOUR)
    assert [e.request.id for e in broker.queue()][:2] == [big.id, pairs[0].id]
    assert one.state is RequestState.GRANTED, "the GPU the 3-GPU start does not need"
    assert big.state is RequestState.QUEUED
