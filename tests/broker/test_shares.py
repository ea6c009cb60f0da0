"""Shares of GPUs in the core: packed by memory and never over it, in the one queue
with whole requests, counted as their fraction, lent as the admin's rules say, and kept
in the state file as the file itself allows."""

from __future__ import annotations

import sqlite3

import pytest
from broker_helpers import WEDNESDAY_10AM, make_inventory, whole_inventory

from jupyter_gpubroker.broker.budgets import Quota
from jupyter_gpubroker.broker.core import BrokerConfig
from jupyter_gpubroker.broker.models import LeaseState, RequestState
from jupyter_gpubroker.broker.sharing import Sharing, SharingRule
from jupyter_gpubroker.wire.errors import InvalidRequest, Unsatisfiable
from jupyter_gpubroker.wire.sizes import Size

SHARED = BrokerConfig(sharing=Sharing("both"))
L40S = "L40S-48GB"  # 46068 MiB, 48.3 GB


def share(gb: float, compute: int | None = None) -> Size:
    return Size(share_gb=gb, compute_percent=compute)


def test_shares_pack_onto_one_gpu_and_never_over_its_memory(make_broker):
    b = make_broker(whole_inventory(2, L40S), config=SHARED)
    first = b.submit("ann", share(20))
    second = b.submit("bob", share(20))
    third = b.submit("cat", share(20))
    leases = {x.request_id: x for x in b.leases()}
    a, c = leases[first.id], leases[second.id]
    assert a.devices == c.devices, "best fit packs the second share beside the first"
    assert leases[third.id].devices != a.devices, "a third 20 GB would overflow 48.3 GB"
    assert a.shared and a.share_mib == 19074 and a.profile == "share"
    assert a.gpu_equivalents == pytest.approx(19074 / 46068)


def test_a_share_that_does_not_fit_waits_in_the_queue_with_its_position(make_broker):
    b = make_broker(whole_inventory(1, L40S), config=SHARED)
    b.submit("ann", share(26))
    b.submit("bob", share(16))
    waiting = b.submit("cat", share(8))
    assert waiting.state is RequestState.QUEUED
    (entry,) = b.queue()
    assert entry.request.id == waiting.id and entry.position == 1
    ann = next(x for x in b.leases() if x.user == "ann")
    b.release(ann.id)
    assert b.request(waiting.id).state is RequestState.GRANTED


def test_whole_requests_and_shares_share_one_queue(make_broker, clock):
    b = make_broker(whole_inventory(1, L40S), config=SHARED)
    s = b.submit("ann", share(8))
    whole = b.submit("bob", Size(gpus=1))
    assert whole.state is RequestState.QUEUED, "a GPU holding a share is not lent whole"
    b.release(b.request(s.id).lease_id)
    assert b.request(whole.id).state is RequestState.GRANTED
    later = b.submit("cat", share(8))
    assert later.state is RequestState.QUEUED, "a GPU held whole takes no share"


def test_a_share_counts_as_its_fraction_in_quotas_and_usage(make_broker, clock):
    b = make_broker(whole_inventory(2, L40S), config=SHARED)
    b.set_quota("user", "ann", Quota(max_gpus=0.5))
    first = b.submit("ann", share(20))  # 0.44 of a GPU
    second = b.submit("ann", share(8))  # 0.62 together: over the quota
    assert first.state is RequestState.GRANTED
    assert second.state is RequestState.QUEUED
    clock.advance(3600)
    assert b.usage()["ann"] == pytest.approx(19074 / 46068)


def test_sharing_rules_lend_gpus_whole_shared_or_both(make_broker):
    sharing = Sharing("whole", (SharingRule("shared", frozenset({"0"})),))
    b = make_broker(whole_inventory(2, L40S), config=BrokerConfig(sharing=sharing))
    shared = b.submit("ann", share(8))
    assert b.lease(shared.lease_id).devices == (b.inventory.gpus[0].uuid,)
    whole = b.submit("bob", Size(gpus=1))
    assert b.lease(whole.lease_id).devices == (b.inventory.gpus[1].uuid,)
    again = b.submit("cat", Size(gpus=1))
    assert again.state is RequestState.QUEUED, "GPU 0 is lent as shares only"


