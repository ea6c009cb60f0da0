"""The Lab panel on a machine without MIG whose GPUs are shared: a real Lab on a simulated
4x L40S, the simulated MPS daemons the broker runs for each share's user, Debian's
Chromium. The panel draws GPU 0's memory as its shares (mine and another user's) and
the room left, says what holds them, and lists my share in the words every front uses,
with its own memory in use and utilization (10%, where the GPU reads 70% with alice's
60%); the status bar says the same."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab_server import Lab
from loaded_process import loaded_process

pytestmark = pytest.mark.slow  # a real Lab and a browser

WAIT_MS = 60_000
SCENE = '''
"""UI test scene: alice holds 20 GB of GPU 0, her kernel (an MPS client) at 60%."""

import os
import subprocess

from tornado.ioloop import IOLoop

from jupyter_gpubroker.nvml.simulated import LOAD_ENV
from jupyter_gpubroker.procstat import proc_environ
from jupyter_gpubroker.server import registry
from jupyter_gpubroker.wire.sizes import Size


def fill():
    broker = registry.current()
    if broker is None:
        IOLoop.current().call_later(0.2, fill)
        return
    request = broker.core.submit("alice", Size(share_gb=20), holder="training")
    lease = broker.core.lease(request.lease_id)
    env = {**os.environ, **broker.share_of(lease)["env"], LOAD_ENV: "60"}
    report(broker, lease.id, subprocess.Popen(["sleep", "600"], env=env).pid)


def report(broker, lease_id, pid):
    """The kernel's pid, once its environment reads as given (it may still be loading)."""
    if LOAD_ENV.encode() not in (proc_environ(pid) or {}):
        IOLoop.current().call_later(0.05, report, broker, lease_id, pid)
        return
    broker.report_pid(lease_id, pid)


def _load_jupyter_server_extension(serverapp):
    IOLoop.current().call_later(0.2, fill)
'''


@pytest.fixture
def lab(tmp_path: Path, built_extension: Path) -> Iterator[Lab]:
    with tempfile.TemporaryDirectory(prefix="mps", dir="/tmp") as mps:  # sockets: 108 bytes
        config = {
            "sharing": "shared",
            "mps_dir": mps,
            "sample_interval": 1.0,
            "simulate_kernel_memory": 2048,  # NVML lists each share's holder with 2 GiB
        }
        server = Lab(
            tmp_path,
            built_extension,
            config,
            scene=SCENE,
            ready=lambda overview: (
                any(g.get("sharing") for g in overview["gpus"])
                and bool(overview["gpus"][0]["sharing"]["shares"])
            ),
            simulate="l40s-4",
        )
        server.start()
        try:
            yield server
        finally:
            server.stop()


def test_the_panel_shows_shares_and_what_holds_them(lab: Lab, page: Any, tmp_path: Path) -> None:
    mine = lab.api("POST", "requests", {"share_gb": 8, "holder": "cli"})
    share = mine["lease"]["share"]
    assert share["text"] == "8.0 GB of GPU 0, enforced by MPS"
    with loaded_process(10, share["env"]) as kernel:  # my kernel's load: 10%
        try:
            lab.api("POST", f"leases/{mine['lease']['id']}/renew", {"holder_pid": kernel.pid})
            wait_for_loads(lab, mine["lease"]["id"])
            page.reload()  # the panel reads the shares' figures with the overview
            panel_and_status(page, tmp_path)
        finally:
            kernel.kill()


def wait_for_loads(lab: Lab, lease_id: str) -> None:
    """Until the broker has sampled both shares: mine at 10%, alice's at 60%, the GPU 70%."""
    deadline = time.monotonic() + 30
    while True:
        (gpu, *_) = lab.api("GET", "devices")["gpus"]
        loads = sorted(x["utilization"] or 0 for x in gpu["sharing"]["shares"])
        if loads == [10.0, 60.0] and gpu["utilization_gpu"] == 70.0:
            assert lab.api("GET", f"leases/{lease_id}")["share"]["utilization"] == 10.0
            return
        assert time.monotonic() < deadline, f"the shares were never sampled: {gpu}"
        time.sleep(0.3)


def panel_and_status(page: Any, tmp_path: Path) -> None:
    page.locator(".jp-SideBar [data-id='jp-gpubroker-panel']").click()
    panel = page.locator("#jp-gpubroker-panel")
    panel.wait_for(timeout=WAIT_MS)
    lease = panel.locator(".jp-GpuBroker-lease", has_text="8.0 GB of GPU 0, enforced by MPS")
    lease.wait_for(timeout=WAIT_MS)
    gpu = panel.locator(".jp-GpuBroker-gpu").first
    gpu.get_by_text("shared · shares enforced by MPS").wait_for(timeout=WAIT_MS)
    segments = gpu.locator(".jp-GpuBroker-slice")
    assert segments.all_inner_texts() == ["alice", "mine", "free"]
    titles = [segments.nth(i).get_attribute("title") for i in range(2)]
    assert titles == ["alice: 20.0 GB · 60%", "mine: 8.0 GB · 10%"]
    # my share's own load, not the GPU's 70%
    assert "using 2.1 GB · util 10%" in lease.inner_text()
    page.locator(".jp-GpuBroker-status", has_text="8 GB of a shared GPU 10%").wait_for(
        timeout=WAIT_MS
    )
    page.screenshot(path=str(tmp_path / "lab-shares.png"))
