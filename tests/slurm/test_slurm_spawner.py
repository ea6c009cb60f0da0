"""GPU servers on the real Slurm test cluster, end to end: a real hub and proxy, the broker
service reading Slurm (``inventory_source = "slurm"``) and users spawning through the
Slurm spawner (``SimpleGPUBrokerSlurmSpawner``: batchspawner's SlurmSpawner with the
broker's mixin, every job as this OS user). The cluster: gpu-a with gpu:h100:4, gpu-b
with gpu:1g.10gb:7 and gpu:3g.40gb:2."""

from __future__ import annotations

import contextlib
import re
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import requests
from live_hub import Hub
from slurm_cluster import cleanup, job_details, jobs, sh, until

pytestmark = [pytest.mark.hub, pytest.mark.slow]

SPAWNER = "hub_spawner.slurm.SimpleGPUBrokerSlurmSpawner"
BIN = Path(sys.executable).parent
REFUSED = "refused"
"""The user whose jobs ask for a partition Slurm has not got (the test config's hook)."""
LATE = "late"
"""The user whose jobs Slurm holds for 20 s (``--begin=now+20``: the test config's hook)."""


def config(home: Path) -> str:
    return f"""
import batchspawner  # its API handler: the job's server tells the hub its port
c.JupyterHub.cleanup_servers = False
c.Spawner.poll_interval = 2  # a job that ended is noticed within seconds
c.SimpleGPUBrokerSlurmSpawner.home_dir_template = "{home}/users/{{username}}"
c.SimpleGPUBrokerSlurmSpawner.gpu_wait_timeout = 600
# the job runs this checkout's Python (--export passes only what the hub names); no SLURM_CONF,
# as an admin may write it (the spawner passes the hub's on)
c.Spawner.env_keep = ["PATH", "PYTHONPATH", "VIRTUAL_ENV", "LANG"]
c.SimpleGPUBrokerSlurmSpawner.batchspawner_singleuser_cmd = "{BIN}/batchspawner-singleuser"
# the job's server reports its kernels' activity with its lease every second (idle test)
c.Spawner.args = [*c.Spawner.args, "--GPUBrokerExtension.server_report_interval=1"]
def _hook(spawner):
    if spawner.user.name == {REFUSED!r}:
        spawner.req_partition = "no-such-partition"
    if spawner.user.name == {LATE!r}:
        spawner.req_options = "--begin=now+20"
c.Spawner.pre_spawn_hook = _hook
# the broker reads the nodes that never sleep (gpu-c sleeps under Slurm's power saving)
c.JupyterHub.services[0]["command"].append("--SlurmInventory.partitions=gpu")
"""


@pytest.fixture(scope="module")
def hub(
    tmp_path_factory: pytest.TempPathFactory, slurm_cluster: None, proxy: None
) -> Iterator[Hub]:
    cleanup()
    home = tmp_path_factory.mktemp("hub")
    running = Hub(
        home,
        spawner=SPAWNER,
        extra_config=config(home),
        inventory_source="slurm",
        engine_grace=20,
        # GPU servers are warned after 20 s idle, stopped 10 s later (the example's 1 h
        # server timeout would otherwise apply)
        server_idle_timeout=20,
        user_groups={"ann": ["lab"]},
        grace=10,
        sample_interval=1,
    )
    try:
        running.start()
        yield running
    finally:
        running.stop()
        cleanup()


def post_server(hub: Hub, token: str, name: str, options: dict[str, Any]) -> requests.Response:
    return requests.post(
        f"{hub.url}/hub/api/users/{name}/server",
        json=options,
        headers={"Authorization": f"token {token}"},
        timeout=60,
    )


def spawn(hub: Hub, token: str, name: str, options: dict[str, Any]) -> int:
    return post_server(hub, token, name, options).status_code


def server(hub: Hub, name: str) -> dict[str, Any]:
    return hub.hub_api("GET", f"users/{name}")["servers"].get("", {})


