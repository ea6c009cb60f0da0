"""Moving kernels end to end on the simulated checkpoint driver: a real jupyter-server on
eight simulated H100s, real GPU kernels started through the provisioner. Draining their
GPUs with ``move`` carries every kernel, idle or running a cell, to another H100: the same
process, its variables intact, its cell paused and then continued, its notebook told."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from suspend_cells import KERNEL_MIB, Cell, driver_of, until, use_gpu

from jupyter_gpubroker.api import API_PREFIX
from jupyter_gpubroker.suspend import ProcessState

pytestmark = pytest.mark.slow  # real kernels

BUSY = (
    "import time\nticks = []\nfor i in range(30):\n    ticks.append(i)\n    time.sleep(0.1)\n"
    "print('done', len(ticks), numbers)"
)
"""A cell that runs about three seconds: it is running while its kernel moves."""


@pytest.fixture
def broker_config(broker_config: dict[str, Any]) -> dict[str, Any]:
    """conftest's, on eight H100s; idle reclaim stays out of the way: only drains move."""
    return {**broker_config, "simulate": "dgx-h100", "idle_timeout": 600.0}


async def moved(api: Any, lease_id: str, old: str) -> dict[str, Any]:
    async def off() -> dict[str, Any] | None:
        _, lease = await api("GET", f"leases/{lease_id}")
        return lease if lease["devices"] != [old] and lease["moved"] else None

    return await until(f"lease {lease_id} to move off {old}", off)  # type: ignore[no-any-return]


async def test_a_drain_moves_three_idle_kernels_and_a_busy_one_with_nothing_lost(
    jp_serverapp: Any, api: Any, gpu_kernelspec: Any, monkeypatch: Any
) -> None:
    km = jp_serverapp.kernel_manager
    simulator = jp_serverapp.web_app.settings["gpubroker"].backend.simulator
    driver = driver_of(jp_serverapp)
    spec = gpu_kernelspec("gpu-1", gpus=1)
    started = [await km.start_kernel(kernel_name=spec) for _ in range(4)]
    try:
        kernels = [await use_gpu(jp_serverapp, api, k) for k in started]
        olds = {gpu for *_, gpu in kernels}
        assert len(olds) == 4
        busy_id, busy_pid, *_ = kernels[3]
        busy = Cell(km.get_kernel(busy_id), BUSY)
        await until("the busy cell to start", lambda: _running(km, busy_id))
        checkpointed: list[bool] = []  # at each checkpoint of the busy kernel: had its cell ended?
        checkpoint = driver.checkpoint

        def watched(pid: int) -> None:
            if pid == busy_pid:
                checkpointed.append(busy.task.done())
            checkpoint(pid)

        monkeypatch.setattr(driver, "checkpoint", watched)

        for _, _, _, gpu in kernels:
            status, answer = await api(
                "POST", f"devices/{gpu}/drain", {"reason": "maintenance", "move": True}
            )
            assert status == 200, answer
            assert list(answer["moves"].values()) == ["moving"]
        leases = [await moved(api, lease_id, gpu) for _, _, lease_id, gpu in kernels]

        assert checkpointed == [False]  # the busy kernel was suspended mid-cell, once
        assert (await busy.result()).endswith("done 30 [1, 2, 3]")  # and then went on
        gpus = jp_serverapp.web_app.settings["gpubroker"].core.inventory
        for (kernel_id, pid, _, old), lease in zip(kernels, leases, strict=True):
            (new,) = lease["devices"]
            assert new not in olds and lease["state"] == "active"
            assert simulator.process_memory(pid) == {new: KERNEL_MIB}  # the same process
            assert driver.state(pid) is ProcessState.RUNNING
            text = (
                f"moved from {gpus.device(old).label} to {gpus.device(new).label}: "
                f"{gpus.device(old).label} is drained by "
            )
            assert lease["moved"]["text"].startswith(text), lease["moved"]
            assert lease["moved"]["text"].endswith(": maintenance")
            shown = await Cell(km.get_kernel(kernel_id), "print(numbers)").result()
            line = f"{lease['moved']['text'][:1].upper()}{lease['moved']['text'][1:]}."
            assert shown.splitlines() == [line, "[1, 2, 3]"], shown
        assert len({lease["devices"][0] for lease in leases}) == 4
        assert all(k in km for k in started)  # 0 kernels lost

        _, audit = await api("GET", "audit")
        records = [a for a in audit["audit"] if a["action"] == "move"]
        assert sorted(r["target"] for r in records) == sorted(k[2] for k in kernels)
        for record in records:
            assert not record["detail"].get("not_moved")
            assert record["detail"]["reason"].endswith(": maintenance")
    finally:
        for kernel_id in started:
            if kernel_id in km:
                await km.shutdown_kernel(kernel_id)


