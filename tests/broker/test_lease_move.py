"""``Broker.move``: a lease handed over to other devices (its kernel moved there) keeps its
id, its charge and its renewals; its old devices go back; the file has it after a restart."""

from __future__ import annotations

from broker_helpers import allocations, whole_inventory

from jupyter_gpubroker.broker.core import Broker
from jupyter_gpubroker.broker.models import Event
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.wire.sizes import Size


def test_a_moved_lease_holds_its_new_gpu_and_frees_the_old_one(make_broker, clock, store):
    broker = make_broker(whole_inventory(3))
    seen: list[Event] = []
    broker.subscribe(seen.append)
    lease = broker.lease(broker.submit("alice", Size(gpus=1), holder="k1").lease_id or "")
    (old,) = lease.devices
    new = next(g.uuid for g in broker.inventory.gpus if g.uuid != old)
    broker.devices.reserve([new])  # as the mover does while the kernel's memory moves
    clock.advance(60)
    broker.drain(old, "fan failure")
    broker.move(lease.id, [new], "moved from GPU 0 to GPU 1: GPU 0 is drained")

    assert broker.lease(lease.id).devices == (new,)
    assert broker.holders()[new].id == lease.id and old not in broker.holders()
    assert allocations(store) == {new: lease.id}
    moved = [e for e in seen if e.kind == "moved"]
    assert [(e.lease_id, e.detail["from"], e.detail["to"]) for e in moved] == [
        (lease.id, [old], [new])
    ]
    assert broker.usage()["alice"] > 0  # charged from its grant on, as before
    broker.renew(lease.id)  # the kernel renews the same lease

    broker.undrain(old, "fan replaced")
    other = broker.submit("bob", Size(gpus=1))
    assert broker.lease(other.lease_id or "").devices == (old,)  # the old GPU went back

    third = next(g.uuid for g in broker.inventory.gpus if g.uuid not in (old, new))
    assert broker.submit("carol", Size(gpus=1)).lease_id is not None
    assert broker.holders()[third].user == "carol"  # nothing granted twice


def test_a_move_outlives_a_restart(state_file, clock):
    inv = whole_inventory(2)
    first = Broker(Store(state_file), inv, clock=clock)
    lease_id = first.submit("alice", Size(gpus=1)).lease_id or ""
    (old,) = first.lease(lease_id).devices
    new = next(g.uuid for g in inv.gpus if g.uuid != old)
    first.devices.reserve([new])
    first.move(lease_id, [new], "moved")
    first.store.close()

    again = Broker(Store(state_file), inv, clock=clock)
    assert again.lease(lease_id).devices == (new,)
    assert again.holders()[new].id == lease_id
    assert again.placer.is_free(old) and not again.placer.is_free(new)
