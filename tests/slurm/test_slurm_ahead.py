"""Slurm nodes woken ahead of the forecast and put to sleep in its troughs
(``c.GPUBroker.slurm_ahead``), on the real test cluster: gpu-a (four H100s, never asleep)
and gpu-c (two, under Slurm's power saving), the nodes of partition ``powersave``.

History is seeded through the real core on a virtual clock: for three days six one-GPU
requests at 09:00-11:00, four held on gpu-a and two waiting while gpu-c sleeps. On the
fourth day the broker wakes gpu-c at 08:00 through Slurm, so that at 09:00 all six are
granted at once and a job of one runs on gpu-c; in the evening's trough gpu-c is put to
sleep, but never while a lease or a job holds it. The day's cap on GPU-hours kept awake
ahead stops it, though not a wake for a request that waits. Slurm itself wakes and
sleeps the node: its ResumeProgram starts gpu-c's slurmd, its SuspendProgram stops it."""

from __future__ import annotations

import asyncio
import logging
import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from openapi_check import check_response
from slurm_cluster import SLEEPER, node_state, put_to_sleep, sh, until, until_state
from traitlets.config import Config

from jupyter_gpubroker.api.rules import BrokerAPI
from jupyter_gpubroker.broker.clock import VirtualClock
from jupyter_gpubroker.broker.core import Broker
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.engines import ENGINE
from jupyter_gpubroker.engines.slurm import SlurmInventory
from jupyter_gpubroker.engines.watch import EngineWatch
from jupyter_gpubroker.runtime import GPUBroker
from jupyter_gpubroker.runtime.slurm_ahead import SlurmAhead
from jupyter_gpubroker.wire.sizes import Size

pytestmark = pytest.mark.usefixtures("slurm")

HOUR = 3600.0
MONDAY_9 = 1_764_579_600.0  # Monday 2025-12-01 09:00 UTC
LOG = logging.getLogger("test-slurm-ahead")
POWERSAVE = Config({"SlurmInventory": {"partitions": ["powersave"]}})
USERS = ("ann", "bob", "cat", "dan", "erin", "fay")
AWAKE, ASLEEP = "IDLE", "IDLE+POWERED_DOWN"
"""gpu-c's state in Slurm, idle and awake or asleep."""


@dataclass
class Cluster:
    core: Broker
    clock: VirtualClock
    source: SlurmInventory
    watch: EngineWatch
    ahead: SlurmAhead

    def step(self) -> None:
        """One engine pass, as every tick makes it: read, apply, then act ahead."""
        asyncio.run(self.watch.poll())

    def actions(self) -> list[tuple[str, str, str]]:
        return [
            (a["action"], a["target"], a["detail"]["reason"])
            for a in self.core.store.audit(actor="forecast")
        ]

    def gpu_c(self) -> set[str]:
        return {d.uuid for d in self.core.inventory.devices if d.node == SLEEPER}


@pytest.fixture
def asleep() -> Iterator[None]:
    """gpu-c asleep at the start and again at the end."""
    put_to_sleep()
    yield
    for job in sh("squeue", "-h", "-w", SLEEPER, "-o", "%i").split():
        sh("scancel", job, check=False)
    put_to_sleep()


@pytest.fixture
def cluster(tmp_path: Path, asleep: None) -> Iterator[Cluster]:
    source = SlurmInventory(partitions=["powersave"])
    view = asyncio.run(source.read())
    clock = VirtualClock(MONDAY_9)
    core = Broker(Store(tmp_path / "state.sqlite"), view.inventory, clock=clock)
    watch = EngineWatch(source, core, lambda: 1e9, LOG)  # leases without jobs stay
    watch.apply(view)
    assert core.drained_by(ENGINE) == cluster_gpu_c(core)  # asleep: held back
    for day in range(3):
        asked = [core.submit(user, Size(gpus=1)) for user in USERS]
        assert sum(r.lease_id is not None for r in asked) == 4  # two wait for gpu-c
        clock.advance(2 * HOUR)
        for r in asked:
            if r.lease_id:
                core.release(r.lease_id)
            else:
                core.cancel(r.id)
        clock.advance((22 if day < 2 else 21) * HOUR)
    # Thursday 08:00
    ahead = SlurmAhead(slurm_ahead=True)
    watch.after_poll = lambda: ahead.power_ahead(core, source, LOG)
    yield Cluster(core, clock, source, watch, ahead)
    core.store.close()


def cluster_gpu_c(core: Broker) -> set[str]:
    return {g.uuid for g in core.inventory.gpus if g.node == SLEEPER}


