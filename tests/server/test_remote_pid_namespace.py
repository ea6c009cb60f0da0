"""A central broker in a pid namespace of its own, as in a container of its own (made by
``unshare``), and a user's server whose kernels run in this test's namespace
(``test_remote_suspend``'s set-up, on the simulated checkpoint driver). The kernel's
renewals name its process by a pid of the server's namespace, which the broker does not
read: the broker says at its start that it runs in a namespace of its own, the idle kernel
is not suspended but shut down by its server (the fallback), and its lease says why."""

from __future__ import annotations

import asyncio
import getpass
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import test_remote
from live_server import UNSHARED, LiveServer
from test_kernels import until
from test_remote_suspend import SUSPENDING, idle_gpu_kernel

from jupyter_gpubroker.wire.text import KERNEL_PID_NAMESPACE

pytestmark = [
    pytest.mark.slow,  # real kernels, seconds-long timeouts
    pytest.mark.skipif(os.geteuid() != 0, reason="unshare --pid needs root"),
]
central_token, jp_server_config = test_remote.central_token, test_remote.jp_server_config


@pytest.fixture
def central(tmp_path: Path) -> Iterator[LiveServer]:
    """The central broker, its owner the test's user, in a pid namespace of its own."""
    home = tmp_path / "central"
    home.mkdir()
    options = {**SUSPENDING, "owner": getpass.getuser()}
    server = LiveServer(home, home / "state.sqlite", wrap=UNSHARED, **options)
    server.start()
    yield server
    server.stop()


async def test_a_central_broker_in_a_pid_namespace_of_its_own_suspends_no_kernel_outside_it(
    jp_serverapp: Any, gpu_kernelspec: Any, run_in_kernel: Any, central: LiveServer
) -> None:
    mkm = jp_serverapp.kernel_manager
    kid, _, lease = await idle_gpu_kernel(jp_serverapp, gpu_kernelspec, run_in_kernel, central)
    assert lease["state"] == "reclaimed" and lease["suspended"] is None, lease
    assert lease["reason"].endswith(f"; not suspended: {KERNEL_PID_NAMESPACE}")
    assert lease["on_reclaim"] == "shutdown"
    await until(lambda: asyncio.sleep(0, kid not in mkm), timeout=60)  # shut down by its server
    log = central.log.read_text()
    assert "GPU broker: it runs in a pid namespace of its own (pid:[" in log
    assert f"GPU broker: lease {lease['id']} of {getpass.getuser()}: {KERNEL_PID_NAMESPACE}" in log
