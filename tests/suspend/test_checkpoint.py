"""The simulated checkpoint driver follows NVIDIA's documented states, and the suspender
gives every failure of issue 32's item 3 a plain outcome that loses nothing it need not."""

from __future__ import annotations

import subprocess

import pytest

from jupyter_gpubroker.nvml import SimulatedNvml, Topology
from jupyter_gpubroker.nvml.presets import gpu_spec
from jupyter_gpubroker.suspend import CheckpointError, Outcome, ProcessState, Suspender
from jupyter_gpubroker.suspend.cuda import CudaCheckpointDriver
from jupyter_gpubroker.suspend.simulated import SimulatedCheckpointDriver

KERNEL, HELPER = 4242, 4243
GIB = 1024.0


@pytest.fixture
def sim() -> SimulatedNvml:
    """GPUs 0 and 1: H100s; GPU 2: an A100; GPU 3: an H100 cut into 1g.10gb slices."""
    return SimulatedNvml(
        Topology(
            "suspend",
            (
                gpu_spec("H100-80GB"),
                gpu_spec("H100-80GB"),
                gpu_spec("A100-80GB"),
                gpu_spec("H100-80GB", {"1g.10gb": 7}),
            ),
        )
    )


@pytest.fixture
def driver(sim: SimulatedNvml) -> SimulatedCheckpointDriver:
    return SimulatedCheckpointDriver(sim)


def uuids(sim: SimulatedNvml) -> list[str]:
    return [g.uuid for g in sim._gpus]


def test_the_documented_cycle_moves_memory_off_the_gpu_and_back(sim, driver):
    gpu0, gpu1, *_ = uuids(sim)
    sim.add_process(gpu0, KERNEL, 3000)
    assert driver.state(KERNEL) is ProcessState.RUNNING
    driver.lock(KERNEL, 1000)
    assert driver.state(KERNEL) is ProcessState.LOCKED
    assert sim.process_memory(KERNEL) == {gpu0: 3000}  # locked: still on its GPU
    driver.checkpoint(KERNEL)
    assert driver.state(KERNEL) is ProcessState.CHECKPOINTED
    assert sim.process_memory(KERNEL) == {}  # NVML lists nothing: the GPU is free
    driver.restore(KERNEL, {gpu0: gpu1})
    assert driver.state(KERNEL) is ProcessState.LOCKED  # restore leaves it locked
    assert sim.process_memory(KERNEL) == {gpu1: 3000}
    driver.unlock(KERNEL)
    assert driver.state(KERNEL) is ProcessState.RUNNING


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda d, g: d.checkpoint(KERNEL), "running, not locked"),
        (lambda d, g: d.restore(KERNEL, {g: g}), "running, not checkpointed"),
        (lambda d, g: d.unlock(KERNEL), "running, not locked"),
    ],
)
def test_a_call_in_the_wrong_state_is_refused_and_changes_nothing(sim, driver, call, words):
    gpu0 = uuids(sim)[0]
    sim.add_process(gpu0, KERNEL, 100)
    with pytest.raises(CheckpointError, match=words):
        call(driver, gpu0)
    assert driver.state(KERNEL) is ProcessState.RUNNING
    assert sim.process_memory(KERNEL) == {gpu0: 100}


def test_a_process_without_cuda_cannot_be_checkpointed(driver):
    with pytest.raises(CheckpointError, match="does not use the GPU"):
        driver.state(999_999)


def test_the_machine_keeps_a_checkpoint_for_the_next_broker_until_its_process_exits(sim):
    gpu0, gpu1, *_ = uuids(sim)
    process = subprocess.Popen(["sleep", "60"])
    try:
        sim.add_process(gpu0, process.pid, 2000, follow=True)
        first = SimulatedCheckpointDriver(sim)
        first.lock(process.pid, 1000)
        first.checkpoint(process.pid)
        again = SimulatedCheckpointDriver(sim)  # a broker started again on the same machine
        assert again.state(process.pid) is ProcessState.CHECKPOINTED
        assert again.held() == {process.pid: {gpu0: 2000}}
    finally:
        process.kill()
        process.wait()
    with pytest.raises(CheckpointError, match="does not use the GPU"):  # its memory went too
        again.restore(process.pid, {gpu0: gpu1})
    assert again.held() == {} and sim.process_memory(process.pid) == {}


