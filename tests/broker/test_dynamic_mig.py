"""Dynamic MIG: a waiting profile gets a slice cut from idle capacity."""

from __future__ import annotations

import pytest
from broker_helpers import FakePartitioner, allocations, mig_inventory, mig_uuid, whole_inventory

from jupyter_gpubroker.broker.core import BrokerConfig
from jupyter_gpubroker.broker.models import RequestState
from jupyter_gpubroker.wire.errors import InvalidRequest, PartitionFailed, Unsatisfiable
from jupyter_gpubroker.wire.sizes import Size

DYNAMIC = BrokerConfig(dynamic_mig=True)
THREE_G = Size(profile="3g.40gb")
ONE_G = Size(profile="1g.10gb")


@pytest.fixture
def seven_ones(make_broker):
    """One H100 cut into seven idle 1g.10gb slices, with a partitioner that re-cuts it."""
    inv = mig_inventory(gpus=1)
    part = FakePartitioner(inv)
    broker = make_broker(inv, config=DYNAMIC, partitioner=part)
    part.busy = lambda uuid: uuid in broker.holders()
    return broker, part


def test_a_waiting_3g_request_gets_a_recut_slice(seven_ones):
    broker, part = seven_ones
    events = []
    broker.subscribe(events.append)
    r = broker.submit("alice", THREE_G)
    assert r.state is RequestState.GRANTED
    lease = broker.lease(r.lease_id)
    (created,) = part.created
    assert lease.devices == (created.uuid,)
    assert (created.profile, created.start) == ("3g.40gb", 4)
    assert sorted(part.destroyed) == sorted(mig_uuid(0, "1g.10gb", s) for s in (4, 5, 6))
    assert lease.gpu_equivalents == pytest.approx(3 / 7)
    assert [e.kind for e in events] == ["queued", "repartitioned", "granted"]
    # the four slices left are still grantable, the destroyed ones are gone
    got = [broker.submit(u, ONE_G) for u in "abcde"]
    assert [g.state for g in got].count(RequestState.GRANTED) == 4


def test_the_recut_waits_for_busy_slices_to_go_idle(seven_ones):
    broker, part = seven_ones
    holders = [broker.submit(u, ONE_G) for u in "abcdefg"]  # every slice busy
    r = broker.submit("alice", THREE_G)
    assert r.state is RequestState.QUEUED
    assert part.created == [] and part.destroyed == []
    # freeing one slice in each half is not enough: both 3g placements overlap a busy one
    for h in (holders[0], holders[6]):
        broker.release(h.lease_id)
    assert r.state is RequestState.QUEUED and part.destroyed == []
    for h in holders[4:6]:
        broker.release(h.lease_id)
    assert r.state is RequestState.GRANTED
    assert part.created[0].start == 4
    for h in holders[1:4]:
        assert broker.lease(h.lease_id).devices[0] not in part.destroyed


def test_dynamic_mig_makes_missing_profiles_satisfiable(make_broker):
    inv = mig_inventory(gpus=1)
    broker = make_broker(inv)
    with pytest.raises(Unsatisfiable):
        broker.submit("alice", THREE_G)
    dyn = make_broker(inv, config=DYNAMIC, partitioner=FakePartitioner(inv))
    assert dyn.submit("alice", Size(profile="7g.80gb")).state is RequestState.GRANTED
    with pytest.raises(Unsatisfiable):
        dyn.submit("alice", Size(gpus=1))


def test_dynamic_mig_needs_a_partitioner(make_broker):
    with pytest.raises(InvalidRequest, match="partitioner"):
        make_broker(mig_inventory(gpus=1), config=DYNAMIC)


def test_gpus_with_mig_off_are_never_recut(make_broker):
    inv = whole_inventory(2)
    broker = make_broker(inv, config=DYNAMIC, partitioner=FakePartitioner(inv))
    with pytest.raises(Unsatisfiable):
        broker.submit("alice", ONE_G)


def test_a_failed_recut_leaves_the_request_waiting(make_broker):
    inv = mig_inventory(gpus=1)

    class Failing(FakePartitioner):
        def create(self, gpu_uuid, profile, start):
            raise PartitionFailed("nvmlDeviceCreateGpuInstanceWithPlacement: InsufficientResources")

    broker = make_broker(inv, config=DYNAMIC, partitioner=Failing(inv))
    r = broker.submit("alice", THREE_G)
    assert r.state is RequestState.QUEUED
    assert allocations(broker.store) == {}
    assert broker.queue()[0].request.id == r.id