def sbatch_on_gpu_c(lease_id: str) -> str:
    """The job a spawner submits for a lease on gpu-c; its id once it runs."""
    job = sh(
        "sbatch",
        "--parsable",
        "--output=/dev/null",
        "-p",
        "powersave",
        "-w",
        SLEEPER,
        "--gres=gpu:h100:1",
        f"--comment=gpubroker-lease={lease_id}",
        "--wrap",
        "sleep 600",
    ).strip()
    until(f"job {job} to run", lambda: "RUNNING" in sh("squeue", "-h", "-j", job, "-o", "%T"))
    return job


def test_a_node_is_woken_before_the_peak_and_put_to_sleep_in_the_trough(
    cluster: Cluster,
) -> None:
    core, clock = cluster.core, cluster.clock
    cluster.step()
    woke = (
        "slurm_power_up",
        SLEEPER,
        "forecast: at most 6.0 GPUs asked Thu 08:00-09:00 and Thu 09:00-10:00 (p90); the "
        "awake nodes give 4.0 GPUs; woke gpu-c",
    )
    assert cluster.actions() == [woke]
    until_state(AWAKE)
    cluster.step()
    assert core.drained_by(ENGINE) == set()  # awake: its GPUs are offered
    assert cluster.actions() == [woke]  # the forecast has what it asks

    clock.advance(HOUR)  # 09:00: all six are granted at once
    asked = [core.submit(user, Size(gpus=1)) for user in USERS]
    assert all(r.lease_id for r in asked)
    on_c = [
        r.lease_id for r in asked if set(core.lease(r.lease_id or "").devices) <= cluster.gpu_c()
    ]
    assert len(on_c) == 2
    job = sbatch_on_gpu_c(on_c[0] or "")  # its server's job runs on the node woken ahead
    for r in asked:
        if r.lease_id not in on_c:
            core.release(r.lease_id or "")

    clock.advance(11 * HOUR)  # 20:00, a trough: but leases and a job hold gpu-c
    cluster.step()
    assert len(cluster.actions()) == 1
    for lease_id in on_c:
        core.release(lease_id or "")
    cluster.step()  # no lease now, but the job still runs there
    assert len(cluster.actions()) == 1
    assert (
        node_state(SLEEPER) == "MIXED" and sh("squeue", "-h", "-j", job, "-o", "%T") == "RUNNING\n"
    )
    sh("scancel", job)
    until_state(AWAKE)  # the job ended
    cluster.step()
    assert cluster.actions()[1:] == [
        (
            "slurm_power_down",
            SLEEPER,
            "forecast: no GPU asked Thu 20:00-21:00 and Thu 21:00-22:00 (p90); gpu-c is idle, "
            "and the other awake nodes give 4.0 GPUs; put to sleep gpu-c",
        )
    ]
    until_state(ASLEEP)
    cluster.step()
    reasons = {core.drained()[u][0] for u in core.drained_by(ENGINE)}
    assert reasons == {"gpu-c: Slurm: IDLE+POWERED_DOWN, asleep (power saving)"}
    # gpu-a is in SuspendExcNodes: never put to sleep, though it idles in the trough too
    assert {target for _, target, _ in cluster.actions()} == {SLEEPER}


def test_the_days_cap_stops_waking_ahead_but_not_for_a_request_that_waits(
    cluster: Cluster,
) -> None:
    core, clock, ahead = cluster.core, cluster.clock, cluster.ahead
    ahead.slurm_ahead_gpu_hours = 1.0
    cluster.step()  # 08:00: woken ahead of the peak
    until_state(AWAKE)
    cluster.step()
    clock.advance(HOUR / 2)  # 08:30: two GPUs awake for half an hour, unused
    cluster.step()
    assert ahead.slurm_gpu_hours_ahead == pytest.approx(1.0)
    assert cluster.actions()[1] == (
        "slurm_power_down",
        SLEEPER,
        "today's 1.0 h of GPUs kept awake ahead of the forecast are spent; gpu-c is idle; "
        "put to sleep gpu-c",
    )
    until_state(ASLEEP)
    cluster.step()
    clock.advance(HOUR / 4)  # the forecast still asks, but the cap is spent
    cluster.step()
    assert len(cluster.actions()) == 2
    assert ahead.slurm_ahead_state(cluster.source)["text"] == (
        "Slurm nodes woken and put to sleep ahead of the forecast: on; GPUs kept awake ahead "
        "today: 1.0 h of the 1.0 h a day allowed"
    )

    held = [core.submit(user, Size(gpus=1)) for user in USERS[:4]]  # gpu-a is full
    waiting = core.submit("gus", Size(gpus=2))
    assert all(r.lease_id for r in held) and waiting.lease_id is None
    cluster.step()
    assert cluster.actions()[2] == (
        "slurm_power_up",
        SLEEPER,
        "a request for 2 GPUs waits, no awake GPU can take it, and gpu-c has room for it; "
        "woke gpu-c",
    )
    until_state(AWAKE)
    cluster.step()
    granted = core.request(waiting.id)
    assert granted.lease_id and set(core.lease(granted.lease_id).devices) == cluster.gpu_c()
    restarted = SlurmAhead(slurm_ahead=True, slurm_ahead_gpu_hours=1.0)  # a broker restart
    asyncio.run(restarted.power_ahead(core, cluster.source, LOG))
    assert restarted.slurm_gpu_hours_ahead == pytest.approx(1.0)  # read from the audit log


