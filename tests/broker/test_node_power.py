"""Which sleeping nodes to wake and which idle ones to let sleep (``broker/node_power.py``),
on a core whose cluster view holds the sleeping node back as the Slurm engine's does:
node-a with four whole GPUs, always awake; node-c with two, under power saving."""

from __future__ import annotations

from collections.abc import Callable

from broker_helpers import on_nodes

from jupyter_gpubroker.broker.budgets import Quota
from jupyter_gpubroker.broker.core import Broker
from jupyter_gpubroker.broker.node_power import NO_CAP, Cap, Need, NodePower, Plan, plan_for
from jupyter_gpubroker.engines import ClusterView, apply_view
from jupyter_gpubroker.wire.sizes import Size

MakeBroker = Callable[..., Broker]
NEED_6 = Need(6, "forecast: at most 6.0 GPUs asked Thu 08:00-09:00 and Thu 09:00-10:00 (p90)")
TROUGH = Need(0, "forecast: no GPU asked Thu 20:00-21:00 and Thu 21:00-22:00 (p90)")


def cluster(make_broker: MakeBroker, node_c: str = "asleep") -> Broker:
    broker = make_broker(on_nodes({"node-a": [None] * 4, "node-c": [None] * 2}))
    asleep = {"node-c": f"Slurm: IDLE+POWERED_DOWN, {node_c}"} if node_c != "awake" else {}
    apply_view(broker, ClusterView(broker.inventory, asleep=asleep))
    return broker


def plan(broker: Broker, node_c: NodePower, need: Need | None, cap: Cap = NO_CAP) -> Plan:
    """The plan for node-a, awake, and ``node_c``, as the runtime asks it."""
    return plan_for(broker, [NodePower("node-a", "awake", idle=True), node_c], need, cap)


def test_a_sleeping_node_is_woken_when_the_forecast_asks_more_than_the_awake_ones_give(
    make_broker: MakeBroker,
) -> None:
    broker = cluster(make_broker)
    woken = plan(broker, NodePower("node-c", "asleep"), NEED_6)
    assert woken == Plan(
        (("node-c", f"{NEED_6.reason}; the awake nodes give 4.0 GPUs"),), frozenset({"node-c"})
    )
    # enough awake: nothing; one waking up counts as given; the cap spent: nothing ahead
    assert plan(broker, NodePower("node-c", "asleep"), Need(4, "")) == Plan()
    assert (
        plan(cluster(make_broker, "waking up"), NodePower("node-c", "waking up"), NEED_6) == Plan()
    )
    assert plan(broker, NodePower("node-c", "asleep"), NEED_6, Cap(spent=True)) == Plan()
    assert plan(broker, NodePower("node-c", "asleep"), None) == Plan()  # no forecast yet


def test_a_request_that_waits_wakes_a_node_that_fits_it_and_only_then(
    make_broker: MakeBroker,
) -> None:
    broker = cluster(make_broker)
    broker.set_quota("user", "ann", Quota(max_gpus=1))
    held = [broker.submit("ann", Size(gpus=1)), broker.submit("ann", Size(gpus=1))]
    assert held[1].lease_id is None  # three GPUs are free, but not for ann: no node wakes
    assert plan(broker, NodePower("node-c", "asleep"), None, Cap(spent=True)) == Plan()
    for user in ("bob", "cat", "dan"):
        broker.submit(user, Size(gpus=1))
    big = broker.submit("erin", Size(gpus=2))
    assert big.lease_id is None  # node-a is full
    woken = plan(broker, NodePower("node-c", "asleep"), None, Cap(spent=True))
    assert woken == Plan(
        (
            (
                "node-c",
                "a request for 2 GPUs waits, no awake GPU can take it, and node-c has room for it",
            ),
        )
    )
    too_big = broker.submit("fay", Size(gpus=4))
    assert too_big.lease_id is None
    broker.cancel(big.id)
    assert plan(broker, NodePower("node-c", "asleep"), None) == Plan()  # node-c has two


def test_an_idle_node_sleeps_in_a_trough_but_never_one_held_busy_or_waited_for(
    make_broker: MakeBroker,
) -> None:
    broker = cluster(make_broker, "awake")
    idle = NodePower("node-c", "awake", idle=True, may_sleep=True)
    assert plan(broker, idle, TROUGH) == Plan(
        down=(
            ("node-c", f"{TROUGH.reason}; node-c is idle, and the other awake nodes give 4.0 GPUs"),
        )
    )
    assert plan(broker, idle, Need(4, "")).down == (
        ("node-c", "; node-c is idle, and the other awake nodes give 4.0 GPUs"),
    )
    assert plan(broker, idle, Need(5, "")) == Plan()  # the forecast needs it
    assert plan(broker, idle, None) == Plan()  # no forecast: no trough
    assert plan(broker, NodePower("node-c", "awake", idle=False, may_sleep=True), TROUGH) == Plan()
    assert plan(broker, NodePower("node-c", "awake", idle=True, may_sleep=False), TROUGH) == Plan()
    # a waiting request that fits it (its user's quota holds it back)
    broker.set_quota("user", "ann", Quota(max_gpus=1))
    broker.submit("ann", Size(gpus=1))
    waiting = broker.submit("ann", Size(gpus=1))
    assert waiting.lease_id is None
    assert plan(broker, idle, TROUGH) == Plan()
    broker.cancel(waiting.id)
    # a lease on it
    for user in ("bob", "cat", "dan", "erin"):
        broker.submit(user, Size(gpus=1))
    assert any(broker.placer.devices[u].node == "node-c" for u in broker.placer.held)
    assert plan(broker, idle, TROUGH) == Plan()


def test_once_the_cap_is_spent_the_nodes_woken_ahead_sleep_whatever_the_forecast(
    make_broker: MakeBroker,
) -> None:
    broker = cluster(make_broker, "awake")
    idle = NodePower("node-c", "awake", idle=True, may_sleep=True)
    spent = Cap(True, frozenset({"node-c"}), "today's 1.0 h of GPUs kept awake ahead are spent")
    assert plan(broker, idle, NEED_6, spent) == Plan(
        down=(("node-c", "today's 1.0 h of GPUs kept awake ahead are spent; node-c is idle"),)
    )
    assert plan(broker, idle, NEED_6, Cap(True, frozenset(), "spent")) == Plan()  # not woken ahead
