"""The broker's inventory from the real test cluster (``c.GPUBroker.inventory_source =
"slurm"``): Slurm's nodes and gres become devices, jobs started outside the broker and
drained nodes are held back, a lease whose job is gone is released, and an unreachable
slurmctld leaves the queue as it is and says so."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import slurm_cluster
from openapi_check import check_response
from slurm_cluster import GPU_PARTITION, sh, until
from traitlets import TraitError
from traitlets.config import Config

from jupyter_gpubroker.api.identity import Identity
from jupyter_gpubroker.api.rules import BrokerAPI
from jupyter_gpubroker.cli.status import render_status
from jupyter_gpubroker.engines import ENGINE
from jupyter_gpubroker.engines.slurm import SlurmInventory, gres_request
from jupyter_gpubroker.runtime import GPUBroker
from jupyter_gpubroker.wire.errors import ConfigError, Unsatisfiable
from jupyter_gpubroker.wire.sizes import Size

pytestmark = pytest.mark.usefixtures("slurm")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[GPUBroker]:
    running = GPUBroker(
        inventory_source="slurm", state_file=str(tmp_path / "state.sqlite"), config=GPU_PARTITION
    )
    running.start()
    try:
        yield running
    finally:
        running.stop()


def poll(broker: GPUBroker) -> None:
    """One engine pass, as every tick makes it."""
    asyncio.run(broker.poll_engine())


def outside_job(gres: str, node: str) -> str:
    """A job started straight with sbatch, not through the broker; its id once it runs."""
    job = sh(
        "sbatch",
        "--parsable",
        "--output=/dev/null",
        "-J",
        "outside",
        f"--gres={gres}",
        "-w",
        node,
        "--wrap",
        "sleep 600",
    )
    job = job.strip()
    until(f"job {job} to run", lambda: "RUNNING" in sh("squeue", "-h", "-j", job, "-o", "%T"))
    return job


def test_the_clusters_nodes_and_gres_are_the_inventory(broker: GPUBroker) -> None:
    core = broker.core
    devices = core.inventory.devices
    assert sorted((d.node, d.kind, d.profile or "") for d in devices) == sorted(
        [("gpu-a", "gpu", "")] * 4
        + [("gpu-b", "mig", "1g.10gb")] * 7
        + [("gpu-b", "mig", "3g.40gb")] * 2
    )
    # what Slurm has not got is refused at once, naming what it has
    for size, why in (
        (Size(profile="2g.20gb"), "available profiles: 1g.10gb, 3g.40gb"),
        (Size(gpus=5), "the largest node has 4 GPU"),
    ):
        with pytest.raises(Exception, match=why):
            core.submit("ann", size)


def test_jobs_outside_the_broker_and_drained_nodes_are_held_back(broker: GPUBroker) -> None:
    core = broker.core
    job = outside_job("gpu:h100:3", "gpu-a")
    poll(broker)
    held = core.drained_by(ENGINE)
    assert len(held) == 3
    assert {core.drained()[u][0] for u in held} == {"3 of 4 gpu on gpu-a in use outside the broker"}
    waiting = core.submit("ann", Size(gpus=2))
    assert core.request(waiting.id).state.value == "queued"  # one h100 is left
    sh("scancel", job)
    until(
        "the outside job to end",
        lambda: not sh("squeue", "-h", "-j", job, "-o", "%T", check=False).strip(),
    )
    poll(broker)
    assert core.request(waiting.id).state.value == "granted"

    sh("scontrol", "update", "nodename=gpu-b", "state=drain", "reason=fan swap")
    poll(broker)
    reasons = {core.drained()[u][0] for u in core.drained_by(ENGINE)}
    assert len(reasons) == 1 and reasons.pop().startswith("gpu-b: Slurm: IDLE+DRAIN, fan swap [")
    sh("scontrol", "update", "nodename=gpu-b", "state=resume")  # NOT_RESPONDING for a moment

    def lifted() -> bool:
        poll(broker)
        return core.drained_by(ENGINE) == set()

    until("the broker to lift the drain", lifted)


def test_a_lease_without_its_slurm_job_is_released(broker: GPUBroker) -> None:
    core = broker.core
    broker.engine_grace = 0  # no time for the job to appear: it is submitted first here
    granted = core.submit("ann", Size(profile="1g.10gb"))
    lease_id = core.request(granted.id).lease_id
    job = sh(
        "sbatch",
        "--parsable",
        f"--comment=gpubroker-lease={lease_id}",
        "--gres=gpu:1g.10gb:1",
        "-w",
        "gpu-b",
        "--wrap",
        "sleep 600",
    ).strip()
    poll(broker)
    assert core.request(granted.id).state.value == "granted"  # its job is in Slurm's queue
    sh("scancel", job)
    until(
        "the job to end", lambda: not sh("squeue", "-h", "-j", job, "-o", "%T", check=False).strip()
    )
    poll(broker)
    ended = core.request(granted.id)
    assert ended.state.value == "released" and ended.reason == "its Slurm job ended"


def test_a_job_still_running_after_its_lease_ended_holds_its_gpu(broker: GPUBroker) -> None:
    """A lease can end before its job does (a reclaim whose ``scancel`` is not through, a
    hub that is down): the job's gres stay held back until Slurm ends it, so the next
    request waits instead of being sent to a GPU Slurm still runs a job on."""
    core = broker.core
    granted = core.submit("ann", Size(gpus=1))
    lease = core.lease(core.request(granted.id).lease_id or "")
    node, gres = gres_request(lease.devices)
    job = sh(
        "sbatch",
        "--parsable",
        "--output=/dev/null",
        f"--comment=gpubroker-lease={lease.id}",
        f"--gres={gres}",
        "-w",
        node,
        "--wrap",
        "sleep 600",
    ).strip()
    until(f"job {job} to run", lambda: "RUNNING" in sh("squeue", "-h", "-j", job, "-o", "%T"))
    poll(broker)
    assert core.drained_by(ENGINE) == set()  # the broker's own job is not outside work
    core.release(lease.id)
    poll(broker)
    (held,) = core.drained_by(ENGINE)
    assert core.drained()[held][0] == (
        f"1 of 4 gpu on {node} in use outside the broker or by the work of ended lease {lease.id}"
    )
    whole = core.submit("bob", Size(gpus=4))
    assert core.request(whole.id).state.value == "queued"
    sh("scancel", job)
    until(
        "the job to end", lambda: not sh("squeue", "-h", "-j", job, "-o", "%T", check=False).strip()
    )
    poll(broker)
    assert core.request(whole.id).state.value == "granted"


def unreachable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point the real scontrol and squeue at a port where no slurmctld listens."""
    conf = tmp_path / "slurm.conf"
    text = slurm_cluster.CONF.read_text()
    conf.write_text(re.sub(r"SlurmctldPort=\d+", "SlurmctldPort=9", text))
    (tmp_path / "gres.conf").write_text(slurm_cluster.CONF.with_name("gres.conf").read_text())
    monkeypatch.setenv("SLURM_CONF", str(conf))