def test_a_running_broker_acts_after_each_read_and_says_so(tmp_path: Path, asleep: None) -> None:
    """``GPUBroker`` with ``slurm_ahead``: its engine poll wakes gpu-c for a request that
    waits; ``GET forecast`` says it acts, and what Slurm refused when it refuses."""
    broker = GPUBroker(
        inventory_source="slurm",
        state_file=str(tmp_path / "state.sqlite"),
        slurm_ahead=True,
        engine_grace=3600,  # the leases here have no job
        config=POWERSAVE,
    )
    broker.start()
    try:
        api = BrokerAPI(broker)
        owner = api.user_identity(None)  # the owner: an admin
        found = api.forecast(owner)
        check_response("GET", "forecast", 200, found)
        assert found["acting"][-1] == {
            "kind": "slurm_ahead",
            "on": True,
            "acting": True,
            "text": "Slurm nodes woken and put to sleep ahead of the forecast: on; GPUs kept "
            "awake ahead today: none of the 24 h a day allowed",
        }
        core = broker.core
        for user in USERS[:4]:
            core.submit(user, Size(gpus=1), holder=f"server:{user}")
        waiting = core.submit("erin", Size(gpus=1), holder="server:erin")
        assert waiting.lease_id is None
        asyncio.run(broker.poll_engine())
        (woke,) = [a for a in core.store.audit(actor="forecast")]
        assert (woke["action"], woke["target"]) == ("slurm_power_up", SLEEPER)
        until_state(AWAKE)
        asyncio.run(broker.poll_engine())
        assert core.request(waiting.id).lease_id
    finally:
        broker.stop()


def test_what_slurm_refuses_is_said_in_a_sentence(tmp_path: Path, asleep: None) -> None:
    """A broker that is not Slurm's admin: Slurm refuses its power changes."""
    nobody = tmp_path / "scontrol"
    nobody.write_text('#!/bin/sh\nexec runuser -u nobody -- scontrol "$@"\n')
    nobody.chmod(0o755)
    config = Config({"SlurmInventory": {"partitions": ["powersave"], "scontrol": str(nobody)}})
    broker = GPUBroker(
        inventory_source="slurm",
        state_file=str(tmp_path / "state.sqlite"),
        slurm_ahead=True,
        engine_grace=3600,
        config=config,
    )
    broker.start()
    try:
        core = broker.core
        for user in USERS[:4]:
            core.submit(user, Size(gpus=1), holder=f"server:{user}")
        core.submit("erin", Size(gpus=1), holder="server:erin")
        asyncio.run(broker.poll_engine())
        assert broker.acting_ahead()[-1]["text"] == (
            "Slurm nodes woken and put to sleep ahead of the forecast: on, but none is: Slurm "
            "refused to wake gpu-c (scontrol update NodeName=gpu-c State=POWER_UP: Invalid "
            "user id)"
        )
        assert broker.acting_ahead()[-1]["acting"] is False
        assert core.store.audit(actor="forecast") == []
        assert node_state(SLEEPER) == ASLEEP
    finally:
        broker.stop()


WAKE = "scontrol update NodeName=gpu-c State=POWER_UP"
SLEEP = "scontrol update NodeName=gpu-c State=POWER_DOWN"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "slurm.md"


def test_the_commands_the_docs_show_wake_gpu_c_and_put_it_to_sleep(asleep: None) -> None:
    """docs/slurm.md's commands, run as written; and 22.05's answer to ``scontrol power``."""
    shown = re.findall(r"```bash\n(.*?)```", DOCS.read_text(), re.S)
    assert [line for block in shown for line in block.splitlines()] == [WAKE, SLEEP]
    sh(*shlex.split(WAKE))
    until_state(AWAKE)
    sh(*shlex.split(SLEEP))
    until_state(ASLEEP)
    refused = subprocess.run(
        shlex.split("scontrol power up gpu-c"), capture_output=True, text=True, timeout=60
    )
    assert refused.returncode != 0 and "invalid keyword: power" in refused.stderr
