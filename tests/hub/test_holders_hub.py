"""Whose kernel and whose process a user may name, under a real hub: the broker service on
two simulated whole H100s suspends idle kernels, and each user's kernels run as their own
OS account (``holder_account = "user"``). The user whose kernel runs here is ``nobody``
(a real second OS account); a "kernel" is a real process of theirs, which their renewals
name and which the simulated NVML lists on their GPU (``simulate_kernel_memory``).

- Another hub user's request naming nobody's suspended kernel as its holder is granted
  to them alone: nobody's kernel stays suspended, its memory on the host, and nobody's own
  request resumes it.
- nobody's renewal naming a process of root's that computes on nobody's GPU is refused
  with a sentence, and that process stays outside use.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from live_hub import Hub, wait_for

pytestmark = [
    pytest.mark.hub,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as another user"),
]
NOBODY = 65534
KERNEL = "k-nobody-1"


def machine(path: Path, processes: dict[int, list[int]]) -> None:
    """Two whole H100s, ``processes`` (GPU index -> pids) on them when the service starts."""
    simulate: dict[str, Any] = {"gpu-model": "H100-80GB", "gpu-count": 2}
    if processes:
        simulate["processes"] = processes
    path.write_text(
        yaml.safe_dump(
            {
                "version": "v1",
                "simulate": simulate,
                "mig-configs": {"whole": [{"devices": "all", "mig-enabled": False}]},
            }
        )
    )


@pytest.fixture(scope="module")
def machine_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("machine") / "two-h100.yaml"
    machine(path, {})
    return path


@pytest.fixture(scope="module")
def hub_options(machine_file: Path) -> dict[str, Any]:
    return {
        "simulate": str(machine_file),
        "holder_account": "user",
        "reclaim_action": "suspend",
        "simulate_kernel_memory": 4096,
        "sample_interval": 0.25,
        "idle_timeout": 2.0,
        "grace": 1.0,
        "stalled_timeout": 0.0,
        "lease_ttl": 120.0,
    }


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


def sleeper(procs: list[subprocess.Popen[bytes]], user: int | None = None) -> int:
    p = subprocess.Popen(["sleep", "600"], user=user)
    procs.append(p)
    return p.pid


def idle_report() -> dict[str, str]:
    """A renewal's kernel report: idle for an hour."""
    since = datetime.fromtimestamp(time.time() - 3600, timezone.utc).isoformat()
    return {"execution_state": "idle", "last_activity": since}


def test_another_users_request_naming_my_suspended_kernel_leaves_it_suspended(
    hub: Hub, procs: list[subprocess.Popen[bytes]]
) -> None:
    mine, eve = hub.user("nobody"), hub.user("eve")
    kernel_pid = sleeper(procs, NOBODY)
    lease_id = hub.ok(mine, "POST", "requests", {"gpus": 1, "holder": KERNEL})["lease"]["id"]
    body = {"holder_pid": kernel_pid, "kernel": idle_report()}
    hub.ok(mine, "POST", f"leases/{lease_id}/renew", body)
    assert hub.ok(mine, "GET", f"leases/{lease_id}")["holder_pid"] == kernel_pid  # nobody's

    def suspended() -> dict[str, Any] | None:
        lease: dict[str, Any] = hub.ok(mine, "GET", f"leases/{lease_id}")
        return lease if lease["state"] != "active" else None

    lease = wait_for("nobody's kernel to be suspended", suspended, log=hub.log)
    assert lease["suspended"]["kernel_id"] == KERNEL, lease

    theirs = hub.ok(eve, "POST", "requests", {"gpus": 1, "holder": KERNEL, "model": "H100-80GB"})
    assert theirs["state"] == "granted", theirs
    time.sleep(2)  # the old broker restored nobody's kernel onto eve's GPU at once
    now = hub.ok(mine, "GET", f"leases/{lease_id}")
    assert now["suspended"] is not None, now  # still suspended, its memory on the host
    assert now["reason"].endswith("suspended, its 4.2 GB of GPU memory on the host"), now
    assert [x["id"] for x in hub.ok(mine, "GET", "overview")["suspended"]] == [lease_id]
    assert hub.ok(eve, "GET", "overview")["suspended"] == []
    assert hub.ok(eve, "GET", f"leases/{theirs['lease']['id']}")["state"] == "active"
    hub.ok(eve, "DELETE", f"leases/{theirs['lease']['id']}")

    # nobody's own request (its next cell's) resumes it
    again = hub.ok(mine, "POST", "requests", {"gpus": 1, "holder": KERNEL, "model": "H100-80GB"})
    assert again["state"] == "granted", again

    def resumed() -> dict[str, Any] | None:
        lease: dict[str, Any] = hub.ok(mine, "GET", f"leases/{lease_id}")
        return lease if lease["suspended"] is None else None

    over = wait_for("nobody's kernel to resume", resumed, log=hub.log)
    (new_gpu,) = again["lease"]["devices"]
    assert over["reason"].endswith(f"resumed, its GPU memory back on the GPU ({new_gpu})")
    assert hub.ok(mine, "GET", f"leases/{again['lease']['id']}")["state"] == "active"
    hub.ok(mine, "DELETE", f"leases/{again['lease']['id']}")


def test_a_renewal_naming_another_users_process_is_refused_and_it_stays_outside_use(
    hub: Hub, machine_file: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    mine, admin = hub.user("nobody"), hub.user("admin")
    lease = hub.ok(mine, "POST", "requests", {"gpus": 1, "holder": "k-nobody-2"})["lease"]
    (uuid,) = lease["devices"]
    devices = {d["uuid"]: d for g in hub.ok(admin, "GET", "devices")["gpus"] for d in g["devices"]}
    index = int(devices[uuid]["label"].split()[-1])
    roots = sleeper(procs)  # root's, computing on nobody's GPU once the service restarts
    machine(machine_file, {index: [roots]})
    hub.kill_service()

    status, reply = hub.api(mine, "POST", f"leases/{lease['id']}/renew", {"holder_pid": roots})
    assert (status, reply) == (
        400,
        {"error": "not_your_process", "message": f"process {roots} belongs to root, not to nobody"},
    )

    def outside() -> list[dict[str, Any]]:
        found = {
            d["uuid"]: d for g in hub.ok(admin, "GET", "devices")["gpus"] for d in g["devices"]
        }
        return found[uuid]["outside"]  # type: ignore[no-any-return]

    (seen,) = wait_for("root's process to show as outside use", outside, log=hub.log)
    assert (seen["user"], seen["pid"]) == ("root", roots)
    assert hub.ok(mine, "GET", f"leases/{lease['id']}")["holder_pid"] is None
    hub.ok(mine, "DELETE", f"leases/{lease['id']}")
