"""Requests and leases belong to live holders (DESIGN rule 5): a queued request lives
while its holder renews it, and a device goes to its next holder only once the last
one's processes have left it."""

from __future__ import annotations

import pytest
from broker_helpers import whole_inventory

from jupyter_gpubroker.broker.core import Broker, BrokerConfig
from jupyter_gpubroker.broker.models import Event, RequestState
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.wire.errors import Conflict
from jupyter_gpubroker.wire.sizes import Size

ONE_GPU = Size(gpus=1)


class Processes:
    """A process probe the test sets: device uuid -> pids running on it."""

    def __init__(self) -> None:
        self.on: dict[str, tuple[int, ...]] = {}

    def compute_pids(self, device_uuid: str) -> tuple[int, ...]:
        return self.on.get(device_uuid, ())


# ------------------------------------------------------------ queued requests


def test_a_queued_request_its_holder_stops_renewing_expires_and_is_granted_to_nobody(
    make_broker, clock
):
    broker = make_broker(whole_inventory(1), config=BrokerConfig(lease_ttl_s=100))
    seen = []
    broker.subscribe(seen.append)
    held = broker.submit("alice", ONE_GPU)
    left = broker.submit("bob", ONE_GPU)  # bob's CLI dies while it waits
    stays = broker.submit("carol", ONE_GPU)
    assert left.expires_at == clock.now() + 100 and left.to_json()["expires_at"] is not None
    clock.advance(60)
    broker.renew(held.lease_id)
    broker.renew_request(stays.id, "carol")
    clock.advance(40)  # bob's request is exactly 100 s old
    broker.tick()
    gone = broker.request(left.id)
    assert gone.state is RequestState.EXPIRED and "stopped renewing" in gone.reason
    assert broker.store.request(left.id).state is RequestState.EXPIRED
    expired = [e for e in seen if e.kind == "expired"]
    assert [(e.request_id, e.lease_id) for e in expired] == [(left.id, None)]
    assert [e.request.id for e in broker.queue()] == [stays.id]
    broker.release(held.lease_id)
    assert broker.request(stays.id).state is RequestState.GRANTED


def test_renewing_a_request_keeps_it_queued_and_is_committed(make_broker, clock):
    broker = make_broker(whole_inventory(1), config=BrokerConfig(lease_ttl_s=100))
    held = broker.submit("alice", ONE_GPU)
    r = broker.submit("bob", ONE_GPU)
    for _ in range(5):  # 250 s of waiting, renewed every 50 s
        clock.advance(50)
        broker.renew(held.lease_id)
        assert broker.renew_request(r.id, "bob").expires_at == clock.now() + 100
        broker.tick()
    assert broker.request(r.id).state is RequestState.QUEUED
    assert broker.store.request(r.id).expires_at == clock.now() + 100


def test_renewing_a_granted_request_changes_nothing_and_an_ended_one_is_a_conflict(
    make_broker, clock
):
    broker = make_broker(whole_inventory(1), config=BrokerConfig(lease_ttl_s=100))
    granted = broker.submit("alice", ONE_GPU)
    assert broker.renew_request(granted.id).state is RequestState.GRANTED
    queued = broker.submit("bob", ONE_GPU)
    clock.advance(100)
    broker.renew(granted.lease_id)
    broker.tick()
    with pytest.raises(Conflict, match="already ended"):
        broker.renew_request(queued.id, "bob")


def test_a_restarted_broker_gives_queued_requests_a_fresh_ttl(state_file, clock):
    config = BrokerConfig(lease_ttl_s=100)
    first = Broker(Store(state_file), whole_inventory(1), clock=clock, config=config)
    first.submit("alice", ONE_GPU)
    r = first.submit("bob", ONE_GPU)
    first.store.close()
    clock.advance(300)  # the broker was down longer than the TTL
    second = Broker(Store(state_file), whole_inventory(1), clock=clock, config=config)
    second.tick()
    assert second.request(r.id).state is RequestState.QUEUED
    assert second.request(r.id).expires_at == clock.now() + 100
    clock.advance(100)
    second.tick()
    assert second.request(r.id).state is RequestState.EXPIRED


# ------------------------------------------------------------ handing a device over


def test_a_released_device_with_no_process_on_it_is_granted_in_the_same_pass(make_broker):
    broker = make_broker(whole_inventory(1), processes=Processes())
    a = broker.submit("alice", ONE_GPU)
    b = broker.submit("bob", ONE_GPU)
    broker.release(a.lease_id)
    assert broker.request(b.id).state is RequestState.GRANTED
    assert broker.vacating() == {}