def test_a_lock_that_times_out_leaves_the_process_running(sim, driver):
    sim.add_process(uuids(sim)[0], KERNEL, 100)
    driver.busy.add(KERNEL)
    with pytest.raises(CheckpointError) as e:
        driver.lock(KERNEL, 50)
    assert e.value.timed_out
    assert driver.state(KERNEL) is ProcessState.RUNNING


def test_a_restore_needs_every_gpu_paired_onto_the_same_chip_with_room(sim, driver):
    gpu0, gpu1, a100, mig_gpu = uuids(sim)
    sim.add_process(gpu0, KERNEL, 3000)
    driver.lock(KERNEL, 1000)
    driver.checkpoint(KERNEL)
    with pytest.raises(CheckpointError, match="no GPU given"):
        driver.restore(KERNEL, {})
    with pytest.raises(CheckpointError, match="not a GPU of the same chip"):
        driver.restore(KERNEL, {gpu0: a100})
    assert driver.state(KERNEL) is ProcessState.CHECKPOINTED  # refused: still restorable
    driver.restore(KERNEL, {gpu0: gpu0})
    driver.unlock(KERNEL)
    assert sim.process_memory(KERNEL) == {gpu0: 3000}


def test_a_restore_without_the_memory_leaves_the_process_stuck_for_good(sim, driver):
    """NVIDIA/cuda-checkpoint#44: out of memory, then "OS call failed" for every later
    restore, even once the memory is free; the process says it is checkpointed."""
    gpu0, gpu1, *_ = uuids(sim)
    sim.add_process(gpu0, KERNEL, 3000)
    driver.lock(KERNEL, 1000)
    driver.checkpoint(KERNEL)
    sim.set_load(gpu1, memory_used_mib=sim.room(gpu1)[1] - 100)
    with pytest.raises(CheckpointError, match="out of memory") as e:
        driver.restore(KERNEL, {gpu0: gpu1})
    assert e.value.out_of_memory
    sim.set_load(gpu1, memory_used_mib=0)
    for target in (gpu1, gpu0):
        with pytest.raises(CheckpointError, match="OS call failed"):
            driver.restore(KERNEL, {gpu0: target})
    with pytest.raises(CheckpointError, match="checkpointed, not locked"):
        driver.unlock(KERNEL)
    assert driver.state(KERNEL) is ProcessState.CHECKPOINTED
    assert sim.process_memory(KERNEL) == {}


# -- the suspender: checks first, then a plain outcome for each failure


def suspender(driver, host_gib: float = 512.0) -> Suspender:
    return Suspender(driver, lock_timeout_s=2.0, host_mib=lambda: host_gib * GIB)


def test_suspend_and_resume_onto_another_gpu(sim, driver):
    gpu0, gpu1, *_ = uuids(sim)
    sim.add_process(gpu0, KERNEL, 10 * 1024)
    s = suspender(driver)
    outcome, suspension = s.suspend([gpu0], {KERNEL: 10 * GIB})
    assert outcome.done and outcome.reason == "suspended, its 10.7 GB of GPU memory on the host"
    assert sim.process_memory(KERNEL) == {}
    assert suspension is not None
    resumed = s.resume(suspension, [gpu1])
    assert resumed.done
    assert sim.process_memory(KERNEL) == {gpu1: 10 * 1024}
    assert driver.state(KERNEL) is ProcessState.RUNNING


