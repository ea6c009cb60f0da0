"""Suspend on a machine with two GPU models (one H100, one A100): CUDA restores a process
only onto the chip it left, so a suspended kernel waits for a GPU of its own model, even
with the other model's GPU free, and is restored onto it with everything as it was."""

from __future__ import annotations

from typing import Any

import pytest
from suspend_cells import (
    KERNEL_MIB,
    Cell,
    driver_of,
    ended,
    granted,
    queued,
    until,
)

from jupyter_gpubroker.nvml import NvmlBackend, SimulatedNvml, Topology
from jupyter_gpubroker.nvml.presets import gpu_spec
from jupyter_gpubroker.runtime import inventory
from jupyter_gpubroker.wire.text import SUSPENDED_TEXT

pytestmark = pytest.mark.slow  # real kernels, seconds-long timeouts


@pytest.fixture
def broker_config(broker_config: dict[str, Any], monkeypatch: Any) -> dict[str, Any]:
    """The server's broker on one H100 and one A100 (no preset mixes models)."""
    machine = SimulatedNvml(Topology("two-models", (gpu_spec("H100-80GB"), gpu_spec("A100-80GB"))))
    monkeypatch.setattr(
        inventory, "open_backend", lambda *a, log=None, **k: NvmlBackend(machine, log=log).open()
    )
    return broker_config


async def test_a_kernel_resumes_only_onto_its_own_gpu_model(
    jp_serverapp: Any, api: Any, km: Any, simulator: Any, suspendable: Any
) -> None:
    kernel_id, pid, lease_id, gpu = suspendable
    _, gpus = await api("GET", "devices")
    models = {g["uuid"]: g["model"] for g in gpus["gpus"]}
    assert sorted(models.values()) == ["A100-80GB", "H100-80GB"]
    model = models[gpu]
    (elsewhere,) = models.keys() - {gpu}  # the other model's GPU

    # Another kernel waits for this kernel's model and gets its GPU once it is suspended.
    _, other = await api("POST", "requests", {"gpus": 1, "model": model, "holder": "other"})
    assert other["state"] == "queued"
    lease = await ended(api, lease_id)
    assert lease["suspended"]["model"] == model

    other = await until("the other request to get the GPU", granted(api, other["id"]))
    assert other["lease"]["devices"] == [gpu]

    # The next cell waits for a GPU of its model, though the other model's is free.
    cell = Cell(km.get_kernel(kernel_id), "print(sum(numbers), os.getpid())")

    await until("the cell to show its place in the queue", lambda: cell.shows("position 1"))
    assert f"This kernel is {SUSPENDED_TEXT}: waiting for one {model} GPU" in cell.text
    waiting = await queued(api, kernel_id)()
    assert waiting["position"] == 1 and waiting["model"] == model
    _, leases = await api("GET", "leases")
    assert [x["devices"] for x in leases["leases"]] == [[gpu]]  # it did not take the other
    assert not cell.task.done() and ("restore", pid) not in driver_of(jp_serverapp).calls
    # Nor does its wait hold up a request that any GPU fits: that one gets the other.
    _, third = await api("POST", "requests", {"gpus": 1, "holder": "third"})
    assert third["state"] == "granted" and third["lease"]["devices"] == [elsewhere]

    await api("DELETE", f"leases/{other['lease']['id']}")  # its own model's GPU frees
    out = await cell.result()
    assert out.endswith(f"Resumed on {gpu}.\n6 {pid}"), out  # same process, same variables
    assert simulator.process_memory(pid) == {gpu: KERNEL_MIB}
    _, lease = await api("GET", f"leases/{lease_id}")
    assert lease["suspended"] is None
    assert lease["reason"].endswith(f"resumed, its GPU memory back on the GPU ({gpu})")