def test_a_device_goes_to_the_next_holder_only_once_the_last_ones_process_is_gone(
    make_broker, clock
):
    probe = Processes()
    broker = make_broker(whole_inventory(1), processes=probe)
    seen = []
    broker.subscribe(seen.append)
    a = broker.submit("alice", ONE_GPU)
    b = broker.submit("bob", ONE_GPU)
    (device,) = broker.lease(a.lease_id).devices
    probe.on[device] = (4242,)  # alice's kernel still has the GPU open
    broker.reclaim(a.lease_id, "idle for 2 hours")
    assert broker.request(b.id).state is RequestState.QUEUED
    assert broker.vacating()[device].pids == (4242,)
    (vacating,) = [e for e in seen if e.kind == "vacating"]
    assert (vacating.lease_id, vacating.detail["pids"]) == (a.lease_id, [4242])
    clock.advance(2)
    broker.renew_request(b.id)
    broker.tick()
    assert broker.request(b.id).state is RequestState.QUEUED
    del probe.on[device]  # the kernel was shut down
    clock.advance(2)
    broker.tick()
    assert broker.request(b.id).state is RequestState.GRANTED
    assert broker.lease(broker.request(b.id).lease_id).devices == (device,)
    assert broker.vacating() == {} and "vacated" in [e.kind for e in seen]


def test_a_device_its_last_holder_does_not_let_go_of_is_drained_naming_the_process(
    make_broker, clock
):
    probe = Processes()
    config = BrokerConfig(lease_ttl_s=600, vacate_timeout_s=30)
    broker = make_broker(whole_inventory(1), processes=probe, config=config)
    a = broker.submit("alice", ONE_GPU)
    b = broker.submit("bob", ONE_GPU)
    (device,) = broker.lease(a.lease_id).devices
    probe.on[device] = (4242,)  # revoked, the kernel keeps running with the device open
    broker.release(a.lease_id)
    clock.advance(29)
    broker.tick()
    assert broker.drained() == {} and broker.request(b.id).state is RequestState.QUEUED
    clock.advance(1)
    broker.tick()
    reason, _ = broker.drained()[device]
    assert "process 4242" in reason and a.lease_id in reason
    assert broker.vacating() == {} and broker.request(b.id).state is RequestState.QUEUED
    del probe.on[device]
    broker.undrain(device, "the process was killed")
    assert broker.request(b.id).state is RequestState.GRANTED


def test_a_promise_a_lingering_process_breaks_is_said_in_a_users_words(make_broker, clock):
    """The drain names the process for the admin; the waiting user reads what it means."""
    probe = Processes()
    config = BrokerConfig(lease_ttl_s=600, request_ttl_s=600, vacate_timeout_s=30)
    broker = make_broker(whole_inventory(1), processes=probe, config=config)
    seen: list[Event] = []
    broker.subscribe(seen.append)
    a = broker.submit("alice", ONE_GPU, limit_s=3600)
    b = broker.submit("bob", ONE_GPU, limit_s=3600)
    assert broker.promises.bound(b.id) is not None
    (device,) = broker.lease(a.lease_id).devices
    probe.on[device] = (4242,)
    broker.release(a.lease_id)
    clock.advance(30)
    broker.tick()
    (broken,) = [e for e in seen if e.kind == "promise_broken"]
    assert broken.user == "bob" and "4242" not in broken.detail["message"]
    assert broken.detail["message"].endswith(
        "cannot be kept: a process left on a GPU after its lease ended keeps it busy. "
        "No start can be promised for now."
    )


def test_a_restarted_broker_grants_no_device_a_process_still_runs_on(state_file, clock):
    probe = Processes()
    first = Broker(Store(state_file), whole_inventory(1), clock=clock, processes=probe)
    a = first.submit("alice", ONE_GPU)
    (device,) = first.lease(a.lease_id).devices
    first.release(a.lease_id)
    first.store.close()
    probe.on[device] = (4242,)  # the broker died, alice's process did not
    second = Broker(Store(state_file), whole_inventory(1), clock=clock, processes=probe)
    b = second.submit("bob", ONE_GPU)
    assert b.state is RequestState.QUEUED and device in second.vacating()
    del probe.on[device]
    second.tick()
    assert second.request(b.id).state is RequestState.GRANTED
