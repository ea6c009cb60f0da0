"""Use outside the broker: real processes of two real OS users on simulated GPUs.

The tests run as root; the second user is ``nobody`` (uid 65534). A "kernel" is a real
process the lease's renewal names (``holder_pid``) with a child of its own that runs as
``nobody``; a process "started from a terminal" is a real ``nobody`` process that no
lease's holder started. The simulated NVML lists each real pid on a device for as long
as it runs (``add_process(..., follow=True)``), as NVML does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from traitlets import TraitError

from jupyter_gpubroker.api.rules import BrokerAPI
from jupyter_gpubroker.broker.clock import VirtualClock
from jupyter_gpubroker.events import Published
from jupyter_gpubroker.monitor.outside import ProcessTable
from jupyter_gpubroker.runtime import GPUBroker
from jupyter_gpubroker.wire.sizes import Size

sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))
from runtime_helpers import make  # noqa: E402

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as another user")

KERNEL = """
import subprocess, sys, time
child = subprocess.Popen(["sleep", "600"], user=65534)
print(child.pid, flush=True)
time.sleep(600)
"""
"""A kernel that starts a GPU program of its own as another user, and says its pid."""
STUBBORN = "trap '' TERM; echo 1; exec sleep 600"
"""A program that ignores SIGTERM (it is told it is ready once it does)."""


@pytest.fixture
def procs() -> Iterator[list[Any]]:
    """What a test starts: processes, and pids of their children, killed at its end."""
    started: list[Any] = []
    yield started
    for p in started:
        if isinstance(p, int):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        elif p.poll() is None:
            p.kill()
        if not isinstance(p, int):
            p.wait()


def spawn(
    procs: list[subprocess.Popen[str]], argv: list[str], user: int | None = None
) -> subprocess.Popen[str]:
    p = subprocess.Popen(argv, user=user, stdout=subprocess.PIPE, text=True)
    procs.append(p)
    return p


def kernel(procs: list[subprocess.Popen[str]]) -> tuple[int, int]:
    """(the kernel's pid, the pid of its child that runs as nobody)."""
    k = spawn(procs, [sys.executable, "-c", KERNEL])
    assert k.stdout is not None
    child = int(k.stdout.readline())
    procs.append(child)
    return k.pid, child


def terminal(
    procs: list[subprocess.Popen[str]],
    script: str = "echo 1; exec sleep 600",
) -> subprocess.Popen[str]:
    """A program nobody started from a terminal (no lease's holder is its parent): its
    pid is the shell's, which says when it runs."""
    p = spawn(procs, ["/bin/sh", "-c", script], user=NOBODY)
    assert p.stdout is not None and p.stdout.readline()
    return p


@pytest.fixture
def broker(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[GPUBroker]:
    traits = getattr(request, "param", {})
    rt = make(tmp_path, identity="username", admin_users={"admin"}, **traits)
    rt.start()
    rt.core.clock = VirtualClock(time.time())
    try:
        yield rt
    finally:
        rt.stop()


def devices(rt: GPUBroker) -> dict[str, dict]:
    api = BrokerAPI(rt)
    found = api.devices(api.identify("admin"))["gpus"]
    return {d["uuid"]: d for g in found for d in g["devices"]}


def test_a_kernels_children_are_its_leases_and_a_terminals_process_is_outside_use(
    broker: GPUBroker, procs: list
) -> None:
    rt, api = broker, BrokerAPI(broker)
    sim = rt.backend.simulator  # type: ignore[union-attr]
    alice = api.identify("alice")
    r = rt.core.submit("alice", Size(gpus=1))
    lease = rt.core.lease(r.lease_id)
    gpu1 = lease.devices[0]
    kernel_pid, child = kernel(procs)
    api.renew(alice, lease.id, {"holder_pid": kernel_pid})
    sim.add_process(gpu1, child, follow=True)
    rt.sampler.sample()
    # nobody's process descends from alice's kernel: alice's, though nobody owns it
    assert devices(rt)[gpu1]["outside"] == [] and rt.core.drained() == {}

    stray = terminal(procs)
    sim.add_process(gpu1, stray.pid, follow=True)
    rt.sampler.sample()
    rt.core.clock.advance(12 * 60)
    seen = devices(rt)[gpu1]
    assert [o["text"] for o in seen["outside"]] == [
        f"GPU 1: in use outside the broker by nobody, pid {stray.pid}, for 12 min"
    ]
    assert seen["drained"]["cause"] == "outside"
    assert seen["drained"]["reason"] == f"in use outside the broker by nobody, pid {stray.pid}"
    alerts = api.alerts(api.identify("admin"))["active"]
    assert [(a["kind"], a["label"]) for a in alerts] == [("outside", "GPU 1")]
    assert f"by nobody, pid {stray.pid}" in alerts[0]["message"]
    audit = rt.core.store.audit()
    assert [(a["actor"], a["action"], a["target"], a["detail"]["pid"]) for a in audit] == [
        ("nobody", "outside_use", gpu1, stray.pid)
    ]
    # the report-only default touches nothing
    assert stray.poll() is None and procs[0].poll() is None

    stray.kill()
    stray.wait()
    rt.sampler.sample()
    assert devices(rt)[gpu1]["outside"] == [] and rt.core.drained() == {}
    usage = rt.core.usage(by="job_class")
    assert usage["unbrokered"] == pytest.approx(12 / 60, rel=0.01)
    assert rt.core.usage(by="user")["nobody"] == pytest.approx(12 / 60, rel=0.01)


def test_a_process_is_its_owners_lease_on_its_own_device_only(
    broker: GPUBroker, procs: list
) -> None:
    """Without a holder pid, the owner decides: nobody's process is nobody's lease on the
    slice nobody holds, and outside use on alice's GPU."""
    rt = broker
    sim = rt.backend.simulator  # type: ignore[union-attr]
    mine = rt.core.lease(rt.core.submit("nobody", Size(profile="1g.5gb")).lease_id).devices[0]
    alices = rt.core.lease(rt.core.submit("alice", Size(gpus=1)).lease_id).devices[0]
    p = terminal(procs)
    sim.add_process(mine, p.pid, follow=True)
    rt.sampler.sample()
    assert devices(rt)[mine]["outside"] == []
    sim.add_process(alices, p.pid, follow=True)
    rt.sampler.sample()
    seen = devices(rt)
    assert seen[mine]["outside"] == [] and seen[mine]["drained"] is None
    assert [(o["user"], o["pid"]) for o in seen[alices]["outside"]] == [("nobody", p.pid)]


@pytest.mark.parametrize(
    "broker", [{"outside_use": "stop", "outside_use_grace": 60.0}], indirect=True
)
def test_the_stop_policy_warns_then_signals_the_outside_process_only(
    broker: GPUBroker, procs: list
) -> None:
    rt, api = broker, BrokerAPI(broker)
    sim = rt.backend.simulator  # type: ignore[union-attr]
    published = []
    rt.events.subscribe(published.append)
    lease = rt.core.lease(rt.core.submit("alice", Size(gpus=1)).lease_id)
    gpu1 = lease.devices[0]
    kernel_pid, child = kernel(procs)
    api.renew(api.identify("alice"), lease.id, {"holder_pid": kernel_pid})
    sim.add_process(gpu1, child, follow=True)
    stubborn = terminal(procs, STUBBORN)
    sim.add_process(gpu1, stubborn.pid, follow=True)
    rt.sampler.sample()
    notices = [p for p in published if isinstance(p, Published) and p.event.kind == "outside_use"]
    assert len(notices) == 1
    seen = api.event(api.identify("nobody"), notices[0])
    assert seen is not None and seen["data"]["pid"] == stubborn.pid
    assert seen["data"]["message"].startswith(
        f"GPU 1 is not granted to you, yet your process {stubborn.pid} uses it."
    )
    assert "will be stopped at" in seen["data"]["message"]
    assert api.event(api.identify("alice"), notices[0])["data"] == {"user": "nobody"}

    rt.core.clock.advance(30)
    rt.sampler.sample()
    assert stubborn.poll() is None  # within the grace
    rt.core.clock.advance(31)
    rt.sampler.sample()  # SIGTERM, which it ignores
    time.sleep(0.5)
    assert stubborn.poll() is None
    rt.core.clock.advance(11)
    rt.sampler.sample()  # SIGKILL
    assert stubborn.wait(10) == -signal.SIGKILL
    # the kernel's own child, nobody's too, on the same GPU, is untouched
    assert os.path.exists(f"/proc/{child}") and procs[0].poll() is None
    actions = [(a["action"], a["detail"].get("signal")) for a in rt.core.store.audit()]
    assert actions == [
        ("outside_use", None),
        ("outside_use_stop", "SIGTERM"),
        ("outside_use_stop", "SIGKILL"),
    ]
    rt.sampler.sample()
    assert devices(rt)[gpu1]["outside"] == [] and rt.core.drained() == {}


@pytest.mark.parametrize(
    "broker", [{"outside_use": "stop", "outside_use_grace": 0.0}], indirect=True
)
def test_a_free_device_in_outside_use_takes_no_grant_until_the_process_is_gone(
    broker: GPUBroker, procs: list
) -> None:
    rt = broker
    sim = rt.backend.simulator  # type: ignore[union-attr]
    slice_ = next(d.uuid for d in rt.core.inventory.devices if d.profile == "3g.20gb")
    stray = terminal(procs)
    sim.add_process(slice_, stray.pid, follow=True)
    rt.sampler.sample()
    waiting = rt.core.submit("bob", Size(profile="3g.20gb"))
    assert waiting.state.value == "queued"
    stray.kill()
    stray.wait()
    rt.sampler.sample()
    assert rt.core.request(waiting.id).state.value == "granted"
    assert rt.core.lease(rt.core.request(waiting.id).lease_id).devices == (slice_,)


@pytest.mark.parametrize(
    "broker", [{"outside_use": "stop", "outside_use_grace": 0.0}], indirect=True
)
def test_without_a_grace_the_first_pass_terminates_the_process(
    broker: GPUBroker, procs: list
) -> None:
    rt = broker
    sim = rt.backend.simulator  # type: ignore[union-attr]
    stray = terminal(procs)
    gpu1 = rt.core.inventory.gpus[1].uuid
    sim.add_process(gpu1, stray.pid, follow=True)
    rt.sampler.sample()
    assert stray.wait(10) == -signal.SIGTERM


@pytest.mark.parametrize("trait, value", [("outside_use", "kill"), ("outside_use_grace", -1.0)])
def test_bad_policies_are_refused(tmp_path: Path, trait: str, value: object) -> None:
    with pytest.raises(TraitError):
        make(tmp_path, **{trait: value})


@pytest.mark.parametrize("pid", [1, 0, -5, "42", True, 2**40, 4.2])
def test_a_renewal_names_a_real_process_id_or_is_refused(broker: GPUBroker, pid: object) -> None:
    api = BrokerAPI(broker)
    lease = broker.core.lease(broker.core.submit("alice", Size(gpus=1)).lease_id)
    with pytest.raises(Exception, match="'holder_pid' must be a process id from 2 to"):
        api.renew(api.identify("alice"), lease.id, {"holder_pid": pid})


def test_outside_use_outlives_a_broker_restart_and_is_charged_once(
    tmp_path: Path, procs: list
) -> None:
    stray = terminal(procs)
    start = time.time()
    for minutes in (0, 7):  # the broker restarts 7 minutes in
        rt = make(tmp_path)
        rt.start()
        try:
            rt.core.clock = VirtualClock(start + minutes * 60)
            gpu1 = rt.core.inventory.gpus[1].uuid
            rt.backend.simulator.add_process(gpu1, stray.pid, follow=True)  # type: ignore[union-attr]
            rt.sampler.sample()  # type: ignore[union-attr]
            (seen,) = devices(rt)[gpu1]["outside"]
            assert seen["text"].endswith(
                f"pid {stray.pid}, for {minutes} min" if minutes else "0 s"
            )
        finally:
            if minutes:
                stray.kill()
                stray.wait()
                rt.core.clock.advance(60)
                rt.sampler.sample()  # type: ignore[union-attr]
                assert rt.core.usage(by="job_class") == {"unbrokered": pytest.approx(8 / 60)}
                # the restart found the use going on: one record of it, not one per start
                audited = [r for r in rt.core.store.audit() if r["action"] == "outside_use"]
                assert [(r["actor"], r["detail"]["pid"]) for r in audited] == [
                    ("nobody", stray.pid)
                ]
            rt.stop()


def test_unbrokered_use_counts_in_fair_share_as_a_lease_does(tmp_path: Path, procs: list) -> None:
    """An hour of nobody's GPU outside the broker weighs in nobody's fair share as an hour
    of alice's lease of a GPU weighs in hers (less the entry penalty of a grant, which
    unbrokered use has none of: it is off here), before a restart and after it."""
    stray = terminal(procs)
    start = time.time()
    for restart in (False, True):
        rt = make(tmp_path, simulate="dgx-h100:2", policy_params={"entry_penalty_s": 0})
        rt.start()
        try:
            clock = rt.core.clock = VirtualClock(start + (3600 if restart else 0))
            if not restart:
                lease = rt.core.lease(rt.core.submit("alice", Size(gpus=1)).lease_id)
                (free,) = {g.uuid for g in rt.core.inventory.gpus} - set(lease.devices)
                rt.backend.simulator.add_process(free, stray.pid, follow=True)  # type: ignore[union-attr]
                for _ in range(60):
                    rt.sampler.sample()  # type: ignore[union-attr]
                    clock.advance(60)
                    rt.core.renew(lease.id)
            rt.sampler.sample()  # type: ignore[union-attr]
            ledger = rt.core.ledger
            ledger.recalc(clock.now())
            alice, nobody = ("user", "alice"), ("user", "nobody")
            assert ledger.usage_share(alice) == pytest.approx(0.5, abs=0.01)
            assert ledger.usage_share(nobody) == pytest.approx(ledger.usage_share(alice), abs=0.01)
            assert ledger.fairshare("nobody", "") == pytest.approx(
                ledger.fairshare("alice", ""), abs=0.01
            )
        finally:
            rt.stop()


def test_the_process_table_sees_a_process_that_drops_to_another_user(procs: list) -> None:
    """A process's facts are kept from pass to pass, but not past a change of its owner."""
    code = (
        "import os, sys; print(1, flush=True); sys.stdin.readline(); os.setuid(65534); "
        "print(2, flush=True); sys.stdin.readline()"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    procs.append(p)
    assert p.stdout is not None and p.stdin is not None and p.stdout.readline()
    table = ProcessTable()
    first = table.read([p.pid, 99999999])
    assert list(first) == [p.pid] and first[p.pid].user == "root"
    assert os.getpid() in first[p.pid].chain  # its parent: this test
    assert table.read([p.pid]) == first  # kept
    p.stdin.write("\n")
    p.stdin.flush()
    assert p.stdout.readline()
    assert table.read([p.pid])[p.pid].user == "nobody"


def test_a_process_already_on_a_gpu_when_the_broker_starts_is_outside_use(
    tmp_path: Path, procs: list
) -> None:
    stray = terminal(procs)
    machine = tmp_path / "machine.yaml"
    machine.write_text(
        yaml.safe_dump(
            {
                "version": "v1",
                "simulate": {
                    "gpu-model": "A100-40GB",
                    "gpu-count": 2,
                    "processes": {1: [stray.pid]},
                },
                "mig-configs": {"whole": [{"devices": "all", "mig-enabled": False}]},
            }
        )
    )
    rt = make(tmp_path, simulate=str(machine), vacate_timeout=0.0)
    rt.start()
    try:
        gpu1 = rt.core.inventory.gpus[1].uuid
        rt.sampler.sample()  # type: ignore[union-attr]
        rt.core.tick()  # the core's wait for what ran there at its start is over
        rt.sampler.sample()  # type: ignore[union-attr]
        seen = devices(rt)[gpu1]
        assert [o["pid"] for o in seen["outside"]] == [stray.pid]
        assert seen["drained"] == {
            **seen["drained"],
            "cause": "outside",
            "reason": f"in use outside the broker by nobody, pid {stray.pid}",
        }
        stray.kill()
        stray.wait()
        rt.sampler.sample()  # type: ignore[union-attr]
        rt.core.tick()
        assert (
            rt.core.drained() == {} and rt.core.submit("bob", Size(gpus=2)).state.value == "granted"
        )
    finally:
        rt.stop()


def test_a_killed_process_its_parent_has_not_reaped_is_gone() -> None:
    """A kernel killed while its server does not wait for it stays a zombie in ``/proc``:
    it has ended, so a suspension of it must end too, not wait for the reaping."""
    child = subprocess.Popen(["sleep", "60"])
    try:
        assert child.pid in ProcessTable().read([child.pid])
        os.kill(child.pid, signal.SIGKILL)
        for _ in range(100):  # until the kernel has made it a zombie
            if Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z":
                break
            time.sleep(0.01)
        assert ProcessTable().read([child.pid]) == {}
    finally:
        child.wait()
