"""The engine seam: a cluster's view drains what the engine holds back, and a grant of
several GPUs stays on one node."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from broker_helpers import on_nodes

from jupyter_gpubroker.broker.clock import VirtualClock
from jupyter_gpubroker.broker.core import Broker
from jupyter_gpubroker.broker.models import Inventory, Lease, RequestState
from jupyter_gpubroker.broker.policy import SlurmPolicy
from jupyter_gpubroker.engines import ENGINE, ClusterView, apply_view, release_ended
from jupyter_gpubroker.wire.errors import Unsatisfiable
from jupyter_gpubroker.wire.sizes import Size

MakeBroker = Callable[..., Broker]
HOUR = 3600.0


def two_nodes() -> Inventory:
    """node-a: GPUs 0-3 whole; node-b: GPUs 0-1 whole and GPU 2 cut into 7 x 1g.10gb."""
    return on_nodes({"node-a": [None] * 4, "node-b": [None, None, ["1g.10gb"] * 7]})


def nodes_of(broker: Broker, lease: Lease) -> set[str]:
    return {broker.placer.devices[u].node for u in lease.devices}


def test_a_multi_gpu_grant_never_spans_two_nodes(make_broker: MakeBroker) -> None:
    broker = make_broker(two_nodes())
    first = broker.submit("ann", Size(gpus=3))
    second = broker.submit("bob", Size(gpus=2))
    third = broker.submit("cat", Size(gpus=2))
    leases = {lease.request_id: lease for lease in broker.leases()}
    assert nodes_of(broker, leases[first.id]) == {"node-a"}
    assert nodes_of(broker, leases[second.id]) == {"node-b"}
    # one GPU left on node-a, none on node-b: two GPUs exist but not on one node
    assert third.id not in leases
    assert broker.request(third.id).state.value == "queued"


def test_best_fit_takes_the_node_with_fewest_free_that_fits(make_broker: MakeBroker) -> None:
    broker = make_broker(two_nodes())
    r = broker.submit("ann", Size(gpus=2))
    (lease,) = broker.leases()
    assert lease.request_id == r.id and nodes_of(broker, lease) == {"node-b"}


def test_a_multi_gpu_reservation_waits_for_k_gpus_on_one_node(make_broker, clock) -> None:
    """EASY's shadow time for 2 GPUs is when a node has 2 free, not when any 2 GPUs of
    the cluster are: a job short enough to end by then backfills the idle GPU."""
    broker = make_broker(
        on_nodes({"node-a": [None, None], "node-b": [None, None]}), policy=SlurmPolicy()
    )
    for user, hours in (("a", 1), ("b", 4), ("c", 2)):  # node-a GPU 0, node-a GPU 1, node-b GPU 0
        broker.submit(user, Size(gpus=1), expected_duration_s=hours * HOUR)
    clock.advance(60)
    big = broker.submit("bigjob", Size(gpus=2), expected_duration_s=8 * HOUR)
    # Any two GPUs are free in an hour (node-a's first and node-b's idle one), but two
    # on one node only in two hours (node-b's).
    short = broker.submit("dave", Size(gpus=1), expected_duration_s=1.5 * HOUR)
    long = broker.submit("erin", Size(gpus=1), expected_duration_s=3 * HOUR)
    assert big.state is RequestState.QUEUED
    assert short.state is RequestState.GRANTED, "ends before node-b has two GPUs free"
    assert nodes_of(broker, broker.lease(short.lease_id)) == {"node-b"}
    assert long.state is RequestState.QUEUED, "would still hold node-b's GPU at the big start"


def test_work_outside_the_broker_is_held_back_and_given_back(make_broker: MakeBroker) -> None:
    inv = two_nodes()
    broker = make_broker(inv)
    view = ClusterView(inv, outside={("node-b", "1g.10gb"): 5})
    apply_view(broker, view)
    held_back = broker.drained_by(ENGINE)
    assert len(held_back) == 5
    assert all(broker.placer.devices[u].profile == "1g.10gb" for u in held_back)
    reason = broker.drained()[next(iter(held_back))][0]
    assert reason == "5 of 7 1g.10gb on node-b in use outside the broker"
    apply_view(broker, view)  # idempotent
    assert broker.drained_by(ENGINE) == held_back
    granted = [broker.submit(u, Size(profile="1g.10gb")) for u in ("ann", "bob", "cat")]
    assert [broker.request(r.id).state.value for r in granted] == ["granted", "granted", "queued"]
    apply_view(broker, ClusterView(inv, outside={("node-b", "1g.10gb"): 1}))
    assert len(broker.drained_by(ENGINE)) == 1
    assert broker.request(granted[2].id).state.value == "granted"  # freed capacity is used


def test_a_down_node_is_drained_with_the_engines_reason_and_a_gone_node_too(
    make_broker: MakeBroker,
) -> None:
    inv = two_nodes()
    broker = make_broker(inv)
    apply_view(broker, ClusterView(inv, down={"node-a": "Reason=maintenance [root]"}))
    reasons = {broker.drained()[u][0] for u in broker.drained_by(ENGINE)}
    assert reasons == {"node-a: Reason=maintenance [root]"}
    assert len(broker.drained_by(ENGINE)) == 4
    only_a = Inventory(
        tuple(g for g in inv.gpus if g.node == "node-a"),
        tuple(d for d in inv.devices if d.node == "node-a"),
    )
    apply_view(broker, ClusterView(only_a))
    reasons = {broker.drained()[u][0] for u in broker.drained_by(ENGINE)}
    assert reasons == {"node-b: node node-b is no longer in the cluster"}


def test_an_admins_drain_keeps_its_reason(make_broker: MakeBroker) -> None:
    inv = two_nodes()
    broker = make_broker(inv)
    gpu = next(g.uuid for g in inv.gpus if g.node == "node-a")
    broker.drain(gpu, "swap the fan", cause="admin")
    apply_view(broker, ClusterView(inv, down={"node-a": "down"}))
    assert broker.drained()[gpu][0] == "swap the fan" and broker.drain_cause(gpu) == "admin"
    apply_view(broker, ClusterView(inv))
    assert broker.drain_cause(gpu) == "admin"


def test_more_gpus_than_any_one_node_has_are_refused_at_once(make_broker: MakeBroker) -> None:
    broker = make_broker(two_nodes())  # 6 whole GPUs in all, at most 4 on one node
    with pytest.raises(Unsatisfiable, match="the largest node has 4 GPU"):
        broker.submit("ann", Size(gpus=5))
    assert broker.queue() == []


def test_a_lease_the_engine_no_longer_runs_is_released_after_the_grace(
    make_broker: MakeBroker, clock: VirtualClock
) -> None:
    inv = two_nodes()
    broker = make_broker(inv)
    held = broker.submit("ann", Size(gpus=1))
    gone = broker.submit("bob", Size(gpus=1))
    ids = {r.id: broker.request(r.id).lease_id for r in (held, gone)}
    view = ClusterView(inv, holders={ids[held.id]: "41"})
    assert release_ended(broker, ClusterView(inv), 60, "Slurm job") == []  # holders not tracked
    assert release_ended(broker, view, 60, "Slurm job") == []  # its job may still be on its way
    clock.advance(61)
    assert release_ended(broker, view, 60, "Slurm job") == [ids[gone.id]]
    ended = broker.request(gone.id)
    assert ended.state.value == "released" and ended.reason == "its Slurm job ended"
    assert broker.request(held.id).state.value == "granted"


def test_a_node_that_joins_the_cluster_is_placed_on_at_the_next_view(
    make_broker: MakeBroker,
) -> None:
    """An admin adds a node to Slurm (or Kubernetes): the broker's next reading of the
    engine places the queue's requests there, without a restart."""
    broker = make_broker(two_nodes())
    broker.submit("ann", Size(gpus=4))  # node-a
    broker.submit("bob", Size(gpus=2))  # node-b's two whole GPUs
    cat = broker.submit("cat", Size(gpus=2))
    dan = broker.submit("dan", Size(gpus=1))
    queued = [e.request for e in broker.queue()]
    assert {r.id for r in queued} == {cat.id, dan.id}, "no whole GPU left"
    bigger = on_nodes(
        {"node-a": [None] * 4, "node-b": [None, None, ["1g.10gb"] * 7], "node-c": [None] * 4}
    )
    added = apply_view(broker, ClusterView(bigger))
    assert {d.node for d in added} == {"node-c"} and len(added) == 4
    for r in queued:
        lease = broker.lease(broker.request(r.id).lease_id or "")
        assert nodes_of(broker, lease) == {"node-c"}
    assert apply_view(broker, ClusterView(bigger)) == [], "a view applied twice adds nothing"
    assert len(broker.inventory.gpus) == 4 + 3 + 4


def test_gres_removed_from_a_node_that_stays_is_drained_and_comes_back(
    make_broker: MakeBroker,
) -> None:
    """An admin takes two of node-a's four GPUs out of the engine's configuration (Slurm's
    gres count, a device plugin's allocatable): the broker stops placing on them at its next
    reading, keeps the rest of the node, and places on them again when they return."""
    inv = two_nodes()
    broker = make_broker(inv)
    gone = {d.uuid for d in inv.devices if d.node == "node-a" and d.gpu_index >= 2}
    smaller = Inventory(inv.gpus, tuple(d for d in inv.devices if d.uuid not in gone))
    apply_view(broker, ClusterView(smaller))
    assert broker.drained_by(ENGINE) == gone
    assert {broker.drained()[u][0] for u in gone} == {
        "node-a: the engine no longer lists this gpu device"
    }
    ann = broker.submit("ann", Size(gpus=3))
    assert ann.state is RequestState.QUEUED, "node-a has two GPUs left, node-b two"
    apply_view(broker, ClusterView(inv))
    assert broker.drained_by(ENGINE) == set()
    lease = broker.lease(broker.request(ann.id).lease_id or "")
    assert nodes_of(broker, lease) == {"node-a"}
