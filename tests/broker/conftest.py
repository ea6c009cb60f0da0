"""Fixtures of the broker core's tests: a virtual clock, an in-memory store, a state
file and a broker factory. Inventory helpers live in ``broker_helpers``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from broker_helpers import WEDNESDAY_10AM, whole_inventory

from jupyter_gpubroker.broker.clock import VirtualClock
from jupyter_gpubroker.broker.core import Broker, BrokerConfig, Partitioner, ProcessProbe
from jupyter_gpubroker.broker.models import Inventory
from jupyter_gpubroker.broker.policy import Policy
from jupyter_gpubroker.broker.store import Store


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(WEDNESDAY_10AM)


@pytest.fixture
def store() -> Iterator[Store]:
    s = Store()
    yield s
    s.close()


@pytest.fixture
def state_file(tmp_path: Path) -> Path:
    return tmp_path / "state.sqlite"


BrokerFactory = Callable[..., Broker]


@pytest.fixture
def make_broker(clock: VirtualClock, store: Store) -> BrokerFactory:
    """A broker on the in-memory store and the virtual clock; keywords override
    ``inventory`` (default: 4 whole GPUs), ``store``, ``policy``, ``config``, ``partitioner``,
    ``processes``.
    Calls share the test's store: a second broker restores what the first one wrote."""

    def make(
        inventory: Inventory | None = None,
        *,
        store: Store = store,
        policy: Policy | None = None,
        config: BrokerConfig | None = None,
        partitioner: Partitioner | None = None,
        processes: ProcessProbe | None = None,
    ) -> Broker:
        return Broker(
            store,
            inventory if inventory is not None else whole_inventory(4),
            clock=clock,
            policy=policy,
            config=config,
            partitioner=partitioner,
            processes=processes,
        )

    return make
