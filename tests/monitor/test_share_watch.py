"""A share nothing enforces is watched: its own processes' memory (NVML's per-process
use) over its share is warned, then reclaimed after the grace, like idleness; back within
its share, the warning is withdrawn. A share the driver or MPS holds is never warned."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from sim_machine import Machine

from jupyter_gpubroker.broker.core import BrokerConfig
from jupyter_gpubroker.broker.models import LeaseState
from jupyter_gpubroker.broker.sharing import Sharing
from jupyter_gpubroker.monitor.outside import OutsideWatch


@pytest.fixture
def machine() -> Iterator[Machine]:
    m = Machine("l40s-4:1", config=BrokerConfig(sharing=Sharing("shared")))
    m.sampler.outside = OutsideWatch(m.broker, m.events.append)
    yield m
    m.close()


def kernel_share(m: Machine, gb: int, kernel: str, used_mib: int, mps: bool = False) -> str:
    """A share whose kernel is this test's process, using ``used_mib`` of the GPU
    (as an MPS client where ``mps``)."""
    lease = m.submit(f"share={gb}GB", kernel)
    assert lease is not None
    assert m.sampler.outside is not None
    m.sampler.outside.holder_pids[lease.id] = os.getpid()
    m.sim.add_process(lease.devices[0], os.getpid(), used_mib, mps=mps)
    return lease.id


def test_a_watched_share_over_its_memory_is_warned_then_reclaimed(machine):
    machine.sampler.reclaimer.watched = lambda lease: True
    lease_id = kernel_share(machine, 8, "k1", 12 * 1024)
    (warned,) = machine.run(5)
    assert (warned.action, warned.cause) == ("warn", "over_share")
    assert warned.reason == "uses 12.8 GB of GPU 0, over its share of 8.0 GB"
    assert machine.run(55) == []  # the grace
    (reclaimed,) = machine.run(5)
    assert (reclaimed.action, reclaimed.cause) == ("reclaim", "over_share")
    assert machine.broker.lease(lease_id).state is LeaseState.RECLAIMED


def test_back_within_its_share_the_warning_is_withdrawn(machine):
    machine.sampler.reclaimer.watched = lambda lease: True
    lease_id = kernel_share(machine, 8, "k1", 12 * 1024)
    machine.run(5)
    machine.sim.add_process(machine.broker.lease(lease_id).devices[0], os.getpid(), 4 * 1024)
    (cleared,) = machine.run(5)
    assert (cleared.action, cleared.reason) == ("clear", "back within its share")
    assert machine.run(120) == []


def test_a_share_held_by_mps_or_the_driver_is_not_warned(machine):
    machine.sampler.reclaimer.watched = lambda lease: False
    kernel_share(machine, 8, "k1", 12 * 1024)
    assert machine.run(120) == []


def test_an_mps_share_whose_kernel_left_mps_is_warned_then_reclaimed(machine):
    machine.sampler.reclaimer.under_mps = lambda lease: True
    lease_id = kernel_share(machine, 8, "k1", 2 * 1024, mps=False)
    (warned,) = machine.run(5)
    assert (warned.action, warned.cause) == ("warn", "over_share")
    assert warned.reason == "uses GPU 0 outside MPS, so nothing holds it to its share of 8.0 GB"
    assert machine.run(55) == []
    (reclaimed,) = machine.run(5)
    assert reclaimed.action == "reclaim"
    assert machine.broker.lease(lease_id).state is LeaseState.RECLAIMED


def test_an_mps_client_within_its_share_is_left_alone_and_over_it_is_warned(machine):
    machine.sampler.reclaimer.under_mps = lambda lease: True
    lease_id = kernel_share(machine, 8, "k1", 2 * 1024, mps=True)
    assert machine.run(120) == []
    machine.sim.add_process(machine.broker.lease(lease_id).devices[0], os.getpid(), 9000, mps=True)
    (warned,) = machine.run(5)
    assert warned.reason == "uses 9.4 GB of GPU 0, over its share of 8.0 GB"
