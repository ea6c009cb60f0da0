"""The broker's life cycle of a request: submit, queue, grant, renew, release, expire."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from broker_helpers import (
    WEDNESDAY_10AM,
    allocations,
    make_inventory,
    mig_inventory,
    whole_inventory,
)

from jupyter_gpubroker.broker import estimates
from jupyter_gpubroker.broker.core import BrokerConfig
from jupyter_gpubroker.broker.eta import Eta
from jupyter_gpubroker.broker.models import LeaseState, RequestState
from jupyter_gpubroker.wire.errors import (
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    Unsatisfiable,
)
from jupyter_gpubroker.wire.sizes import Size

HOUR = 3600.0


def rows(broker, table: str) -> int:
    return broker.store.conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


# ---------------------------------------------------------------- submit


def test_submit_is_granted_at_once_when_a_device_is_free(make_broker):
    broker = make_broker(whole_inventory(2))
    r = broker.submit("alice", Size(gpus=1), holder="kernel-1")
    assert r.state is RequestState.GRANTED
    lease = broker.lease(r.lease_id)
    assert lease.user == "alice" and lease.request_id == r.id
    assert lease.devices == (whole_inventory(2).devices[0].uuid,)
    assert lease.expires_at == WEDNESDAY_10AM + 120
    assert lease.profile == "gpu" and lease.gpu_equivalents == 1.0
    assert allocations(broker.store) == {lease.devices[0]: lease.id}
    assert broker.queue() == []


def test_submit_queues_with_position_and_an_eta_range_from_past_holds(make_broker, clock):
    broker = make_broker(whole_inventory(1))
    for held in (600, 1200, 1800, 2400, 3000):  # p10 600, p50 1800, p90 3000 (recency-weighted)
        past = broker.submit("alice", Size(gpus=1))
        clock.advance(held)
        broker.release(past.lease_id)
    broker.submit("alice", Size(gpus=1))
    clock.advance(60)
    bob = broker.submit("bob", Size(gpus=1), expected_duration_s=2 * HOUR)
    carol = broker.submit("carol", Size(gpus=1))
    assert bob.state is carol.state is RequestState.QUEUED
    queue, now = broker.queue(), clock.now()
    assert [(e.position, e.request.id) for e in queue] == [(1, bob.id), (2, carol.id)]
    # alice's lease, 60 s in, ends like her holds that lasted longer; bob, with no history
    # of his own, then holds like everyone's interactive holds
    assert queue[0].eta == Eta(now + 540, now + 1740, now + 2940)
    assert queue[1].eta == Eta(now + 1140, now + 3540, now + 5940)


def test_an_empty_queue_costs_no_start_estimates_however_many_leases(make_broker, monkeypatch):
    """Every event makes the queue's positions anew for the event streams: with nobody
    waiting, the leases' expected ends are not worked out (the API's grant-at-once path)."""
    broker = make_broker(whole_inventory(4))
    for i in range(4):
        broker.submit(f"user{i}", Size(gpus=1))
    estimated: list[int] = []
    real = estimates.predicted_starts
    monkeypatch.setattr(
        estimates, "predicted_starts", lambda *a: estimated.append(len(a[1])) or real(*a)
    )
    assert broker.queue() == []
    waiting = broker.submit("ann", Size(gpus=1))
    assert [e.request.id for e in broker.queue()] == [waiting.id]
    assert estimated == [1]


def test_behind_kernels_with_no_expected_end_the_eta_is_unknown_poll_after_poll(make_broker, clock):
    broker = make_broker(mig_inventory(gpus=1))
    for i in range(7):  # every slice held by a kernel that said nothing of its length
        broker.submit(f"user{i}", Size(profile="1g.10gb"), holder=f"kernel-{i}")
    clock.advance(3 * HOUR)  # past the class default: the old ETA was "now" at every poll
    waiting = [broker.submit(u, Size(profile="1g.10gb")) for u in ("ann", "bob", "cy")]
    for _ in range(3):
        for r in waiting:
            broker.renew_request(r.id)
        assert [(e.position, e.eta) for e in broker.queue()] == [(1, None), (2, None), (3, None)]
        clock.advance(8)


def test_a_submit_repeated_under_its_id_is_queued_once(make_broker):
    """A client that lost the answer to a submit sends it again under the same id."""
    b = make_broker(whole_inventory(1))
    b.submit("bob", Size(gpus=1))
    rid = "r-" + "ab" * 12
    first = b.submit("ada", Size(gpus=1), request_id=rid)
    assert b.submit("ada", Size(gpus=1), request_id=rid) is first
    assert [r.id for r in b.live_requests("ada")] == [rid]
    with pytest.raises(InvalidRequest):
        b.submit("eve", Size(gpus=1), request_id=rid)
    with pytest.raises(InvalidRequest):
        b.submit("ada", Size(gpus=1), request_id="r-../x")


def test_a_profile_request_takes_a_slice(make_broker):
    broker = make_broker(mig_inventory(gpus=1, layout=("3g.40gb", "2g.20gb", "1g.10gb")))
    r = broker.submit("alice", Size(profile="2g.20gb"))
    lease = broker.lease(r.lease_id)
    assert lease.profile == "2g.20gb"
    assert lease.gpu_equivalents == pytest.approx(2 / 7)


def test_a_multi_gpu_request_takes_all_of_its_gpus_at_once(make_broker):
    broker = make_broker(whole_inventory(4))
    r = broker.submit("alice", Size(gpus=3))
    assert len(broker.lease(r.lease_id).devices) == 3
    assert len(allocations(broker.store)) == 3
    r2 = broker.submit("bob", Size(gpus=2))
    assert r2.state is RequestState.QUEUED  # one GPU free is not two


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"user": "bad\nuser"}, "user name"),
        ({"user": ""}, "user name"),
        ({"groups": ["ok", "not\x00ok"]}, "group name"),
        ({"groups": [f"g{i}" for i in range(33)]}, "at most 32 groups"),
        ({"job_class": "urgent"}, "job class"),
        ({"holder": "k" * 257}, "holder"),
        ({"holder": 5}, "holder"),
        ({"expected_duration_s": 0}, "expected_duration_s"),
        ({"expected_duration_s": 5e-324}, "expected_duration_s"),
        ({"expected_duration_s": -5}, "expected_duration_s"),
        ({"expected_duration_s": float("nan")}, "expected_duration_s"),
        ({"expected_duration_s": 400 * 86400}, "expected_duration_s"),
        ({"expected_duration_s": True}, "expected_duration_s"),
        ({"expected_duration_s": "600"}, "expected_duration_s"),
    ],
)
def test_malformed_submits_are_refused_and_write_nothing(make_broker, kwargs, match):
    broker = make_broker()
    args = {"user": "alice", "size": Size(gpus=1), **kwargs}
    with pytest.raises(InvalidRequest, match=match):
        broker.submit(**args)
    assert rows(broker, "requests") == 0


@pytest.mark.parametrize(
    ("inventory", "size", "match"),
    [
        (mig_inventory(gpus=2), Size(profile="3g.40gb"), "available profiles: 1g.10gb"),
        (mig_inventory(gpus=2), Size(gpus=1), "has 0 GPU"),
        (whole_inventory(4), Size(gpus=5), "asks for 5 whole GPU"),
        (whole_inventory(4), Size(profile="1g.10gb"), "no GPU here offers"),
        (whole_inventory(2), Size(min_memory_gb=100), "largest has 85.5 GB"),
    ],
)
def test_unsatisfiable_requests_are_refused_and_write_nothing(make_broker, inventory, size, match):
    broker = make_broker(inventory)
    with pytest.raises(Unsatisfiable, match=match) as info:
        broker.submit("alice", size)
    assert info.value.status == 422
    assert rows(broker, "requests") == 0
    assert broker.queue() == []


def test_a_request_for_a_busy_profile_is_satisfiable_later(make_broker):
    broker = make_broker(make_inventory([None, ("7g.80gb",)]))
    broker.submit("alice", Size(profile="7g.80gb"))
    later = broker.submit("bob", Size(profile="7g.80gb"))
    assert later.state is RequestState.QUEUED


# ---------------------------------------------------------------- release and cancel


def test_release_gives_the_freed_device_to_the_waiting_request(make_broker, clock):
    inv = whole_inventory(3)
    broker = make_broker(inv)
    holders = [broker.submit(u, Size(gpus=1)) for u in ("a", "b", "c")]
    clock.advance(60)
    waiting = broker.submit("dave", Size(gpus=1))
    freed = broker.lease(holders[1].lease_id).devices
    clock.advance(60)
    lease = broker.release(holders[1].lease_id, "b")
    assert lease.state is LeaseState.RELEASED and lease.ended_at == clock.now()
    assert holders[1].state is RequestState.RELEASED
    assert waiting.state is RequestState.GRANTED
    assert broker.lease(waiting.lease_id).devices == freed
    assert allocations(broker.store)[freed[0]] == waiting.lease_id


def test_cancel_a_queued_request(make_broker):
    broker = make_broker(whole_inventory(1))
    holder = broker.submit("alice", Size(gpus=1))
    waiting = broker.submit("bob", Size(gpus=1))
    cancelled = broker.cancel(waiting.id, "bob")
    assert cancelled.state is RequestState.CANCELLED
    assert broker.queue() == []
    assert broker.store.request(waiting.id).state is RequestState.CANCELLED
    with pytest.raises(Conflict, match="already ended .cancelled."):
        broker.cancel(waiting.id, "bob")
    broker.release(holder.lease_id)
    assert broker.holders() == {}  # nobody left to take it


def test_cancelling_a_granted_request_releases_its_lease(make_broker):
    broker = make_broker(whole_inventory(1))
    r = broker.submit("alice", Size(gpus=1))
    nxt = broker.submit("bob", Size(gpus=1))
    broker.cancel(r.id, "alice")
    assert broker.lease(r.lease_id).state is LeaseState.RELEASED
    assert broker.request(r.id).state is RequestState.RELEASED
    assert nxt.state is RequestState.GRANTED


def test_ended_requests_and_leases_stay_readable(make_broker):
    broker = make_broker(whole_inventory(1))
    r = broker.submit("alice", Size(gpus=1))
    broker.release(r.lease_id)
    assert broker.request(r.id, "alice").state is RequestState.RELEASED
    assert broker.lease(r.lease_id, "alice").state is LeaseState.RELEASED
    assert broker.leases() == []


# ---------------------------------------------------------------- renew and expiry


def test_renew_extends_expires_at(make_broker, clock):
    broker = make_broker(config=BrokerConfig(lease_ttl_s=100))
    r = broker.submit("alice", Size(gpus=1))
    clock.advance(80)
    lease = broker.renew(r.lease_id, "alice")
    assert lease.expires_at == clock.now() + 100
    assert broker.store.lease(r.lease_id).expires_at == clock.now() + 100
    clock.advance(80)  # 160 s after the grant, 80 after the renewal
    broker.tick()
    assert broker.lease(r.lease_id).state is LeaseState.ACTIVE


def test_tick_expires_leases_not_renewed_and_frees_them_for_the_queue(make_broker, clock):
    broker = make_broker(whole_inventory(2), config=BrokerConfig(lease_ttl_s=100))
    alive = broker.submit("alice", Size(gpus=1))
    dead = broker.submit("bob", Size(gpus=1))
    waiting = broker.submit("carol", Size(gpus=1))
    dead_devices = broker.lease(dead.lease_id).devices
    clock.advance(99)
    broker.renew(alive.lease_id)
    broker.renew_request(waiting.id)  # carol still waits
    assert broker.tick() == []
    clock.advance(1)  # bob's lease is exactly 100 s old
    granted = broker.tick()
    assert broker.lease(dead.lease_id).state is LeaseState.EXPIRED
    assert broker.request(dead.id).state is RequestState.EXPIRED
    assert [lease.request_id for lease in granted] == [waiting.id]
    assert broker.lease(waiting.lease_id).devices == dead_devices
    assert broker.lease(alive.lease_id).state is LeaseState.ACTIVE


def test_an_expired_lease_can_no_longer_be_renewed(make_broker, clock):
    broker = make_broker(config=BrokerConfig(lease_ttl_s=10))
    r = broker.submit("alice", Size(gpus=1))
    clock.advance(11)
    broker.tick()
    with pytest.raises(Conflict, match="already ended"):
        broker.renew(r.lease_id, "alice")


def test_lease_ttl_is_validated():
    with pytest.raises(InvalidRequest):
        BrokerConfig(lease_ttl_s=0.5)


# ---------------------------------------------------------------- authorization


@pytest.fixture
def alices(make_broker):
    broker = make_broker(whole_inventory(1))
    granted = broker.submit("alice", Size(gpus=1))
    queued = broker.submit("alice", Size(gpus=1))
    return broker, granted, queued


@pytest.mark.parametrize(
    "call",
    [
        lambda b, g, q: b.release(g.lease_id, "mallory"),
        lambda b, g, q: b.renew(g.lease_id, "mallory"),
        lambda b, g, q: b.cancel(q.id, "mallory"),
        lambda b, g, q: b.cancel(g.id, "mallory"),
        lambda b, g, q: b.request(q.id, "mallory"),
        lambda b, g, q: b.lease(g.lease_id, "mallory"),
    ],
)
def test_another_users_objects_are_forbidden(alices, call):
    broker, granted, queued = alices
    with pytest.raises(Forbidden) as info:
        call(broker, granted, queued)
    assert info.value.status == 403
    assert broker.lease(granted.lease_id).state is LeaseState.ACTIVE
    assert queued.state is RequestState.QUEUED


@pytest.mark.parametrize(
    "call",
    [
        lambda b: b.release("l-nope", "alice"),
        lambda b: b.renew("l-nope", "alice"),
        lambda b: b.cancel("r-nope", "alice"),
        lambda b: b.request("r-nope"),
        lambda b: b.lease("l-nope"),
        lambda b: b.reclaim("l-nope", "idle"),
        lambda b: b.delete_quota("user", "nobody"),
    ],
)
def test_unknown_ids_are_not_found(alices, call):
    broker, _, _ = alices
    with pytest.raises(NotFound):
        call(broker)


def test_ended_objects_are_conflicts(alices):
    broker, granted, queued = alices
    broker.release(granted.lease_id, "alice")
    with pytest.raises(Conflict):
        broker.release(granted.lease_id, "alice")
    with pytest.raises(Conflict):
        broker.renew(granted.lease_id, "alice")
    with pytest.raises(Conflict):
        broker.cancel(granted.id, "alice")
    assert queued.state is RequestState.GRANTED
    broker.cancel(queued.id, "alice")  # cancelling a granted request releases it
    with pytest.raises(Conflict, match=r"already ended \(released\)"):
        broker.cancel(queued.id, "alice")


def test_admin_calls_without_a_user_may_act_on_anyone(alices):
    broker, granted, queued = alices
    broker.renew(granted.lease_id)
    lease = broker.reclaim(granted.lease_id, "idle for 2 hours")
    assert lease.state is LeaseState.RECLAIMED and lease.reason == "idle for 2 hours"
    assert broker.request(granted.id).state is RequestState.RECLAIMED
    assert queued.state is RequestState.GRANTED


# ---------------------------------------------------------------- events


def test_events_follow_a_request_through_its_life(make_broker, clock):
    broker = make_broker(whole_inventory(1), config=BrokerConfig(lease_ttl_s=10))
    seen = []
    broker.subscribe(seen.append)
    a = broker.submit("alice", Size(gpus=1))
    b = broker.submit("bob", Size(gpus=1))
    broker.release(a.lease_id)
    c = broker.submit("carol", Size(gpus=1))
    broker.cancel(c.id)
    clock.advance(10)
    broker.tick()
    kinds = [(e.kind, e.user) for e in seen]
    assert kinds == [
        ("queued", "alice"),
        ("granted", "alice"),
        ("queued", "bob"),
        ("released", "alice"),
        ("granted", "bob"),
        ("queued", "carol"),
        ("cancelled", "carol"),
        ("expired", "bob"),
    ]
    granted = seen[4]
    assert granted.request_id == b.id and granted.lease_id == b.lease_id
    assert granted.to_json()["data"]["devices"] == list(broker.lease(b.lease_id).devices)


def test_unsubscribe_and_a_broken_listener(make_broker):
    broker = make_broker()
    seen = []

    def broken(event):
        raise RuntimeError("watcher bug")

    broker.subscribe(broken)
    stop = broker.subscribe(seen.append)
    r = broker.submit("alice", Size(gpus=1))  # the broken watcher does not break it
    assert r.state is RequestState.GRANTED and len(seen) == 2
    stop()
    broker.submit("bob", Size(gpus=1))
    assert len(seen) == 2


# ---------------------------------------------------------------- usage


def test_usage_by_user_group_profile_and_class(make_broker, clock):
    broker = make_broker(make_inventory([None, None, ("3g.40gb", "3g.40gb")]))
    a = broker.submit("alice", Size(gpus=2), groups=["physics"], job_class="batch")
    b = broker.submit("bob", Size(profile="3g.40gb"), groups=["chem"])
    t0 = clock.now()
    clock.advance(HOUR)
    broker.release(a.lease_id)  # alice: 2 GPU-hours, ended
    clock.advance(HOUR)  # bob: still holding, 2 h * 3/7
    assert broker.usage(by="user") == pytest.approx({"alice": 2.0, "bob": 6 / 7})
    assert broker.usage(by="group") == pytest.approx({"physics": 2.0, "chem": 6 / 7})
    assert broker.usage(by="profile") == pytest.approx({"gpu": 2.0, "3g.40gb": 6 / 7})
    assert broker.usage(by="job_class") == pytest.approx({"batch": 2.0, "interactive": 6 / 7})
    day = datetime.fromtimestamp(t0, timezone.utc).date().isoformat()  # both hours in one day
    assert broker.usage(by="day") == pytest.approx({day: 2.0 + 6 / 7})
    # a window cuts both ended and live leases
    half = broker.usage(since=t0 + HOUR / 2, until=t0 + 1.5 * HOUR)
    assert half == pytest.approx({"alice": 1.0, "bob": 3 / 7})
    assert broker.usage(since=t0 + HOUR) == pytest.approx({"bob": 3 / 7})
    broker.release(b.lease_id)
    assert broker.usage(by="user") == pytest.approx({"alice": 2.0, "bob": 6 / 7})


def test_usage_refuses_bad_arguments(make_broker):
    broker = make_broker()
    with pytest.raises(InvalidRequest, match="after 'until'"):
        broker.usage(since=200.0, until=100.0)
    with pytest.raises(InvalidRequest, match="grouped by"):
        broker.usage(by="gpu")