def ready(hub: Hub, name: str) -> dict[str, Any]:
    """Wait until ``name``'s server runs in its Slurm job; the spawner's state."""
    found = until(f"{name}'s server", lambda: server(hub, name).get("ready"), timeout_s=240)
    assert found
    return dict(server(hub, name)["state"])


def leases(hub: Hub, token: str) -> list[dict[str, Any]]:
    status, body = hub.api(token, "GET", "leases")
    assert status == 200, body
    return list(body["leases"])


def events(hub: Hub, token: str, name: str, until_text: str) -> list[str]:
    """The messages of ``name``'s spawn progress stream up to one containing
    ``until_text`` (or the end of the stream)."""
    seen = []
    with requests.get(
        f"{hub.url}/hub/api/users/{name}/server/progress",
        headers={"Authorization": f"token {token}"},
        stream=True,
        timeout=300,
    ) as r:
        for line in r.iter_lines(decode_unicode=True):
            if line and line.startswith("data:"):
                seen.append(line)
                if until_text in line:
                    break
    return seen


def stop(hub: Hub, *names: str) -> None:
    for name in names:
        with contextlib.suppress(AssertionError):
            hub.stop_server(name)
    for name in names:
        until(f"{name}'s server to stop", lambda n=name: not server(hub, n))


def test_each_job_lands_on_the_node_and_gres_the_broker_chose_and_the_next_waits(
    hub: Hub,
) -> None:
    tokens = {n: hub.user(n) for n in ("ann", "bob", "cat", "admin")}
    try:
        assert spawn(hub, tokens["ann"], "ann", {"gpus": 2}) in (201, 202)
        assert spawn(hub, tokens["bob"], "bob", {"profile": "3g.40gb"}) in (201, 202)
        state = {n: ready(hub, n) for n in ("ann", "bob")}
        mine = {n: leases(hub, tokens[n]) for n in ("ann", "bob")}
        for name, node, gres in (("ann", "gpu-a", "gpu:h100:2"), ("bob", "gpu-b", "gpu:3g.40gb:1")):
            (lease,) = mine[name]
            assert lease["user"] == name
            job = job_details(state[name]["job_id"])
            assert re.search(rf"\bNodeList={node}\b", job), job
            assert f"TresPerNode=gres:{gres}" in job, job
            assert f"Comment=gpubroker-lease={lease['id']}" in job, job
            assert all(d.startswith(f"slurm__{node}__") for d in lease["devices"])

        # gpu-a has 2 of its 4 h100 left: cat's 4 wait in the broker's queue, with a
        # position and an ETA on her spawn page, and no job in Slurm's queue yet
        assert spawn(hub, tokens["cat"], "cat", {"gpus": 4}) == 202
        waiting = events(hub, tokens["cat"], "cat", "position 1 of 1")
        assert "Waiting for 4 GPUs (interactive)" in waiting[-1] and "ETA" in waiting[-1]
        assert len(jobs()) == 2

        # ann's job cancelled from outside the hub: her lease is released, cat starts
        sh("scancel", state["ann"]["job_id"])
        until("ann's lease to end", lambda: not leases(hub, tokens["ann"]))
        story = events(hub, tokens["cat"], "cat", "waiting for the server to start")
        assert any("Granted 4 GPUs" in m for m in story), story
        assert "runs on gpu-a" in story[-1]
        cat = ready(hub, "cat")
        assert "TresPerNode=gres:gpu:h100:4" in job_details(cat["job_id"])
        # ann's held 2 GPUs are her and her group's GPU-hours, as on one machine
        for by, who in (("user", "ann"), ("group", "lab")):
            status, usage = hub.api(tokens["admin"], "GET", f"usage?by={by}")
            assert status == 200 and usage["gpu_hours"].get(who, 0) > 0, usage
    finally:
        stop(hub, "ann", "bob", "cat")
    assert not jobs()  # stopping a server cancels its job