def test_a_time_of_day_rule_switches_a_gpu_without_taking_back_its_shares(make_broker, clock):
    night = SharingRule.from_dict({"mode": "whole", "start": "19:00", "end": "08:00"})
    config = BrokerConfig(sharing=Sharing("shared", (night,)))
    b = make_broker(whole_inventory(1, L40S), config=config)
    day = b.submit("ann", share(8))
    assert day.state is RequestState.GRANTED  # 10:00: shared
    clock.advance(10 * 3600)  # 20:00: whole
    b.schedule()
    evening = b.submit("bob", share(8))
    assert evening.state is RequestState.QUEUED
    assert b.lease(day.lease_id).state is LeaseState.ACTIVE, "nothing held is taken back"
    b.release(day.lease_id)
    assert b.submit("cat", Size(gpus=1)).state is RequestState.GRANTED


@pytest.mark.parametrize(
    ("inventory", "config", "size", "sentence"),
    [
        (
            whole_inventory(2, L40S),
            SHARED,
            share(60),
            "no GPU shared here has 60 GB; the largest has 48.3 GB",
        ),
        (
            whole_inventory(2, L40S),
            BrokerConfig(),
            share(8),
            "no GPU here is shared: the admin lends them whole only; ask for a whole GPU, or "
            "for a GPU of at least 8 GB, instead",
        ),
        (
            make_inventory([("1g.10gb",) * 7]),
            SHARED,
            share(4),
            "no GPU here is shared: each is cut into MIG slices, and a slice is never shared; "
            "ask for a slice (1g.10gb) instead",
        ),
    ],
)
def test_a_share_no_gpu_could_take_is_refused_with_why(
    make_broker, inventory, config, size, sentence
):
    b = make_broker(inventory, config=config)
    with pytest.raises(Unsatisfiable) as e:
        b.submit("ann", size)
    assert e.value.message == sentence
    assert b.live_requests() == []


def test_a_compute_share_over_100_is_refused_before_anything_is_written(make_broker, store):
    b = make_broker(whole_inventory(1, L40S), config=SHARED)
    with pytest.raises(InvalidRequest, match="a whole percent from 1 to 100, not 150"):
        b.submit("ann", Size(share_gb=8, compute_percent=150))
    assert store.conn.execute("SELECT COUNT(*) FROM requests").fetchone()[0] == 0


def test_shares_come_back_after_a_restart(make_broker):
    b = make_broker(whole_inventory(1, L40S), config=SHARED)
    kept = b.submit("ann", Size(share_gb=20, compute_percent=50))
    again = make_broker(whole_inventory(1, L40S), config=SHARED)
    lease = again.lease(kept.lease_id)
    assert (lease.share_mib, lease.compute_percent) == (19074, 50)
    assert again.submit("bob", share(20)).state is RequestState.GRANTED
    assert again.submit("cat", share(20)).state is RequestState.QUEUED, "the room is as it was"


def test_the_state_file_refuses_a_share_beyond_its_gpu(make_broker, store):
    b = make_broker(whole_inventory(1, L40S), config=SHARED)
    lease = b.lease(b.submit("ann", share(40)).lease_id)
    with pytest.raises(sqlite3.IntegrityError, match="does not fit"), store.transaction() as c:
        c.execute("INSERT INTO shares VALUES (?,?,?,?)", ("l-x", lease.devices[0], 8192, 46068))
    with pytest.raises(sqlite3.IntegrityError, match="shared"), store.transaction() as c:
        c.execute("INSERT INTO allocations VALUES (?,?)", (lease.devices[0], "l-y"))


def test_a_blocked_share_is_reserved_the_gpu_that_frees_first(make_broker, clock):
    b = make_broker(whole_inventory(2, L40S), config=SHARED)
    b.submit("ann", share(40), expected_duration_s=3600)
    b.submit("bob", share(40), expected_duration_s=600)
    big = b.submit("cat", share(40))
    reserved = b.placer.reserve(big.size, clock.now())
    bob = next(x for x in b.leases() if x.user == "bob")
    assert reserved == (frozenset(bob.devices), WEDNESDAY_10AM + 600)
    # a short share may backfill beside it only where it ends before the reservation
    small = b.submit("dan", share(4), expected_duration_s=60)
    assert small.state is RequestState.GRANTED


def test_a_waiting_share_starts_when_enough_of_its_gpu_frees(make_broker):
    b = make_broker(whole_inventory(1, L40S), config=SHARED)
    b.submit("ann", share(26), limit_s=3600)
    b.submit("bob", share(16), limit_s=7200)
    b.submit("cat", share(8), limit_s=600)
    b.submit("dan", share(34), limit_s=600)
    cat, dan = b.queue()
    assert cat.eta is not None and cat.eta.median == WEDNESDAY_10AM + 3600  # ann's 26 GB
    assert dan.eta is not None and dan.eta.median == WEDNESDAY_10AM + 7200  # and bob's
