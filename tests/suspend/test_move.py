"""Moving kernels off a drained GPU onto a free one of its model (a broker without a server,
kernels as real processes listed on their GPUs, the simulated checkpoint driver)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from move_helpers import GIB, Kernels, api, broker, machine, proven, settled

from jupyter_gpubroker.api.identity import Identity
from jupyter_gpubroker.runtime import GPUBroker
from jupyter_gpubroker.suspend import ProcessState


@pytest.fixture(autouse=True)
def _listening() -> None:
    """No server here (the package's conftest serves one): these brokers are the test's
    own, and a server's broker beside them would share the simulated NVML's library."""


ROOT = Identity("root", admin=True)


def gpus(rt: GPUBroker) -> list[str]:
    return [g.uuid for g in rt.core.inventory.gpus]


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: Any) -> Any:
    """Three H100s and an H100 cut in 1g.10gb slices; suspend proven; kernels to start."""

    async def make(*models: Any, **traits: Any) -> tuple[GPUBroker, Kernels]:
        context = broker(tmp_path, monkeypatch, machine(*models), **traits)
        rt = context.__enter__()
        made.append((context, Kernels(rt)))
        await proven(rt)
        return rt, made[-1][1]

    made: list[Any] = []
    yield make
    for context, kernels in made:
        kernels.close()
        context.__exit__(None, None, None)


async def test_an_admins_drain_with_move_moves_the_kernel_and_says_so(rig: Any) -> None:
    rt, kernels = await rig("H100-80GB", "H100-80GB", "H100-80GB")
    lease_id, pid = kernels.start()
    await rt.sample()  # its memory on the GPU, as the broker reads it
    (old,) = rt.core.lease(lease_id).devices
    sim = kernels.sim

    answer = api(rt).drain(ROOT, old, {"reason": "fan replacement", "move": True})
    assert answer["moves"] == {lease_id: "moving"}
    assert answer["message"].endswith("; 1 of its 1 kernel(s) moving to other GPUs")
    await settled(rt)

    (new,) = rt.core.lease(lease_id).devices
    assert new != old and rt.core.lease(lease_id).state.value == "active"
    assert sim.process_memory(pid) == {new: 4 * GIB}  # the same process, on its new GPU
    assert rt.suspender.suspender.driver.state(pid) is ProcessState.RUNNING  # type: ignore[union-attr]
    shown = api(rt).lease(Identity("alice"), lease_id)
    onto = rt.core.inventory.device(new).label  # type: ignore[union-attr]
    text = f"moved from GPU 0 to {onto}: GPU 0 is drained by root: fan replacement"
    assert shown["moved"]["text"] == text and shown["moved"]["to"] == [new]
    (record,) = [a for a in api(rt).audit(ROOT)["audit"] if a["action"] == "move"]
    assert record["actor"] == "root" and record["target"] == lease_id
    assert record["detail"]["from"] == [old] and record["detail"]["to"] == [new]
    assert rt.core.drained()[old][0] == "drained by root: fan replacement"


async def test_a_gpu_too_hot_moves_its_kernels_with_the_words_their_notebooks_show(
    rig: Any,
) -> None:
    rt, kernels = await rig("H100-80GB", "H100-80GB", "H100-80GB", "H100-80GB")
    first, _ = kernels.start()
    second, _ = kernels.start()
    await rt.sample()
    hot = rt.core.lease(first).devices[0]
    kernels.sim.inject_overheat(hot, 95)
    await settled(rt)  # the health check drains it, and its kernel moves
    moved = rt.moved(first)
    assert moved is not None and moved["text"].endswith(": GPU 0 is too hot")
    assert rt.core.lease(first).devices[0] not in (hot, rt.core.lease(second).devices[0])
    assert rt.moved(second) is None  # the other GPU is fine: its kernel stays
    (record,) = [a for a in api(rt).audit(ROOT)["audit"] if a["action"] == "move"]
    assert record["actor"] == "health"


async def test_kernels_that_cannot_move_keep_their_gpu_and_are_told_why(rig: Any) -> None:
    rt, kernels = await rig("H100-80GB", "A100-80GB", ("H100-80GB", {"1g.10gb": 7}))
    h100, pid = kernels.start()  # a whole GPU alone of its model: none free to go to
    await rt.sample()
    (gpu,) = rt.core.lease(h100).devices
    label = rt.core.inventory.device(gpu).label  # type: ignore[union-attr]
    answer = api(rt).drain(ROOT, gpu, {"reason": "maintenance", "move": True})
    await settled(rt)
    assert answer["moves"] == {
        h100: f"{label} is drained by root: maintenance; this kernel cannot move: no free "
        "GPU of its model has the room"
    }
    assert rt.core.lease(h100).devices == (gpu,)  # a plain drain's: it keeps its lease
    assert kernels.sim.process_memory(pid) == {gpu: 4 * GIB}  # nothing was touched
    assert api(rt).lease(Identity("alice"), h100)["moved"]["to"] == []

    slice_lease = rt.core.submit("bob", _slice()).lease_id
    assert slice_lease is not None
    (mig,) = rt.core.lease(slice_lease).devices
    answer = api(rt).drain(ROOT, mig, {"reason": "re-layout", "move": True})
    assert answer["moves"][slice_lease].endswith(
        "this kernel cannot move: a MIG slice cannot be suspended: NVIDIA's checkpoint does "
        "not support MIG"
    )


async def test_a_kernel_whose_suspend_is_refused_stays_running_where_it_was(rig: Any) -> None:
    rt, kernels = await rig("H100-80GB", "H100-80GB")
    lease_id, pid = kernels.start()
    await rt.sample()
    (old,) = rt.core.lease(lease_id).devices
    rt.suspender.suspender.driver.refuse[pid] = "operation not supported"  # type: ignore[union-attr]
    api(rt).drain(ROOT, old, {"reason": "maintenance", "move": True})
    await settled(rt)
    assert rt.core.lease(lease_id).devices == (old,)
    assert kernels.sim.process_memory(pid) == {old: 4 * GIB}
    assert rt.suspender.suspender.driver.state(pid) is ProcessState.RUNNING  # type: ignore[union-attr]
    assert rt.moved(lease_id)["text"].endswith(  # type: ignore[index]
        "this kernel cannot move: the driver cannot suspend this kernel: operation not supported"
    )
    free = [u for u in gpus(rt) if u != old]
    assert all(rt.core.placer.is_free(u) for u in free)  # the GPU it was to get, given back


async def test_a_drain_without_move_moves_nothing(rig: Any) -> None:
    rt, kernels = await rig("H100-80GB", "H100-80GB")
    lease_id, _ = kernels.start()
    await rt.sample()
    (old,) = rt.core.lease(lease_id).devices
    answer = api(rt).drain(ROOT, old, {"reason": "maintenance"})
    await settled(rt)
    assert "moves" not in answer and rt.core.lease(lease_id).devices == (old,)


def _slice() -> Any:
    from jupyter_gpubroker.wire.sizes import Size

    return Size(profile="1g.10gb")
