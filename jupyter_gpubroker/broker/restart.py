"""A broker's start on a state file that holds a past: memory rebuilt from the store.

The store is the truth (every change was committed before it was acknowledged); what the
broker keeps in memory, the fair-share ledger, the predictor's history, the live book and
the devices' holders, is read back from it, and whatever the file holds that cannot go on
is ended with a reason: a lease whose devices are gone, a queued request no device of
this inventory could ever satisfy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..wire.errors import Unsatisfiable
from .models import LeaseState, RequestState
from .predictor import held_shape

if TYPE_CHECKING:
    from .core import Broker


def restore(broker: Broker) -> None:
    """Rebuild ``broker``'s memory from its store after a start or a crash."""
    now = broker.clock.now()
    broker.budgets.restore(now)
    horizon = now - 10 * broker.policy.half_life_s
    for row in broker.store.ledger(since=horizon):
        broker.ledger.charge_past(
            row["user"], row["grp"], row["gpu_equivalents"], row["start"], row["end"], now
        )
        shape = held_shape(row["profile"], row["gpu_equivalents"])
        held_s = row["end"] - row["start"]
        broker.predictor.learn(row["user"], row["grp"], row["job_class"], shape, held_s)
    lost = broker.book.restore(now)
    broker.devices.restore([*broker.book.holder, *broker.book.shared], now)
    for lease, reason in lost:
        broker.book.end_lease(lease, LeaseState.RECLAIMED, reason, ("lost", {"reason": reason}))
    for r in [r for r in broker.book.live.values() if r.state is RequestState.QUEUED]:
        try:
            broker.scheduler.check_satisfiable(r.size)
        except Unsatisfiable as e:
            broker.book.end_queued(r, RequestState.REFUSED, e.message)
