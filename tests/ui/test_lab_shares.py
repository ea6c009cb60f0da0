"""The Lab panel on a machine without MIG whose GPUs are shared: a real Lab on a simulated
4x L40S, the simulated MPS daemons the broker runs for each share's user, Debian's
Chromium. The panel draws GPU 0's memory as its shares (mine and another user's) and
the room left, says what holds them, and lists my share in the words every front uses."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab_server import Lab

pytestmark = pytest.mark.slow  # a real Lab and a browser

WAIT_MS = 60_000
SCENE = '''
"""UI test scene: alice holds 20 GB of GPU 0."""

from tornado.ioloop import IOLoop

from jupyter_gpubroker.server import registry
from jupyter_gpubroker.wire.sizes import Size


def fill():
    broker = registry.current()
    if broker is None:
        IOLoop.current().call_later(0.2, fill)
        return
    broker.core.submit("alice", Size(share_gb=20), holder="training")


def _load_jupyter_server_extension(serverapp):
    IOLoop.current().call_later(0.2, fill)
'''


@pytest.fixture
def lab(tmp_path: Path, built_extension: Path) -> Iterator[Lab]:
    with tempfile.TemporaryDirectory(prefix="mps", dir="/tmp") as mps:  # sockets: 108 bytes
        config = {"sharing": "shared", "mps_dir": mps, "sample_interval": 1.0}
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
    assert mine["lease"]["share"]["text"] == "8.0 GB of GPU 0, enforced by MPS"
    page.locator(".jp-SideBar [data-id='jp-gpubroker-panel']").click()
    panel = page.locator("#jp-gpubroker-panel")
    panel.wait_for(timeout=WAIT_MS)
    lease = panel.locator(".jp-GpuBroker-lease", has_text="8.0 GB of GPU 0, enforced by MPS")
    lease.wait_for(timeout=WAIT_MS)
    gpu = panel.locator(".jp-GpuBroker-gpu").first
    gpu.get_by_text("shared · shares enforced by MPS").wait_for(timeout=WAIT_MS)
    segments = gpu.locator(".jp-GpuBroker-slice")
    assert segments.all_inner_texts() == ["alice", "mine", "free"]
    page.screenshot(path=str(tmp_path / "lab-shares.png"))
