"""Suspend proven on this host before any kernel relies on it (``reclaim_action = "auto"``).

NVIDIA's checkpoint API is young: drivers refuse it on some machines and chips, restoring
onto another GPU fails on some (NVIDIA/cuda-checkpoint#35), and a process that sees only
some GPUs may not be remapped (cuda-python#1983). So for each GPU model present the broker
runs a canary before it suspends a kernel there: a small process of its own holding a
known pattern in GPU memory, on a free GPU of that model and confined to it as a kernel is,
suspended and restored (onto another free GPU of the model where there is one: a kernel's
resume may land there) through the same ``Suspender`` and driver as a kernel, then asked
whether its pattern is intact. The model's ``Verdict`` follows: ``suspend`` where it passed,
``shutdown`` where it failed or could not run, with why; MIG slices are ``shutdown``
(NVIDIA's checkpoint does not support MIG). A model with no free GPU yet stays ``pending``
and is tried at the next sampling pass.

On the simulated driver the canary is a simulated process (a pid past Linux's range, listed
on its GPU) whose pattern is its memory as NVML lists it: the driver's faults decide.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from ..nvml.simulated import SimulatedNvml
from .suspender import Suspender

if TYPE_CHECKING:
    from ..broker.core import Broker

CANARY_MIB = 256
"""The canary's GPU memory: enough to cross several pages, little enough to go anywhere."""
START_S = 60.0
"""How long a canary process may take to start CUDA and fill its memory."""
MIG_TEXT = "a MIG slice cannot be suspended: NVIDIA's checkpoint does not support MIG"
Action = Literal["suspend", "shutdown", "revoke", "pending"]


@dataclass(frozen=True)
class Verdict:
    """What idle reclaim does to the kernels of some GPUs under ``auto``, and why."""

    action: Action
    reason: str


class Canary(Protocol):
    """One canary process, running on the GPU it was started on."""

    pid: int

    def check(self) -> str | None:
        """Why its pattern is not intact (None: it is)."""

    def stop(self) -> None: ...


Start = Callable[[str], Canary]
"""Start a canary on a GPU (its UUID), holding ``CANARY_MIB`` there."""
Where = Callable[[int], Mapping[str, float]]
"""Where NVML lists a process now: UUID -> MiB."""


class ProcessCanary:
    """``canary_process`` run on one GPU, as a kernel runs: ``CUDA_VISIBLE_DEVICES`` names
    it alone."""

    def __init__(self, gpu: str, mib: int = CANARY_MIB) -> None:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_gpubroker.suspend.canary_process", str(mib)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self.pid = self._proc.pid
        said = self._line(START_S)
        if said != "ready":
            self.stop()
            raise RuntimeError(said.removeprefix("error: ") or "the canary did not start")

    def _line(self, timeout_s: float) -> str:
        assert self._proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while self._proc.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([self._proc.stdout], [], [], 0.1)
            if ready:
                return self._proc.stdout.readline().strip()
        return ""

    def check(self) -> str | None:
        assert self._proc.stdin is not None
        self._proc.stdin.write("check\n")
        self._proc.stdin.flush()
        said = self._line(START_S)
        return None if said == "ok" else said.removeprefix("bad: ") or "it does not answer"

    def stop(self) -> None:
        self._proc.kill()
        self._proc.wait()


_SIMULATED_PIDS = itertools.count(4_300_000)
"""Past Linux's largest pid (4,194,304): never a real process's."""


class SimulatedCanary:
    """A canary on the simulated NVML: a process listed on its GPU with ``mib`` MiB."""

    def __init__(self, sim: SimulatedNvml, gpu: str, mib: int = CANARY_MIB) -> None:
        self.sim, self.mib, self.pid = sim, mib, next(_SIMULATED_PIDS)
        sim.add_process(gpu, self.pid, mib)

    def check(self) -> str | None:
        held = sorted(self.sim.process_memory(self.pid).values())
        return None if held == [self.mib] else f"NVML lists {held} MiB of it, not {self.mib}"

    def stop(self) -> None:
        for uuid in self.sim.process_memory(self.pid):
            self.sim.remove_process(uuid, self.pid)


def prove(
    suspender: Suspender,
    start: Start,
    where: Where,
    gpus: Sequence[str],
    label: Callable[[str], str] = str,
) -> Verdict:
    """Suspend a canary on ``gpus[0]`` and restore it onto ``gpus[1]`` (``gpus[0]`` where
    it is alone); its verdict, naming the GPUs by ``label``."""
    source, target = gpus[0], gpus[-1]
    try:
        canary = start(source)
    except Exception as e:
        return Verdict("shutdown", f"the canary did not start: {e}")
    try:
        listed = dict(where(canary.pid))
        t0 = time.monotonic()
        outcome, suspension = suspender.suspend(
            [source], {canary.pid: sum(listed.values())}, listed
        )
        if suspension is None:
            return Verdict("shutdown", f"the canary could not be suspended: {outcome.reason}")
        if where(canary.pid):
            return Verdict("shutdown", "the canary's memory stayed on the GPU once suspended")
        t1 = time.monotonic()
        resumed = suspender.resume(suspension, [target])
        if not resumed.done:
            onto = "another GPU" if target != source else "its GPU"
            why = f"the canary could not be restored onto {onto}: {resumed.reason}"
            return Verdict("shutdown", why)
        bad = canary.check() or (None if target in where(canary.pid) else "not on its new GPU")
        if bad is not None:
            return Verdict("shutdown", f"the canary's memory did not come back intact: {bad}")
        t2 = time.monotonic()
    finally:
        canary.stop()
    onto = f"restored onto {label(target)}" if target != source else "restored"
    return Verdict(
        "suspend",
        f"the canary passed: suspended on {label(source)} in {t1 - t0:.1f} s, {onto} in "
        f"{t2 - t1:.1f} s, its memory intact",
    )