def test_a_driver_without_the_api_falls_back_saying_why(sim):
    gpu0 = uuids(sim)[0]
    sim.add_process(gpu0, KERNEL, 100)
    driver = SimulatedCheckpointDriver(sim, unavailable="the NVIDIA driver is older than r570")
    outcome, _ = suspender(driver).suspend([gpu0], {KERNEL: 100})
    assert not outcome.done and not outcome.lost
    assert outcome.reason == (
        "this machine cannot suspend a kernel: the NVIDIA driver is older than r570"
    )
    assert sim.process_memory(KERNEL) == {gpu0: 100}


def test_a_mig_slice_falls_back_without_a_driver_call(sim, driver):
    slice_uuid = next(iter(sim._gpus[3].mig_devices())).uuid
    sim.add_process(slice_uuid, KERNEL, 100)
    outcome, _ = suspender(driver).suspend([slice_uuid], {KERNEL: 100})
    assert not outcome.done and "MIG slice cannot be suspended" in outcome.reason
    assert driver.calls == []


def test_a_host_without_the_memory_is_not_suspended(sim, driver):
    gpu0 = uuids(sim)[0]
    sim.add_process(gpu0, KERNEL, 40 * 1024)
    outcome, _ = suspender(driver, host_gib=32).suspend([gpu0], {KERNEL: 40 * GIB})
    assert not outcome.done
    assert outcome.reason == (
        "the machine has 34.3 GB of memory free, not enough to hold the kernel's 42.9 GB "
        "of GPU memory"
    )
    assert ("lock", KERNEL) not in driver.calls
    assert sim.process_memory(KERNEL) == {gpu0: 40 * 1024}


def test_a_kernel_whose_work_does_not_pause_is_left_running(sim, driver):
    gpu0 = uuids(sim)[0]
    sim.add_process(gpu0, KERNEL, 100)
    sim.add_process(gpu0, HELPER, 100)
    driver.busy.add(HELPER)  # the kernel locks, its helper process does not
    outcome, _ = suspender(driver).suspend([gpu0], {KERNEL: 100, HELPER: 100})
    assert not outcome.done and not outcome.lost
    assert outcome.reason == "the kernel's GPU work did not pause within 2 s"
    assert driver.state(KERNEL) is ProcessState.RUNNING  # the lock it got is let go
    assert driver.state(HELPER) is ProcessState.RUNNING


def test_an_unsupported_process_is_put_back_as_it_was(sim, driver):
    gpu0 = uuids(sim)[0]
    sim.add_process(gpu0, KERNEL, 100)
    sim.add_process(gpu0, HELPER, 200)
    driver.refuse[HELPER] = "operation not supported"  # e.g. UVM memory
    outcome, _ = suspender(driver).suspend([gpu0], {KERNEL: 100, HELPER: 200})
    assert not outcome.done and not outcome.lost
    assert outcome.reason == "the driver cannot suspend this kernel: operation not supported"
    # the kernel, checkpointed first, is back on its GPU and running
    assert sim.process_memory(KERNEL) == {gpu0: 100}
    assert driver.state(KERNEL) is ProcessState.RUNNING
    assert driver.state(HELPER) is ProcessState.RUNNING


def test_a_checkpoint_that_fails_all_the_same_says_the_memory_is_lost(sim, driver):
    gpu0 = uuids(sim)[0]
    sim.add_process(gpu0, KERNEL, 100)
    driver.breaks[KERNEL] = "unknown error"
    outcome, suspension = suspender(driver).suspend([gpu0], {KERNEL: 100})
    assert suspension is None and not outcome.done and outcome.lost
    assert outcome.reason == (
        "suspending failed and the kernel's GPU memory is lost: unknown error"
    )
    assert driver.state(KERNEL) is ProcessState.FAILED


