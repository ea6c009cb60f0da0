"""MIG slices cut ahead of the forecast, on the simulated NVML under a real core, state
file and partitioner: three days of two 3g.40gb slices asked 09:00-11:00 and two 7g.80gb
slices 21:00-23:00 on two H100s. On the fourth day the idle GPUs are cut to each hour's
profiles before it comes, so its requests are granted with no re-cut of their own; a held
slice is never destroyed; each re-cut is audited with its reason; off, nothing changes."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator

import pytest

from jupyter_gpubroker.broker.clock import VirtualClock
from jupyter_gpubroker.broker.config import BrokerConfig
from jupyter_gpubroker.broker.core import Broker, Event
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.nvml import MigPartitioner, open_backend
from jupyter_gpubroker.runtime.mig_ahead import MigAhead
from jupyter_gpubroker.wire.sizes import Size

HOUR, DAY = 3600.0, 86400.0
LOG = logging.getLogger("test-mig-ahead")
DAYTIME, NIGHT = Size(profile="3g.40gb"), Size(profile="7g.80gb")


def hold_two(broker: Broker, clock: VirtualClock, size: Size) -> None:
    """ann and bob each hold a slice of ``size`` for two hours."""
    held = [broker.submit(user, size) for user in ("ann", "bob")]
    assert all(r.lease_id for r in held), "the history's requests are granted at once"
    clock.advance(2 * HOUR)
    for r in held:
        broker.release(r.lease_id)  # type: ignore[arg-type]


@pytest.fixture
def machine(tmp_path) -> Iterator[tuple[Broker, VirtualClock, list[Event]]]:  # type: ignore[no-untyped-def]
    with open_backend("dgx-h100-mig:2", privilege="root") as backend:
        clock = VirtualClock(1_764_579_600.0)  # Monday 2025-12-01 09:00 UTC
        broker = Broker(
            Store(tmp_path / "state.sqlite"),
            backend.inventory(),
            clock=clock,
            config=BrokerConfig(dynamic_mig=True),
            partitioner=MigPartitioner(backend),
        )
        for day in range(3):
            hold_two(broker, clock, DAYTIME)  # 09:00-11:00
            clock.advance(10 * HOUR)
            hold_two(broker, clock, NIGHT)  # 21:00-23:00
            clock.advance((10 if day < 2 else 9) * HOUR)  # 09:00 the next day
        # Thursday 08:00, after the night's 7g.80gb slices
        events: list[Event] = []
        broker.subscribe(events.append)
        yield broker, clock, events
        broker.store.close()


def layout(broker: Broker) -> Counter[str]:
    return Counter(d.profile or "" for d in broker.inventory.devices)


def test_idle_gpus_are_cut_to_the_next_hours_profiles_before_it(
    machine: tuple[Broker, VirtualClock, list[Event]],
) -> None:
    broker, clock, events = machine
    assert layout(broker) == {"7g.80gb": 2}
    ahead = MigAhead(mig_ahead=True)
    ahead.cut_ahead(broker, LOG)
    assert layout(broker)["3g.40gb"] == 2
    cuts = [a for a in broker.store.audit() if a["action"] == "mig_cut_ahead"]
    assert [a["actor"] for a in cuts] == ["forecast", "forecast"]
    assert cuts[0]["detail"]["reason"] == (
        "forecast: two 3g.40gb slices asked at once Thu 08:00-09:00 or Thu 09:00-10:00 "
        "(median); cut a 3g.40gb slice from idle capacity"
    )
    ahead.cut_ahead(broker, LOG)  # what the forecast wants is there: nothing more
    assert len([a for a in broker.store.audit() if a["action"] == "mig_cut_ahead"]) == 2

    clock.advance(HOUR)  # 09:00: both are granted at once, with no re-cut of their own
    events.clear()
    granted = [broker.submit(user, DAYTIME) for user in ("ann", "bob")]
    assert all(r.lease_id for r in granted)
    assert [e.kind for e in events if e.kind == "repartitioned"] == []

    clock.advance(11 * HOUR)  # 20:00: ann still holds hers; bob has gone
    broker.release(granted[1].lease_id)  # type: ignore[arg-type]
    assert layout(broker) == {"3g.40gb": 2, "7g.80gb": 1}  # both 3g.40gb on one GPU
    held = broker.lease(granted[0].lease_id).devices  # type: ignore[arg-type]
    ahead.cut_ahead(broker, LOG)  # a 7g.80gb there would destroy ann's slice
    assert held[0] in {d.uuid for d in broker.inventory.devices}, "a held slice is never cut"
    assert layout(broker) == {"3g.40gb": 2, "7g.80gb": 1}

    clock.advance(HOUR / 2)  # 20:30: ann has gone too
    broker.release(granted[0].lease_id)  # type: ignore[arg-type]
    ahead.cut_ahead(broker, LOG)
    assert layout(broker) == {"7g.80gb": 2}
    night = [a for a in broker.store.audit() if a["action"] == "mig_cut_ahead"]
    assert len(night) == 3
    assert night[-1]["detail"]["reason"] == (
        "forecast: two 7g.80gb slices asked at once Thu 20:00-21:00 or Thu 21:00-22:00 "
        "(median); cut a 7g.80gb slice from idle capacity"
    )
    assert len(night[-1]["detail"]["destroyed"]) == 2


def test_nothing_is_cut_while_a_request_waits_or_when_it_is_off(
    machine: tuple[Broker, VirtualClock, list[Event]],
) -> None:
    broker, clock, _ = machine
    MigAhead(mig_ahead=False).cut_ahead(broker, LOG)
    assert layout(broker) == {"7g.80gb": 2}
    held = [broker.submit(user, NIGHT) for user in ("carol", "dan")]
    waiting = broker.submit("erin", NIGHT)
    assert all(r.lease_id for r in held) and waiting.lease_id is None
    MigAhead(mig_ahead=True).cut_ahead(broker, LOG)
    assert layout(broker) == {"7g.80gb": 2}
    assert not [a for a in broker.store.audit() if a["action"] == "mig_cut_ahead"]


def test_without_dynamic_mig_it_says_so_once(tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    with open_backend("dgx-h100-mig:1") as backend:
        broker = Broker(Store(tmp_path / "state.sqlite"), backend.inventory())
        ahead = MigAhead(mig_ahead=True)
        with caplog.at_level(logging.WARNING, LOG.name):
            ahead.cut_ahead(broker, LOG)
            ahead.cut_ahead(broker, LOG)
        assert [r.getMessage() for r in caplog.records] == [
            "GPU broker: mig_ahead does nothing without dynamic_mig, which lets the broker "
            "re-cut MIG GPUs"
        ]
        broker.store.close()
