"""A GPU kernel in a pid namespace of its own, as in a container of its own (made by
``unshare``), under the server's broker in this test's namespace: a real jupyter-server,
a real kernel that asks for a GPU with ``%gpu request``, the simulated checkpoint driver.
The kernel's renewals name its process by its pid in its namespace (2: a shell is its
init there), which in the broker's names another process. The broker does not read that
pid: the lease is renewed, idle reclaim suspends nothing and acts on no process, the
kernel is shut down by its server (the fallback), and its lease says why."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from suspend_cells import KERNEL_MIB, Cell, driver_of, ended, until

from jupyter_gpubroker.kernelspec import spec_for
from jupyter_gpubroker.wire.text import KERNEL_PID_NAMESPACE
from jupyter_gpubroker.wire.times import parse_iso

pytestmark = [
    pytest.mark.slow,  # real kernels, seconds-long timeouts
    pytest.mark.skipif(os.geteuid() != 0, reason="unshare --pid needs root"),
]
UNSHARED = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
IN_ITS_NAMESPACE = ["sh", "-c", 'JPY_PARENT_PID=1 "$@" & wait', "sh"]
"""A shell as the namespace's init, the kernel its child: pid 2 there (started by init, as
a container's kernel may be, it must not take init for a parent that exited)."""


def unshared_kernelspec(kernel_dir: Path) -> str:
    """An on-demand GPU kernelspec whose kernel runs in a pid namespace of its own."""
    _, spec = spec_for(None)
    spec["argv"] = [*UNSHARED, *IN_ITS_NAMESPACE, *spec["argv"]]  # type: ignore[misc]
    (kernel_dir / "unshared").mkdir(parents=True, exist_ok=True)
    (kernel_dir / "unshared" / "kernel.json").write_text(json.dumps(spec))
    return "unshared"


def children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


async def test_a_kernel_in_a_pid_namespace_of_its_own_is_not_suspended_and_says_why(
    jp_serverapp: Any, api: Any, km: Any, simulator: Any, kernels: Any, jp_kernel_dir: Path
) -> None:
    kernel_id = await kernels(kernel_name=unshared_kernelspec(jp_kernel_dir))
    kernel = km.get_kernel(kernel_id)
    cell = (
        "%gpu request --gpus 1\nimport os\nprint(os.getpid(), os.environ['CUDA_VISIBLE_DEVICES'])"
    )
    out = (await Cell(kernel, cell).result()).splitlines()[-1]
    pid_there, gpu = out.split()
    assert pid_there == "2", out  # its pid in its own namespace
    (shell,) = children(kernel.provisioner.pid)  # unshare's child, init of the namespace
    (pid_here,) = children(shell)  # the kernel, as this namespace (and NVML) names it
    simulator.add_process(gpu, pid_here, KERNEL_MIB, follow=True)  # CUDA used in the kernel
    _, leases = await api("GET", "leases")
    (lease,) = [x for x in leases["leases"] if x["devices"] == [gpu]]

    async def renewed() -> Any:  # naming pid 2 of its namespace: renewed, not read
        _, now = await api("GET", f"leases/{lease['id']}")
        later = parse_iso(now["expires_at"]) - parse_iso(now["granted_at"]) > now["ttl_s"]
        return now if later else None

    now = await until("its first renewal", renewed)
    assert now["state"] == "active" and now["holder_pid"] is None, now
    ended_lease = await ended(api, lease["id"])
    assert ended_lease["state"] == "reclaimed", ended_lease
    assert ended_lease["reason"].endswith(f"; not suspended: {KERNEL_PID_NAMESPACE}")
    assert ended_lease["suspended"] is None and ended_lease["on_reclaim"] == "shutdown"
    assert driver_of(jp_serverapp).calls == []  # no process was touched, pid 2 here least
    await until("its server to shut it down", lambda: _gone(km, kernel_id), timeout=60)


async def _gone(km: Any, kernel_id: str) -> bool:
    return kernel_id not in km
