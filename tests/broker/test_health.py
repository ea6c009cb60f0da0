"""Health: faults drain GPUs (no new grants), holders and watchers are told, drained state
survives a restart, and a GPU healthy for long enough takes grants again. The judge alone,
the broker's drain hooks, then faults injected into a simulated NVML machine sampled on a
virtual clock."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from broker_helpers import mig_inventory, whole_inventory
from sim_machine import Machine

from jupyter_gpubroker.broker.core import Broker
from jupyter_gpubroker.broker.health import (
    HW_THERMAL,
    SW_POWER_CAP,
    SW_THERMAL,
    HealthConfig,
    HealthJudge,
)
from jupyter_gpubroker.broker.models import DeviceEvent, DeviceReading, Health
from jupyter_gpubroker.broker.reclaim import ReclaimConfig
from jupyter_gpubroker.wire.errors import NotFound
from jupyter_gpubroker.wire.sizes import Size

GPU = "GPU-0"


def test_the_judge_reads_faults_from_readings() -> None:
    judge = HealthJudge()
    assert judge.faults(DeviceReading(GPU, temperature_c=60, clock_event_reasons=0)) == {}
    assert set(judge.faults(DeviceReading(GPU, temperature_c=90))) == {"temperature"}
    assert set(judge.faults(DeviceReading(GPU, clock_event_reasons=SW_THERMAL))) == {"throttling"}
    # At its power limit under full load a GPU works as designed: no drain by default.
    assert judge.faults(DeviceReading(GPU, clock_event_reasons=SW_POWER_CAP)) == {}
    strict = HealthJudge(HealthConfig(drain_clock_reasons=SW_POWER_CAP | HW_THERMAL))
    assert (
        "power cap"
        in strict.faults(DeviceReading(GPU, clock_event_reasons=SW_POWER_CAP))["throttling"]
    )
    assert set(judge.faults(DeviceReading(GPU, health=Health.LOST))) == {"lost"}
    assert set(judge.faults(DeviceReading(GPU, health=Health.UNREACHABLE))) == {"unreachable"}
    assert (
        HealthJudge(HealthConfig(max_temperature_c=None)).faults(
            DeviceReading(GPU, temperature_c=99)
        )
        == {}
    )


def test_hardware_xids_and_ecc_errors_drain_program_faults_do_not() -> None:
    judge = HealthJudge(HealthConfig(healthy_for_s=60))
    gpu_of = {GPU: GPU, "MIG-a": GPU}
    ok = {GPU: DeviceReading(GPU)}
    assert judge.assess(0, ok, [DeviceEvent("MIG-a", "xid", 43)], gpu_of) == []
    (change,) = judge.assess(5, ok, [DeviceEvent("MIG-a", "xid", 79)], gpu_of)
    assert change.drain and change.gpu_uuid == GPU and "Xid 79" in change.reason
    (again,) = judge.assess(10, ok, [DeviceEvent(GPU, "double_bit_ecc")], gpu_of)
    assert again.drain and "ECC" in again.reason  # a new kind of fault: a new reason
    assert judge.assess(15, ok, [DeviceEvent(GPU, "xid", 79)], gpu_of) == []  # known already
    assert judge.assess(74, ok, [], gpu_of) == []  # 59 s since the last fault
    (back,) = judge.assess(75, ok, [], gpu_of)
    assert not back.drain and back.gpu_uuid == GPU


def test_a_drained_device_is_never_placed_and_its_queue_waits(make_broker) -> None:
    broker: Broker = make_broker(mig_inventory(gpus=1))
    gpu = broker.inventory.gpus[0].uuid
    events: list = []
    broker.subscribe(events.append)
    held = broker.submit("ann", Size(profile="1g.10gb"), holder="k1")
    broker.drain(gpu, "temperature 91 C")
    waiting = broker.submit("bob", Size(profile="1g.10gb"))
    assert waiting.lease_id is None and broker.queue()[0].eta is None
    drained = [e for e in events if e.kind == "drained"]
    assert [(e.user, e.lease_id) for e in drained] == [("", None), ("ann", held.lease_id)]
    assert drained[1].detail == {"device": gpu, "reason": "temperature 91 C"}
    assert broker.drained()[gpu][0] == "temperature 91 C"
    broker.drain(gpu, "temperature 91 C")  # the same drain again: nothing new
    assert [e.kind for e in events].count("drained") == 2
    assert broker.lease(held.lease_id).state.value == "active"  # holders keep their leases
    broker.undrain(gpu, "healthy again")
    assert broker.request(waiting.id).state.value == "granted"
    assert [e.kind for e in events][-3:] == ["undrained", "undrained", "granted"]
    with pytest.raises(NotFound):
        broker.undrain(gpu, "twice")
    with pytest.raises(NotFound):
        broker.drain("GPU-nope", "x")


def test_one_drained_slice_leaves_the_others_grantable(make_broker) -> None:
    broker: Broker = make_broker(mig_inventory(gpus=1))
    slices = [d.uuid for d in broker.inventory.devices]
    broker.drain(slices[0], "Xid 94")
    grants = [broker.submit("ann", Size(profile="1g.10gb")) for _ in range(7)]
    held = {broker.lease(r.lease_id).devices[0] for r in grants if r.lease_id}
    assert len(held) == 6 and slices[0] not in held


def test_drains_survive_a_restart(make_broker) -> None:
    broker: Broker = make_broker(whole_inventory(2))
    gpu = broker.inventory.gpus[1].uuid
    broker.drain(gpu, "Xid 79")
    again: Broker = make_broker(whole_inventory(2))
    assert again.drained()[gpu][0] == "Xid 79"
    leases = [again.submit("ann", Size(gpus=1)) for _ in range(2)]
    assert [r.state.value for r in leases] == ["granted", "queued"]
    assert again.lease(leases[0].lease_id).devices == (again.inventory.gpus[0].uuid,)


@pytest.fixture
def machine() -> Iterator[Machine]:
    m = Machine(
        "dgx-h100-mig:2",
        health=HealthConfig(healthy_for_s=60),
        reclaim=ReclaimConfig(idle_timeout_s=0),
    )
    yield m
    m.close()


def test_overheating_drains_the_gpu_tells_holders_and_recovers(machine: Machine) -> None:
    lease = machine.submit("1g.10gb", "k1")
    assert lease is not None
    gpu = machine.broker.inventory.device(lease.devices[0]).gpu_uuid  # type: ignore[union-attr]
    machine.run(10)
    assert machine.broker.drained() == {}
    machine.sim.inject_overheat(gpu, 93)
    machine.run(5)
    reason, _ = machine.broker.drained()[gpu]
    assert "temperature 93 C" in reason and "thermal slowdown" in reason
    told = [e for e in machine.events if e.kind == "drained" and e.lease_id == lease.id]
    assert told and told[0].user == "ann" and told[0].request_id == lease.request_id
    # Its other slices are not granted; the second GPU's are.
    grants = [machine.submit("1g.10gb", f"k{i}") for i in range(8)]
    on = {machine.broker.inventory.device(x.devices[0]).gpu_uuid for x in grants if x}  # type: ignore[union-attr]
    assert gpu not in on and len([x for x in grants if x]) == 7
    machine.sim.clear_faults(gpu)
    machine.run(55)
    assert gpu in machine.broker.drained()  # cool, but not yet for 60 s
    machine.run(10)
    assert gpu not in machine.broker.drained()
    assert "undrained" in machine.kinds(lease.id)
    # The waiting request got a slice of the recovered GPU.
    assert machine.broker.queue() == []


def test_a_lost_gpu_is_drained_and_its_holders_told(machine: Machine) -> None:
    lease = machine.submit("1g.10gb", "k1")
    assert lease is not None
    gpu = machine.broker.inventory.device(lease.devices[0]).gpu_uuid  # type: ignore[union-attr]
    machine.sim.inject_gpu_lost(gpu)
    machine.run(5)
    assert "lost" in machine.broker.drained()[gpu][0]
    assert "drained" in machine.kinds(lease.id)
    (reading,) = [r for u, r in machine.sampler.latest.items() if u == gpu]
    assert reading.health is Health.LOST


def test_xid_events_from_nvml_drain_the_gpu(machine: Machine) -> None:
    slice_ = machine.broker.inventory.devices[0]
    machine.run(5)  # the first pass registers for events
    machine.sim.inject_xid(slice_.uuid, 43)  # the program's fault
    machine.run(5)
    assert machine.broker.drained() == {}
    machine.sim.inject_xid(slice_.uuid, 79)
    machine.run(5)
    assert "Xid 79" in machine.broker.drained()[slice_.gpu_uuid][0]
    events = machine.sampler.samples.events(slice_.uuid, 0)
    assert [(e["kind"], e["code"]) for e in events] == [("xid", 43), ("xid", 79)]


def test_a_restarted_broker_keeps_a_faulty_gpu_drained_until_healthy(machine: Machine) -> None:
    gpu = machine.broker.inventory.gpus[0].uuid
    machine.sim.inject_overheat(gpu)
    machine.run(5)
    machine.close()
    again = restarted(machine)
    try:
        again.run(30)
        assert gpu in again.broker.drained()  # adopted: healthy for 30 s only
        again.run(30)
        assert gpu not in again.broker.drained()
    finally:
        again.close()


def test_health_lifts_only_its_own_drains_also_after_a_restart(machine: Machine) -> None:
    """A GPU an admin (or a lingering process) drained stays drained when its health is
    fine: recovery undrains only what a health check drained."""
    held, hot = (g.uuid for g in machine.broker.inventory.gpus)
    machine.broker.drain(held, "replacing its fan")  # an admin's drain, no fault at all
    machine.sim.inject_overheat(hot)
    machine.run(5)
    machine.broker.drain(hot, "lingering process", cause="vacate")  # on top of the fault
    machine.close()
    again = restarted(machine)
    try:
        again.run(120)
        assert again.broker.drained()[held][0] == "replacing its fan"
        assert again.broker.drained_by("admin") == {held}
        assert again.broker.drained_by("vacate") == {hot}
    finally:
        again.close()


def restarted(machine: Machine) -> Machine:
    """A new broker and sampler on the same state file and clock (a restart)."""
    return Machine(
        "dgx-h100-mig:2",
        health=HealthConfig(healthy_for_s=60),
        store=machine.store,
        clock=machine.clock,
    )