class Canaries:
    """The verdict of each GPU model of the broker's machine, proven one model at a time."""

    def __init__(
        self,
        core: Broker,
        suspender: Suspender,
        start: Start,
        where: Where,
        log: logging.Logger,
    ) -> None:
        self.core, self.suspender, self.start, self.where = core, suspender, start, where
        self.log = log
        self.verdicts: dict[str, Verdict] = {}
        """GPU model -> its verdict, once one came."""
        self.running: asyncio.Task[None] | None = None
        self.own: set[int] = set()
        """The pid of the canary running now: the broker's own, never outside use."""

    def models(self) -> dict[str, list[str]]:
        """GPU model -> the UUIDs of its whole GPUs (MIG GPUs have none to prove)."""
        found: dict[str, list[str]] = {}
        for g in self.core.inventory.gpus:
            if not g.mig_enabled:
                found.setdefault(g.model or g.name, []).append(g.uuid)
        return found

    def verdict(self, device_uuid: str) -> Verdict:
        """What idle reclaim does on a GPU or device under ``auto``."""
        inventory = self.core.inventory
        device = inventory.device(device_uuid)
        gpu = inventory.gpu(device.gpu_uuid if device is not None else device_uuid)
        if gpu is None:
            return Verdict("shutdown", f"{device_uuid} is no GPU of this machine")
        if gpu.mig_enabled:
            return Verdict("shutdown", MIG_TEXT)
        model = gpu.model or gpu.name
        return self.verdicts.get(
            model, Verdict("pending", f"the canary has not run on a free {model} GPU yet")
        )

    def due(self) -> bool:
        return any(m not in self.verdicts for m in self.models())

    def may_prove(self, device_uuid: str) -> bool:
        """Whether a verdict on a pending device may still come soon: a canary runs now, or
        a GPU of its model is free for one (else a kernel due there is shut down as today)."""
        if self.running is not None and not self.running.done():
            return True
        inventory, placer = self.core.inventory, self.core.placer
        device = inventory.device(device_uuid)
        gpu = inventory.gpu(device.gpu_uuid if device is not None else device_uuid)
        model = None if gpu is None else gpu.model or gpu.name
        return any(placer.is_free(u) for u in self.models().get(model or "", ()))

    def kick(self) -> None:
        """Prove the models still pending, on the event loop (once at a time)."""
        if self.due() and (self.running is None or self.running.done()):
            self.running = asyncio.ensure_future(self.run())

    async def run(self) -> None:
        why = self.suspender.driver.unavailable()
        for model, gpus in self.models().items():
            if model in self.verdicts:
                continue
            if why is not None:
                cannot = f"this machine cannot suspend a kernel: {why}"
                self._decide(model, Verdict("shutdown", cannot))
                continue
            placer = self.core.placer
            free = [u for u in gpus if placer.is_free(u)][:2]
            if not free:
                continue  # every one held or drained: tried again at the next pass
            devices = self.core.devices
            devices.reserve(free)  # granted to nobody while the canary runs there
            try:
                verdict = await asyncio.to_thread(
                    prove, self.suspender, self._start, self.where, free, self._label
                )
            finally:
                self.own.clear()
                devices.unreserve(free)
                self.core.schedule()
            self._decide(model, verdict)

    def _label(self, uuid: str) -> str:
        device = self.core.inventory.device(uuid)
        return device.label if device is not None else uuid

    def _start(self, gpu: str) -> Canary:
        canary = self.start(gpu)
        self.own.add(canary.pid)
        return canary

    def _decide(self, model: str, verdict: Verdict) -> None:
        self.verdicts[model] = verdict
        n = len(self.models().get(model, ()))
        does = "suspends" if verdict.action == "suspend" else "shuts down"
        say = self.log.info if verdict.action == "suspend" else self.log.warning
        say(
            "GPU broker: idle reclaim %s the kernels of the %d %s GPU(s): %s",
            does,
            n,
            model,
            verdict.reason,
        )


def simulated_or_real(sim: SimulatedNvml | None) -> Start:
    """How to start a canary on this machine: simulated where its GPUs are."""
    if sim is not None:
        return lambda gpu: SimulatedCanary(sim, gpu)
    return ProcessCanary