async def _running(km: Any, kernel_id: str) -> bool:
    """Whether the kernel is busy with the cell (its execution state, as Jupyter sees it)."""
    await asyncio.sleep(0.3)
    return km.get_kernel(kernel_id).execution_state == "busy"  # type: ignore[no-any-return]


DOCS_DRAIN = 'jupyter gpubroker drain GPU-... --reason "fan replacement" --move'
"""docs/suspend.md's command, run as shown with a GPU's UUID for ``GPU-...``."""


async def shell(jp_serverapp: Any, command: str) -> tuple[int, str, str]:
    """Run a command line as an admin types it, the broker's URL and token in the
    environment: its exit status, stdout and stderr."""
    port, base = jp_serverapp.port, jp_serverapp.base_url
    env = {
        **os.environ,
        "GPUBROKER_URL": f"http://localhost:{port}{base}{API_PREFIX}",
        "GPUBROKER_JUPYTER_TOKEN": jp_serverapp.identity_provider.token,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    proc = await asyncio.create_subprocess_shell(
        command, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    assert "Traceback" not in err.decode()
    return proc.returncode or 0, out.decode().strip(), err.decode().strip()


async def test_drain_move_from_the_command_line_says_where_the_kernel_went(
    jp_serverapp: Any, api: Any, gpu_kernelspec: Any
) -> None:
    assert DOCS_DRAIN in (Path(__file__).parents[2] / "docs" / "suspend.md").read_text()
    km = jp_serverapp.kernel_manager
    kernel_id = await km.start_kernel(kernel_name=gpu_kernelspec("gpu-1", gpus=1))
    try:
        _, pid, lease_id, old = await use_gpu(jp_serverapp, api, kernel_id)
        code, out, err = await shell(jp_serverapp, DOCS_DRAIN.replace("GPU-...", old))
        assert (code, err) == (0, ""), err
        _, lease = await api("GET", f"leases/{lease_id}")
        (new,) = lease["devices"]
        gpus = jp_serverapp.web_app.settings["gpubroker"].core.inventory
        before, after = gpus.device(old).label, gpus.device(new).label
        assert new != old
        assert out.splitlines() == [
            f"{old} takes no new grants until an admin undrains it; 1 of its 1 kernel(s) "
            "moving to other GPUs",
            f"  {lease_id}: moved from {before} to {after}: {before} is drained by "
            f"{lease['user']}: fan replacement",
        ]
        shown = await Cell(km.get_kernel(kernel_id), "print(numbers)").result()
        assert shown.endswith("[1, 2, 3]") and kernel_id in km

        # Bad input gets a sentence and changes nothing.
        command = DOCS_DRAIN.replace("GPU-...", "GPU-no-such-gpu")
        code, out, err = await shell(jp_serverapp, command)
        assert (code, out) == (1, "")
        assert err == "error: no GPU or device 'GPU-no-such-gpu'", err
        code, out, err = await shell(jp_serverapp, DOCS_DRAIN.replace('"fan replacement"', '" "'))
        assert code != 0 and out == "" and err.startswith("error: send {'reason'"), err
        _, still = await api("GET", f"leases/{lease_id}")
        assert still["devices"] == [new] and still["state"] == "active"
    finally:
        if kernel_id in km:
            await km.shutdown_kernel(kernel_id)
