"""Suspend through a central broker (remote mode, ``test_remote``'s set-up): the central
broker, on a simulated whole H100 with the simulated checkpoint driver, suspends the idle
kernel of a user's server where that kernel runs on its machine as its lease's user, the
server leaves the suspended kernel running, and its next cell resumes it in the same
process. Where the lease's user has no account on the broker's machine the kernel is not
suspended: the fallback is carried out by its server, and the lease says why."""

from __future__ import annotations

import asyncio
import getpass
import os
import pwd
import signal
from typing import Any

import pytest
import test_remote
from live_server import LiveServer
from test_kernels import until
from test_remote import central_api

from jupyter_gpubroker.wire.text import ENDED_EXITED, suspended_text

pytestmark = pytest.mark.slow  # real kernels, seconds-long timeouts
KERNEL_MIB = 4096
SUSPENDING = {
    "holder_account": "user",  # as the hub service: each user's kernels run as their account
    "simulate": "dgx-h100:1",
    "reclaim_action": "suspend",
    "simulate_kernel_memory": KERNEL_MIB,  # each kernel listed on its GPU, as CUDA lists it
    "sample_interval": 0.25,
    "idle_timeout": 4.0,  # longer than a kernel's start and first cell on a busy machine
    "grace": 1.0,
    "stalled_timeout": 0.0,
    "lease_ttl": 3.0,
}
central, central_token, jp_server_config = (  # test_remote's set-up, its fixtures
    test_remote.central,
    test_remote.central_token,
    test_remote.jp_server_config,
)
USE = "import os\nnumbers = [1, 2, 3]\nprint(os.getpid(), os.environ['GPUBROKER_LEASE_ID'])"


@pytest.fixture
def central_options() -> dict[str, Any]:
    """The central broker's owner, whose token the user's server holds, is the user these
    tests run as: the kernels' processes are that user's on the broker's machine."""
    return {**SUSPENDING, "owner": getpass.getuser()}


async def idle_gpu_kernel(
    jp_serverapp: Any, gpu_kernelspec: Any, run_in_kernel: Any, central: LiveServer
) -> tuple[str, int, dict[str, Any]]:
    """A kernel of the user's server on a whole GPU, a variable set, left idle until the
    central broker ends its lease: (its id, its pid, the ended lease)."""
    mkm = jp_serverapp.kernel_manager
    kid = await mkm.start_kernel(kernel_name=gpu_kernelspec("gpu-1", gpus=1))
    pid, lease_id = (await run_in_kernel(mkm.get_kernel(kid), USE)).split()
    broker = central_api(central)

    async def ended() -> dict[str, Any] | None:
        lease: dict[str, Any] = await broker.lease(lease_id)
        return lease if lease["state"] != "active" else None

    return kid, int(pid), await until(ended, timeout=60)


async def test_an_idle_remote_kernel_is_suspended_by_the_central_broker_and_resumes(
    jp_serverapp: Any, gpu_kernelspec: Any, run_in_kernel: Any, central: LiveServer
) -> None:
    mkm = jp_serverapp.kernel_manager
    kid, pid, lease = await idle_gpu_kernel(jp_serverapp, gpu_kernelspec, run_in_kernel, central)
    assert lease["state"] == "reclaimed", lease
    assert lease["reason"].endswith("suspended, its 4.2 GB of GPU memory on the host")
    assert lease["suspended"]["kernel_id"] == kid
    assert lease["suspended"]["text"] == suspended_text(KERNEL_MIB)
    assert lease["on_reclaim"] == "suspend"  # its server leaves it running
    broker = central_api(central)
    assert [x["id"] for x in (await broker.overview())["suspended"]] == [lease["id"]]

    await asyncio.sleep(3)  # longer than a reclaimed kernel's notice before its shutdown
    assert kid in mkm
    out = await run_in_kernel(mkm.get_kernel(kid), "print(sum(numbers), os.getpid())")
    assert out == f"6 {pid}"  # the same process, with its variables
    (gpu,) = lease["devices"]
    resumed_text = f"resumed, its GPU memory back on the GPU ({gpu})"
    assert (await broker.lease(lease["id"]))["reason"].endswith(resumed_text)
    assert (await broker.overview())["suspended"] == []
    (resumed,) = await broker.leases()
    assert resumed["devices"] == [gpu] and resumed["holder_pid"] == pid


