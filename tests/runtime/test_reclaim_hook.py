"""``c.GPUBroker.reclaim_hook``: the admin's say before a lease is warned or reclaimed,
on a simulated workstation sampled every 5 s of a virtual clock, with kernels whose
state their renewals report (as a remote server's do)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest
from runtime_helpers import make
from traitlets import TraitError

from jupyter_gpubroker.broker.clock import VirtualClock
from jupyter_gpubroker.broker.reclaim import Candidate, Decision, KernelState
from jupyter_gpubroker.runtime import GPUBroker
from jupyter_gpubroker.runtime.reclaim import KEPT_BY_HOOK
from jupyter_gpubroker.wire.sizes import Size

TIMEOUTS = {"idle_timeout": 600.0, "grace": 120.0, "reclaim_action": "shutdown"}
"""Reclaims that shut kernels down (the hook is asked the same under every action)."""


def started(tmp_path: Path, **traits: Any) -> GPUBroker:
    rt = make(tmp_path, identity="username", simulate="dgx-h100:3", **TIMEOUTS, **traits)
    rt.start()
    rt.core.clock = VirtualClock(time.time())
    return rt


def idle_lease(rt: GPUBroker, user: str, kernel: str) -> str:
    """A lease of ``user``'s kernel, which ran its last cell now and reports it."""
    lease_id = rt.core.submit(user, Size(gpus=1), holder=kernel).lease_id
    assert lease_id is not None
    rt.report_kernel(lease_id, KernelState("idle", rt.core.clock.now()))
    return lease_id


def run(rt: GPUBroker, seconds: float) -> list[Decision]:
    """Sampling passes every 5 s, each lease renewed by its holder."""
    made: list[Decision] = []
    for _ in range(round(seconds / 5)):
        rt.core.clock.advance(5)
        for lease in rt.core.leases():
            rt.core.renew(lease.id)
        assert rt.sampler is not None
        made += rt.sampler.sample()
    return made


def test_a_hook_keeps_one_users_lease_and_the_others_go_on(tmp_path: Path) -> None:
    asked: list[Candidate] = []

    def spare_alice(lease: Candidate) -> bool | str | None:
        asked.append(lease)
        if lease.user == "alice":
            return "alice's training resumes at night"
        return None if lease.user == "bob" else False

    rt = started(tmp_path, reclaim_hook=spare_alice)
    try:
        alice, bob = idle_lease(rt, "alice", "k-alice"), idle_lease(rt, "bob", "k-bob")
        made = run(rt, 600 + 5)
        assert [(d.action, d.lease_id) for d in made] == [("warn", bob)]
        made = run(rt, 120)
        assert [(d.action, d.lease_id) for d in made] == [("reclaim", bob)]
        assert rt.core.lease(alice).state.value == "active"
        assert rt.core.lease(alice).reclaim_at is None  # never warned
        first = next(c for c in asked if c.user == "alice")
        assert (first.action, first.cause, first.kernel) == ("warn", "idle", "k-alice")
        assert first.idle_s is not None and first.idle_s >= 600
        assert first.evidence["kernel_state"] == "idle" and first.devices
        # bob's lease was asked about twice: before its warning, before its reclaim
        assert [c.action for c in asked if c.user == "bob"] == ["warn", "reclaim"]
    finally:
        rt.stop()


def test_a_hook_that_changes_its_mind_withdraws_the_warning_with_its_reason(
    tmp_path: Path,
) -> None:
    keep = {"now": False}
    rt = started(tmp_path, reclaim_hook=lambda lease: False if keep["now"] else None)
    try:
        lease = idle_lease(rt, "carol", "k-carol")
        assert [d.action for d in run(rt, 605)] == ["warn"]
        keep["now"] = True  # asked again at the deadline: kept
        (cleared,) = run(rt, 120)
        assert (cleared.action, cleared.reason) == ("clear", KEPT_BY_HOOK)
        assert rt.core.lease(lease).state.value == "active"
        assert rt.core.lease(lease).reclaim_at is None
    finally:
        rt.stop()


def test_a_hook_that_fails_is_logged_once_per_call_and_the_default_stands(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(lease: Candidate) -> bool:
        raise KeyError(lease.user)

    rt = started(tmp_path, reclaim_hook=broken)
    rt.log.propagate = True
    try:
        lease = idle_lease(rt, "dave", "k-dave")
        with caplog.at_level(logging.WARNING):
            made = run(rt, 605 + 120)
        assert [(d.action, d.lease_id) for d in made] == [("warn", lease), ("reclaim", lease)]
        failed = [r.getMessage() for r in caplog.records if "reclaim_hook" in r.getMessage()]
        assert len(failed) == 2  # one line each time it was asked
        assert failed[0] == (
            f"GPU broker: c.GPUBroker.reclaim_hook failed on lease {lease} of dave ('dave'); "
            "the broker's own decision stands"
        )
    finally:
        rt.stop()


def test_the_hook_must_be_callable(tmp_path: Path) -> None:
    with pytest.raises(TraitError):
        make(tmp_path, reclaim_hook="keep_everyone")