def test_a_broker_restart_loses_no_lease_and_releases_one_whose_job_ended(hub: Hub) -> None:
    tokens = {n: hub.user(n) for n in ("dan", "eve")}
    try:
        for name in ("dan", "eve"):
            assert spawn(hub, tokens[name], name, {"profile": "1g.10gb"}) in (201, 202)
        state = {n: ready(hub, n) for n in ("dan", "eve")}
        held = {n: leases(hub, tokens[n])[0] for n in ("dan", "eve")}
        before = {n: lease["id"] for n, lease in held.items()}
        # past engine_grace (20 s) since the grant, the restarted broker releases a lease
        # whose job is gone before it answers anyone; sooner, eve's hub server could give
        # it back first (its poll retries), which is right too but not what this tests
        granted = datetime.fromisoformat(held["eve"]["granted_at"]).timestamp()
        time.sleep(max(0.0, granted + 21 - time.time()))
        pid = hub.service_pid()
        assert pid is not None
        # eve's job ends while the broker is down (frozen, then killed): the restarted
        # broker finds it gone from squeue and releases her lease
        sh("kill", "-STOP", str(pid))
        sh("scancel", state["eve"]["job_id"])
        until("eve's job to end", lambda: state["eve"]["job_id"] not in jobs())
        hub.kill_service()
        assert [x["id"] for x in leases(hub, tokens["dan"])] == [before["dan"]]
        until("eve's lease to end", lambda: not leases(hub, tokens["eve"]))
        status, ended = hub.api(tokens["eve"], "GET", f"leases/{before['eve']}")
        assert status == 200 and ended["state"] == "released", ended
        assert ended["reason"] == "its Slurm job ended"
        assert state["dan"]["job_id"] in jobs()
        assert server(hub, "dan").get("ready")
    finally:
        stop(hub, "dan", "eve")


def test_sbatchs_refusal_is_the_spawn_pages_error_and_gives_the_gpu_back(hub: Hub) -> None:
    token = hub.user(REFUSED)
    try:
        r = post_server(hub, token, REFUSED, {"profile": "1g.10gb"})
        # refused within the hub's slow_spawn_timeout: the POST's answer says it; later,
        # the spawn page's progress
        if r.status_code == 503:
            said = r.json()["message"]
        else:
            said = events(hub, token, REFUSED, "failed")[-1]
        assert said == (
            "Slurm refused the server's job: invalid partition specified: no-such-partition; "
            "Batch job submission failed: Invalid partition name specified."
        ), said
        until("the lease to be given back", lambda: not leases(hub, token))
    finally:
        stop(hub, REFUSED)


def test_while_slurm_holds_the_job_the_spawn_page_says_why(hub: Hub) -> None:
    token = hub.user(LATE)
    try:
        assert spawn(hub, token, LATE, {"profile": "1g.10gb"}) in (201, 202)
        story = events(hub, token, LATE, "waiting for the server to start")
        pending = [m for m in story if "is pending in Slurm's queue (BeginTime)" in m]
        assert pending, story
        assert story.index(pending[0]) > next(i for i, m in enumerate(story) if "Granted" in m)
        ready(hub, LATE)
    finally:
        stop(hub, LATE)


def test_an_idle_server_is_warned_then_stopped_and_its_job_cancelled(hub: Hub) -> None:
    token = hub.user("idle")
    try:
        assert spawn(hub, token, "idle", {"profile": "1g.10gb", "job_class": "batch"}) in (
            201,
            202,
        )
        job_id = ready(hub, "idle")["job_id"]
        (lease,) = leases(hub, token)
        warned = until("the warning", lambda: [x for x in leases(hub, token) if x["reclaim_at"]])
        assert warned[0]["id"] == lease["id"]
        until("the job to be cancelled", lambda: job_id not in jobs())
        until("the server to stop", lambda: not server(hub, "idle"))
        status, ended = hub.api(token, "GET", f"leases/{lease['id']}")
        assert status == 200 and ended["state"] == "reclaimed", ended
        assert "idle" in ended["reason"], ended
    finally:
        stop(hub, "idle")