def test_a_broker_cannot_start_without_slurmctld_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    unreachable(tmp_path, monkeypatch)
    broker = GPUBroker(inventory_source="slurm", state_file=str(tmp_path / "state.sqlite"))
    with pytest.raises(ConfigError) as refused:
        broker.start()
    assert refused.value.message.startswith("slurmctld unreachable: scontrol show node failed (")
    assert refused.value.message.endswith(": the broker starts once it answers")


def test_a_kernels_own_gpu_request_is_refused_on_slurm(broker: GPUBroker) -> None:
    """On Slurm a GPU is a job's: a kernel's or the CLI's request (no server's job would
    run on the device) is refused at once, saying where a GPU comes from, instead of
    being granted and then released as an ended job's; the spawner's still queues."""
    api = BrokerAPI(broker)
    ann = api.identify("ann")
    for who, body in (
        (Identity("ann", kernel_id="k-1"), {"profile": "1g.10gb"}),
        (ann, {"profile": "1g.10gb", "holder": "cli"}),
    ):
        with pytest.raises(Unsatisfiable, match="a GPU comes with a server started from the hub"):
            api.submit(who, body)
    assert broker.core.live_requests() == []
    served = api.submit(ann, {"profile": "1g.10gb", "holder": "server:ann"})
    assert served["state"] == "granted"


def test_an_unreachable_slurmctld_keeps_the_queue_and_says_so(
    broker: GPUBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = broker.core
    waiting = [core.submit(u, Size(gpus=4)) for u in ("ann", "bob")]
    unreachable(tmp_path, monkeypatch)
    poll(broker)
    api = BrokerAPI(broker)
    devices = api.devices(api.identify("ann"))
    check_response("GET", "devices", 200, devices)  # as the API document says
    check_response("GET", "overview", 200, api.overview(api.identify("ann")))
    state = devices["engine"]
    assert state["reachable"] is False and state["since"]
    assert state["error"].startswith("slurmctld unreachable: scontrol show node failed (")
    assert [core.request(r.id).state.value for r in waiting] == ["granted", "queued"]
    assert core.drained_by(ENGINE) == set()  # the last view stands
    text = render_status({"source": "broker", "gpus": devices["gpus"], "engine": state})
    assert f"{state['error']} since {state['since']}: the broker keeps its queue" in text
    assert "gpu-a GPU 3" in text and "gpu-b GPU 1" in text  # the GPUs named by their node
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.CONF))  # the cluster's again
    poll(broker)
    assert BrokerAPI(broker).devices(BrokerAPI(broker).identify("ann"))["engine"]["reachable"]


def test_the_partitions_read_are_slurms_own(tmp_path: Path) -> None:
    """``c.SlurmInventory.partitions``: a name Slurm has not got stops the broker at its
    start, saying which Slurm has; a name that cannot be a partition's is refused at once."""
    config = Config({"SlurmInventory": {"partitions": ["gpu", "gpu-x"]}})
    broker = GPUBroker(
        inventory_source="slurm", state_file=str(tmp_path / "state.sqlite"), config=config
    )
    with pytest.raises(ConfigError) as refused:
        broker.start()
    assert refused.value.message == (
        "c.SlurmInventory.partitions names gpu-x, which Slurm has not got (its partitions: "
        "gpu, powersave)"
    )
    with pytest.raises(TraitError, match="'gpu a' is not a partition name"):
        SlurmInventory(partitions=["gpu a"])
