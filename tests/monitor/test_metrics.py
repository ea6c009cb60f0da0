"""The Prometheus collector: every value is the broker's state at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from sim_machine import Machine

from jupyter_gpubroker.broker.reclaim import ReclaimConfig
from jupyter_gpubroker.monitor.metrics import BrokerCollector
from jupyter_gpubroker.nvml import backend


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> Iterator[Machine]:
    monkeypatch.setattr(backend, "GPM_MIN_INTERVAL_S", 0.0)  # virtual time: sample each pass
    m = Machine("dgx-h100-mig:2", reclaim=ReclaimConfig(idle_timeout_s=0), gpm=True)
    yield m
    m.close()


def test_values_match_the_state(machine: Machine) -> None:
    registry = CollectorRegistry()
    collector = BrokerCollector(machine.broker, lambda: machine.sampler.latest)
    collector.register(registry)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    leases = [machine.submit("1g.10gb", f"k{i}") for i in range(10)]
    held = [x for x in leases if x is not None]
    first = held[0].devices[0]
    gpu = machine.broker.inventory.device(first)
    assert gpu is not None
    machine.sim.set_load(first, utilization=40)
    machine.run(10)
    labels = {"uuid": first, "gpu": str(gpu.gpu_index), "profile": "1g.10gb"}
    assert value("gpubroker_device_allocated", **labels) == 1
    assert value("gpubroker_device_utilization_percent", **labels) == pytest.approx(40, abs=0.5)
    assert value("gpubroker_devices", profile="1g.10gb", state="held") == 10
    assert value("gpubroker_devices", profile="1g.10gb", state="free") == 4
    assert value("gpubroker_queue_length", job_class="interactive") == 0
    assert value("gpubroker_grants_total") == 10
    assert value("gpubroker_wait_seconds_count") == 10
    gpu_labels = {"uuid": gpu.gpu_uuid, "gpu": str(gpu.gpu_index)}
    reading = machine.sampler.latest[gpu.gpu_uuid]
    assert value("gpubroker_gpu_temperature_celsius", **gpu_labels) == reading.temperature_c
    assert value("gpubroker_gpu_power_watts", **gpu_labels) == reading.power_mw / 1000  # type: ignore[operator]
    assert value("gpubroker_gpu_healthy", **gpu_labels) == 1

    machine.sim.inject_overheat(gpu.gpu_uuid)
    machine.run(5)
    assert value("gpubroker_gpu_healthy", **gpu_labels) == 0
    assert value("gpubroker_device_drained", **labels) == 1
    # Packed: the 7 slices of the first GPU held, 3 of the second; drained counts first.
    assert value("gpubroker_devices", profile="1g.10gb", state="drained") == 7
    assert value("gpubroker_devices", profile="1g.10gb", state="held") == 3
    for i in range(6):
        machine.submit("1g.10gb", f"w{i}")
    assert value("gpubroker_queue_length", job_class="interactive") == 2
    machine.broker.reclaim(held[-1].id, "admin says so")
    assert value("gpubroker_reclaims_total", cause="admin") == 1
    assert value("gpubroker_wait_seconds_count") == 15  # the reclaim let one more in
    assert b"gpubroker_wait_seconds_bucket" in generate_latest(registry)
    collector.close()
    assert value("gpubroker_grants_total") is None  # left the registry