async def test_a_suspended_remote_kernel_whose_process_dies_is_suspended_no_more(
    jp_serverapp: Any, gpu_kernelspec: Any, run_in_kernel: Any, central: LiveServer
) -> None:
    """The central broker has no kernel manager for it: it sees the process end."""
    _, pid, lease = await idle_gpu_kernel(jp_serverapp, gpu_kernelspec, run_in_kernel, central)
    assert lease["suspended"] is not None, lease
    os.kill(pid, signal.SIGKILL)  # the out-of-memory killer, say
    broker = central_api(central)

    async def over() -> dict[str, Any] | None:
        now: dict[str, Any] = await broker.lease(lease["id"])
        return now if now["suspended"] is None else None

    assert (await until(over, timeout=30))["reason"].endswith(ENDED_EXITED)
    assert (await broker.overview())["suspended"] == []


@pytest.mark.parametrize("central_options", [{**SUSPENDING, "owner": "alice"}])
async def test_a_remote_kernel_whose_user_has_no_account_on_the_brokers_machine_is_shut_down(
    jp_serverapp: Any, gpu_kernelspec: Any, run_in_kernel: Any, central: LiveServer
) -> None:
    """The lease's user, alice, names the holder process in her renewals; with no account
    on the broker's machine no process there is hers to suspend: the fallback (shutdown,
    the default) is carried out by her server."""
    mkm = jp_serverapp.kernel_manager
    kid, _, lease = await idle_gpu_kernel(jp_serverapp, gpu_kernelspec, run_in_kernel, central)
    assert lease["state"] == "reclaimed" and lease["suspended"] is None, lease
    assert lease["reason"].startswith("idle for")
    assert lease["reason"].endswith(
        "; not suspended: alice has no account on the GPU broker's machine"
    )
    assert lease["on_reclaim"] == "shutdown"
    await until(lambda: asyncio.sleep(0, kid not in mkm), timeout=60)  # shut down by its server


def _has_account(user: str) -> bool:
    try:
        return pwd.getpwnam(user).pw_uid != os.getuid()
    except KeyError:
        return False


@pytest.mark.skipif(not _has_account("nobody"), reason="no other local account: nobody")
@pytest.mark.parametrize(
    "central_options", [{**SUSPENDING, "owner": "nobody", "suspend_fallback": "revoke"}]
)
async def test_a_remote_kernel_whose_process_is_not_its_users_is_not_suspended(
    jp_serverapp: Any, gpu_kernelspec: Any, run_in_kernel: Any, central: LiveServer
) -> None:
    """The lease's user, nobody, has an account here, but the process the renewals name
    (the kernel, run as the test's user) is not nobody's: the central broker refuses it as
    the lease's holder (the server renews without it), so it is not touched; the fallback,
    revoke, is carried out by the server (the kernel is interrupted and runs on)."""
    mkm = jp_serverapp.kernel_manager
    kid, pid, lease = await idle_gpu_kernel(jp_serverapp, gpu_kernelspec, run_in_kernel, central)
    assert lease["state"] == "reclaimed" and lease["suspended"] is None, lease
    assert lease["reason"].endswith("; not suspended: the kernel never named its process")
    assert lease["on_reclaim"] == "revoke"
    await asyncio.sleep(3)  # longer than a reclaimed kernel's notice before its shutdown
    assert await run_in_kernel(mkm.get_kernel(kid), "print(sum(numbers))") == "6"
