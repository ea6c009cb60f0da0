"""``reclaim_action = "auto"``: suspend proven per GPU model by a canary of the broker's own
before a kernel relies on it, on the simulated checkpoint driver (a broker without a
server, sampled by hand), and the real driver's canary on a machine without CUDA."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest
from move_helpers import Kernels, broker, machine, proven

from jupyter_gpubroker.api.identity import Identity
from jupyter_gpubroker.api.rules import BrokerAPI
from jupyter_gpubroker.broker.clock import VirtualClock
from jupyter_gpubroker.broker.reclaim import KernelState
from jupyter_gpubroker.cli.status import idle_reclaim_lines
from jupyter_gpubroker.runtime import GPUBroker
from jupyter_gpubroker.suspend.canary import MIG_TEXT, ProcessCanary, prove
from jupyter_gpubroker.suspend.suspender import Suspender


@pytest.fixture(autouse=True)
def _listening() -> None:
    """No server here (the package's conftest serves one): these brokers are the test's
    own, and a server's broker beside them would share the simulated NVML's library."""


ROOT = Identity("root", admin=True)
MIXED = ("H100-80GB", "H100-80GB", "A100-80GB", ("H100-80GB", {"1g.10gb": 7}))
"""Two H100s, an A100 alone of its model, an H100 cut in slices."""


def said(rt: GPUBroker) -> dict[str, tuple[str, str]]:
    """Device label -> (action, reason), as ``GET devices`` shows them."""
    labels = {d.uuid: d.label for d in rt.core.inventory.devices}
    return {labels[u]: (v["action"], v["reason"]) for u, v in rt.idle_reclaim().items()}


def driver(rt: GPUBroker) -> Any:
    assert rt.suspender is not None
    return rt.suspender.suspender.driver


async def test_each_model_is_proven_on_its_own_gpus_and_mig_slices_are_shut_down(
    tmp_path: Path, monkeypatch: Any, caplog: Any
) -> None:
    with caplog.at_level(logging.INFO), broker(tmp_path, monkeypatch, machine(*MIXED)) as rt:
        before = said(rt)
        assert before["GPU 0"] == ("pending", "the canary has not run on a free H100-80GB GPU yet")
        assert before["GPU 3 / 1g.10gb@0"] == ("shutdown", MIG_TEXT)

        await proven(rt)
        after = said(rt)
        h100, a100 = after["GPU 0"], after["GPU 2"]
        assert after["GPU 1"] == h100 and h100[0] == "suspend"
        assert h100[1].startswith("the canary passed: suspended on GPU 0 in ")
        assert "restored onto GPU 1 in " in h100[1] and h100[1].endswith("its memory intact")
        assert a100[0] == "suspend" and ", restored in " in a100[1]  # alone: back in place
        assert {a for label, (a, _) in after.items() if "/" in label} == {"shutdown"}
        assert [c for c, _ in driver(rt).calls if c in ("checkpoint", "restore")] == [
            "checkpoint",
            "restore",
        ] * 2
        sim = rt.backend.simulator  # type: ignore[union-attr]
        assert all(not sim.process_memory(pid) for _, pid in driver(rt).calls)  # none left
        assert all(rt.core.placer.is_free(g.uuid) for g in rt.core.inventory.gpus[:3])

        # `status` says it in one line per answer, from the API's devices
        lines = idle_reclaim_lines(BrokerAPI(rt).devices(ROOT)["gpus"])
        assert lines == [
            f"Idle kernels on GPU 0, GPU 1 are suspended: {h100[1]}.",
            f"Idle kernels on GPU 2 are suspended: {a100[1]}.",
            "Idle kernels on GPU 3 / 1g.10gb@0, GPU 3 / 1g.10gb@1, GPU 3 / 1g.10gb@2, "
            "GPU 3 / 1g.10gb@3, GPU 3 / 1g.10gb@4, GPU 3 / 1g.10gb@5 and 1 more are shut "
            f"down: {MIG_TEXT}.",
        ]
        logged = [r.getMessage() for r in caplog.records if "idle reclaim" in r.getMessage()]
        assert logged == [
            f"GPU broker: idle reclaim shuts down the kernels of the 7 MIG slices: {MIG_TEXT}",
            f"GPU broker: idle reclaim suspends the kernels of the 2 H100-80GB GPU(s): {h100[1]}",
            f"GPU broker: idle reclaim suspends the kernels of the 1 A100-80GB GPU(s): {a100[1]}",
        ]


@pytest.mark.parametrize(
    "fault, words",
    [
        (
            lambda rt, pid: driver(rt).refuse.__setitem__(pid, "operation not supported"),
            "the canary could not be suspended: the driver cannot suspend this kernel: "
            "operation not supported",
        ),
        (
            lambda rt, pid: driver(rt).busy.add(pid),
            "the canary could not be suspended: the kernel's GPU work did not pause within 10 s",
        ),
        (
            lambda rt, pid: driver(rt).breaks.__setitem__(pid, "invalid argument"),
            "the canary could not be suspended: suspending failed and the kernel's GPU memory "
            "is lost: invalid argument",
        ),
        (  # the GPU it is restored onto has its memory taken outside the broker
            lambda rt, pid: rt.backend.simulator.set_load(  # type: ignore[union-attr]
                rt.core.inventory.gpus[1].uuid,
                memory_used_mib=rt.core.inventory.gpus[1].memory_mib - 100,
            ),
            "the canary could not be restored onto another GPU: its restore waits: ",
        ),
    ],
    ids=["refused", "lock-timeout", "checkpoint-fails", "no-room-on-the-other-gpu"],
)
async def test_a_canary_that_fails_shuts_its_model_down_saying_why(
    tmp_path: Path, monkeypatch: Any, fault: Any, words: str
) -> None:
    with broker(tmp_path, monkeypatch, machine("H100-80GB", "H100-80GB")) as rt:
        assert rt.canaries is not None
        start = rt.canaries.start

        def faulty(gpu: str) -> Any:
            canary = start(gpu)
            fault(rt, canary.pid)
            return canary

        rt.canaries.start = faulty
        await proven(rt)
        action, reason = said(rt)["GPU 0"]
        assert action == "shutdown" and reason.startswith(words), reason
        assert said(rt)["GPU 1"] == (action, reason)
        assert rt.core.placer.is_free(rt.core.inventory.gpus[0].uuid)  # given back


async def test_a_machine_without_the_checkpoint_api_runs_no_canary(
    tmp_path: Path, monkeypatch: Any
) -> None:
    with broker(tmp_path, monkeypatch, machine("H100-80GB")) as rt:
        driver(rt).why_unavailable = "the NVIDIA driver is older than r570"
        await proven(rt)
        assert said(rt)["GPU 0"] == (
            "shutdown",
            "this machine cannot suspend a kernel: the NVIDIA driver is older than r570",
        )
        assert driver(rt).calls == []


@pytest.mark.parametrize("action", ["shutdown", "suspend"])
def test_an_action_chosen_by_hand_is_said_as_such(
    tmp_path: Path, monkeypatch: Any, action: str
) -> None:
    with broker(tmp_path, monkeypatch, machine("H100-80GB"), reclaim_action=action) as rt:
        assert rt.canaries is None
        expected = {
            "shutdown": ("shutdown", "c.GPUBroker.reclaim_action is 'shutdown'"),
            "suspend": ("suspend", "c.GPUBroker.reclaim_action is 'suspend' (not proven)"),
        }
        assert said(rt)["GPU 0"] == expected[action]


async def run(rt: GPUBroker, seconds: float, lease_id: str) -> list[Any]:
    """Sampling passes every 5 s of the virtual clock, the lease renewed, its kernel idle."""
    made = []
    for _ in range(round(seconds / 5)):
        rt.core.clock.advance(5)  # type: ignore[attr-defined]
        if rt.core.lease(lease_id).state.value == "active":
            rt.core.renew(lease_id)
        made += await rt.sample()
        if rt.canaries is not None and rt.canaries.running is not None:
            await rt.canaries.running
    return made


async def test_a_kernel_due_before_its_model_can_be_proven_is_shut_down_then_the_canary_runs(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """One GPU, held by an idle kernel from the start: no free GPU for the canary, so the
    kernel is warned and shut down as today (never held forever waiting for a verdict);
    then the canary runs on the GPU it freed."""
    with broker(tmp_path, monkeypatch, machine("H100-80GB"), idle_timeout=300.0, grace=60.0) as rt:
        rt.core.clock = VirtualClock(time.time())
        kernels = Kernels(rt)
        try:
            lease_id, _ = kernels.start()
            rt.report_kernel(lease_id, KernelState("idle", rt.core.clock.now()))
            made = await run(rt, 300 + 60 + 10, lease_id)
            assert [d.action for d in made] == ["warn", "reclaim"]
            assert rt.on_reclaim(rt.core.lease(lease_id)) == "shutdown"
            kernels.close()  # its server shuts the kernel down
            rt.core.tick()  # the GPU, empty now, free again
            await run(rt, 10, lease_id)
            action, reason = said(rt)["GPU 0"]
            assert action == "suspend" and reason.startswith("the canary passed"), reason
        finally:
            kernels.close()


def test_the_real_canary_says_why_it_cannot_start_here() -> None:
    """This machine has no cuda-bindings: the canary process says so, and the verdict is
    a shutdown with its words; nothing is suspended."""

    class Refuses:  # the real driver here: never asked, the canary dies first
        def unavailable(self) -> None:
            return None

    suspender = Suspender(Refuses(), host_mib=lambda: 1e9)  # type: ignore[arg-type]
    verdict = prove(suspender, ProcessCanary, lambda pid: {}, ["GPU-none"])
    assert verdict.action == "shutdown"
    assert verdict.reason.startswith("the canary did not start: ")
    assert "cuda" in verdict.reason.lower()
