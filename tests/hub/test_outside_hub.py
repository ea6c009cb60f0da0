"""Use outside the broker under a real hub: the broker service on a machine where
``nobody`` (a real second OS user) already computes on GPU 1 when it starts. The service
sees it, grants nothing onto that GPU, alerts the admin, records it, tells the user on
their My GPUs page, and hands the GPU out again once the process is gone."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from bs4 import BeautifulSoup
from live_hub import Hub, wait_for

pytestmark = [
    pytest.mark.hub,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as another user"),
]
PAGES = "/services/gpubroker"


@pytest.fixture(scope="module")
def stray() -> Iterator[subprocess.Popen[bytes]]:
    """A program ``nobody`` started from a terminal, before the hub."""
    p = subprocess.Popen(["sleep", "600"], user=65534)
    yield p
    if p.poll() is None:
        p.kill()
    p.wait()


@pytest.fixture(scope="module")
def hub_options(
    tmp_path_factory: pytest.TempPathFactory, stray: subprocess.Popen[bytes]
) -> dict[str, Any]:
    machine = tmp_path_factory.mktemp("machine") / "two-h100.yaml"
    machine.write_text(
        yaml.safe_dump(
            {
                "version": "v1",
                "simulate": {
                    "gpu-model": "H100-80GB",
                    "gpu-count": 2,
                    "processes": {1: [stray.pid]},
                },
                "mig-configs": {"whole": [{"devices": "all", "mig-enabled": False}]},
            }
        )
    )
    return {"simulate": str(machine), "sample_interval": 0.5, "outside_use": "warn"}


def gpus(hub: Hub, token: str) -> list[dict[str, Any]]:
    return [d for g in hub.ok(token, "GET", "devices")["gpus"] for d in g["devices"]]


def test_a_gpu_in_use_outside_the_broker_is_seen_reported_and_given_back(
    hub: Hub, stray: subprocess.Popen[bytes]
) -> None:
    admin, alice = hub.user("admin"), hub.user("alice")

    def outside() -> Any:
        found = [d for d in gpus(hub, admin) if d["outside"]]
        return found[0] if found else None

    gpu1 = wait_for("the outside use to show", outside, log=hub.log)
    assert gpu1["label"] == "GPU 1" and gpu1["drained"]["cause"] == "outside"
    (seen,) = gpu1["outside"]
    assert (seen["user"], seen["pid"]) == ("nobody", stray.pid)
    assert seen["text"].startswith(f"GPU 1: in use outside the broker by nobody, pid {stray.pid}")
    alerts = hub.ok(admin, "GET", "alerts")["active"]
    assert [(a["kind"], a["label"]) for a in alerts] == [("outside", "GPU 1")]
    records = hub.ok(admin, "GET", "audit")["audit"]
    assert ("nobody", "outside_use", gpu1["uuid"]) in [
        (a["actor"], a["action"], a["target"]) for a in records
    ]

    # nobody's own page tells them; alice's does not
    mine = BeautifulSoup(
        hub.login("nobody").get(f"{hub.url}{PAGES}/", timeout=60).text, "html.parser"
    )
    notes = [n.get_text(strip=True) for n in mine.select(".gpubroker-outside")]
    assert len(notes) == 1 and notes[0].startswith("GPU 1: in use outside the broker by nobody")

    first = hub.ok(alice, "POST", "requests", {"gpus": 1, "holder": "hold"})
    second = hub.ok(alice, "POST", "requests", {"gpus": 1, "holder": "hold"})
    assert first["state"] == "granted" and first["lease"]["devices"] != [gpu1["uuid"]]
    assert second["state"] == "queued"  # GPU 1 takes no grant while nobody computes on it

    stray.kill()
    stray.wait()

    def granted() -> Any:
        r = hub.ok(alice, "GET", f"requests/{second['id']}")
        return r if r["state"] == "granted" else None

    r = wait_for("GPU 1 to be granted once the process is gone", granted, log=hub.log)
    assert r["lease"]["devices"] == [gpu1["uuid"]]
    usage = hub.ok(admin, "GET", "usage?by=job_class")["gpu_hours"]
    assert usage["unbrokered"] > 0