def test_a_process_already_locked_is_not_touched(sim, driver):
    gpu0 = uuids(sim)[0]
    sim.add_process(gpu0, KERNEL, 100)
    driver.lock(KERNEL, 100)  # e.g. someone else's cuda-checkpoint
    outcome, _ = suspender(driver).suspend([gpu0], {KERNEL: 100})
    assert outcome.reason == f"the kernel's process {KERNEL} is locked, not running"
    assert driver.state(KERNEL) is ProcessState.LOCKED


def test_a_kernel_with_nothing_on_its_gpu_is_suspended_without_a_driver_call(sim, driver):
    """It has not used its GPU yet: its lease can go, and a resume has nothing to copy."""
    gpu0, gpu1, *_ = uuids(sim)
    s = suspender(driver)
    outcome, suspension = s.suspend([gpu0], {})
    assert outcome == Outcome(True, "suspended, nothing of it on the GPU")
    assert suspension is not None and s.resume(suspension, [gpu1]).done
    assert driver.calls == []


def test_a_restore_that_fails_says_whether_the_memory_is_kept(sim, driver):
    gpu0, gpu1, a100, _ = uuids(sim)
    sim.add_process(gpu0, KERNEL, 3000)
    s = suspender(driver)
    _, suspension = s.suspend([gpu0], {KERNEL: 3000})
    assert suspension is not None
    kept = s.resume(suspension, [a100])  # the driver refuses another chip, touching nothing
    assert not kept.done and not kept.lost
    assert kept.reason.endswith("its GPU memory stays on the host")
    driver.breaks[KERNEL] = "unknown error"
    lost = s.resume(suspension, [gpu0])
    assert not lost.done and lost.lost
    assert lost.reason == "its restore failed (unknown error); its GPU memory is lost"


def with_room(sim, driver) -> Suspender:
    """A suspender that reads the GPUs' free memory before a restore, as the broker's."""
    return Suspender(driver, host_mib=lambda: 512 * GIB, room=lambda uuid: sim.room(uuid)[1])


def test_a_restore_without_the_memory_waits_and_touches_nothing(sim, driver):
    gpu0, gpu1, *_ = uuids(sim)
    sim.add_process(gpu0, KERNEL, 3000)
    s = with_room(sim, driver)
    _, suspension = s.suspend([gpu0], {KERNEL: 3000.0}, {gpu0: 3000.0})
    assert suspension is not None and suspension.needs() == (3000.0,)
    sim.set_load(gpu1, memory_used_mib=sim.room(gpu1)[1] - 1024)  # 1 GiB left
    waits = s.resume(suspension, [gpu1])
    assert waits.waiting and not waits.done and not waits.lost
    assert waits.reason == (
        f"its restore waits: {gpu1} has 1.0 GB free, not the 3.1 GB the kernel's memory needs there"
    )
    assert ("restore", KERNEL) not in driver.calls  # issue 44: a failed one is for good
    sim.set_load(gpu1, memory_used_mib=0)
    assert s.resume(suspension, [gpu1]).done
    assert sim.process_memory(KERNEL) == {gpu1: 3000}


def test_a_restore_that_runs_out_of_memory_all_the_same_says_it_is_lost(sim, driver):
    """Memory taken between the check and the restore: the driver's out of memory is
    final, whatever state the driver reports afterwards."""
    gpu0, gpu1, *_ = uuids(sim)
    sim.add_process(gpu0, KERNEL, 3000)
    s = suspender(driver)  # no check first
    _, suspension = s.suspend([gpu0], {KERNEL: 3000})
    assert suspension is not None
    sim.set_load(gpu1, memory_used_mib=sim.room(gpu1)[1] - 10)
    lost = s.resume(suspension, [gpu1])
    assert lost.lost and lost.reason == "its restore failed (out of memory); its GPU memory is lost"


def test_the_real_driver_says_why_it_is_not_available_here():
    """This machine has no cuda-bindings and no NVIDIA driver: said, not raised."""
    why = CudaCheckpointDriver().unavailable()
    assert why is not None and "cuda" in why.lower()
