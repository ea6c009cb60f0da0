"""Suspend end to end on the simulated checkpoint driver: a real jupyter-server, a real GPU
kernel started through the provisioner. The idle kernel is suspended (its memory leaves
the GPU in NVML's eyes), the waiting request gets the GPU, the kernel's next cell waits in
the queue with its position shown, then runs in the same process with its variables."""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from openapi_check import validate
from suspend_cells import (
    KERNEL_MIB,
    Cell,
    driver_of,
    ended,
    granted,
    queued,
    until,
    use_gpu,
)

from jupyter_gpubroker.kernelspec import spec_for
from jupyter_gpubroker.nvml import NvmlBackend
from jupyter_gpubroker.runtime import inventory
from jupyter_gpubroker.suspend.simulated import SimulatedCheckpointDriver
from jupyter_gpubroker.wire.text import (
    ENDED_AWAY,
    ENDED_EXITED,
    ENDED_RESTARTED,
    ENDED_SHUT_DOWN,
    SUSPENDED_TEXT,
    suspended_text,
)

pytestmark = pytest.mark.slow  # real kernels, seconds-long timeouts
WIDGET_ENDED = (
    "import time\nw, deadline = _.widget, time.time() + 10\n"
    "while w.state != 'ended' and time.time() < deadline:\n    time.sleep(0.05)\n"
    "print(w.state, '|', w.text())"
)
"""The ``%gpu status`` widget of the cell before (``_``) once its kernel is resumed."""


@asynccontextmanager
async def following(
    jp_serverapp: Any, api: Any, lease_id: str
) -> AsyncIterator[list[dict[str, Any]]]:
    """The event stream of the lease's user, as the Lab panel follows it: its messages as
    they come, each checked against the API's document, until the block ends."""
    _, lease = await api("GET", f"leases/{lease_id}")
    rules = jp_serverapp.web_app.settings["gpubroker_api"]
    seen: list[dict[str, Any]] = []

    def send(message: dict[str, Any]) -> None:
        validate(message, "#/components/schemas/Event", f"event {message['type']}")
        seen.append(message)

    _, leave = rules.follow(rules.user_identity(lease["user"]), send=send)
    try:
        yield seen
    finally:
        leave()


def seen(events: list[dict[str, Any]], kind: str) -> Any:
    """A predicate for ``until``: the events of a kind seen so far."""

    async def found() -> list[dict[str, Any]]:
        return [e for e in events if e["type"] == kind]

    return found


async def overview(api: Any) -> dict[str, Any]:
    status, body = await api("GET", "overview")
    assert status == 200
    validate(body, "#/components/schemas/Overview", "the overview")
    return body  # type: ignore[no-any-return]


async def test_an_idle_kernel_is_suspended_and_resumes_on_its_next_cell(
    jp_serverapp: Any, api: Any, km: Any, simulator: Any, suspendable: Any
) -> None:
    kernel_id, pid, lease_id, gpu = suspendable
    async with following(jp_serverapp, api, lease_id) as events:
        _, other = await api("POST", "requests", {"gpus": 1, "holder": "other-kernel"})
        assert other["state"] == "queued"

        lease = await ended(api, lease_id)
        assert lease["state"] == "reclaimed"
        text = "suspended, its 4.2 GB of GPU memory on the host: its next cell resumes it"
        assert suspended_text(KERNEL_MIB) == text
        assert lease["suspended"] == {
            "host_mib": KERNEL_MIB,
            "text": text,
            "kernel_id": kernel_id,
            "model": "H100-80GB",  # what its resume asks for: CUDA restores onto that chip
            "waiting": None,
        }
        assert lease["reason"].startswith("idle for")
        assert lease["reason"].endswith("suspended, its 4.2 GB of GPU memory on the host")
        assert simulator.process_memory(pid) == {}  # NVML lists nothing on the GPU
        assert kernel_id in km  # the kernel runs on, on the CPU

        # Every front sees it: the overview, the event that ended the lease, %gpu.
        assert [x["id"] for x in (await overview(api))["suspended"]] == [lease_id]
        (reclaimed,) = await until("the lease's end on the event stream", seen(events, "reclaimed"))
        assert reclaimed["data"]["cause"] == "suspended"
        assert reclaimed["data"]["request"]["lease"]["suspended"]["text"] == text
        status = await Cell(km.get_kernel(kernel_id), "%gpu status").result()
        assert status == (
            f"This kernel is {text}.\nIt held {gpu}; its next cell asks for one GPU again "
            "and waits in the queue like any request."
        )

        other = await until("the other request to get the GPU", granted(api, other["id"]))
        assert other["lease"]["devices"] == [gpu]

        # The next cell waits in the queue, its position shown in the cell.
        cell = Cell(km.get_kernel(kernel_id), "print(sum(numbers), os.getpid())")

        waiting = await until("the kernel to ask for its GPU again", queued(api, kernel_id))
        assert waiting["position"] == 1 and waiting["gpus"] == 1
        assert waiting["model"] == "H100-80GB"  # the same chip

        await until("the cell to show its place in the queue", lambda: cell.shows("position 1"))
        assert f"This kernel is {SUSPENDED_TEXT}: waiting for one H100-80GB GPU" in cell.text
        assert not cell.task.done()

        await api("DELETE", f"leases/{other['lease']['id']}")  # the other kernel is done
        out = await cell.result()
        assert out.endswith(f"Resumed on {gpu}.\n6 {pid}"), out  # same process, same variables
        assert simulator.process_memory(pid) == {gpu: KERNEL_MIB}
        _, resumed = await api("GET", f"leases/{lease_id}")
        assert resumed["suspended"] is None
        why = f"resumed, its GPU memory back on the GPU ({gpu})"
        assert resumed["reason"].endswith(f"suspended, its 4.2 GB of GPU memory on the host; {why}")
        assert (await overview(api))["suspended"] == []
        (over,) = await until("the suspension's end", seen(events, "suspension_ended"))
        assert over["data"]["lease_id"] == lease_id and over["data"]["reason"] == why
        assert over["data"]["request"]["lease"]["suspended"] is None
        # The %gpu status widget shown while suspended says so too, from the kernel's feed.
        status = await Cell(km.get_kernel(kernel_id), WIDGET_ENDED).result()
        assert status == f"ended | This kernel is suspended no more: {why}."


@pytest.mark.parametrize(
    "fault, said",
    [
        (
            lambda driver, pid: setattr(driver, "why_unavailable", "no checkpoint API here"),
            "not suspended: this machine cannot suspend a kernel: no checkpoint API here",
        ),
        (
            lambda driver, pid: driver.busy.add(pid),
            "not suspended: the kernel's GPU work did not pause within 10 s",
        ),
        (
            lambda driver, pid: driver.refuse.__setitem__(pid, "operation not supported"),
            "not suspended: the driver cannot suspend this kernel: operation not supported",
        ),
        (
            lambda driver, pid: driver.breaks.__setitem__(pid, "unknown error"),
            "not suspended: suspending failed and the kernel's GPU memory is lost: unknown error",
        ),
    ],
    ids=["no-api", "lock-timeout", "unsupported", "checkpoint-fails"],
)
async def test_a_kernel_that_cannot_be_suspended_gets_the_fallback_with_the_reason(
    jp_serverapp: Any, api: Any, km: Any, suspendable: Any, fault: Any, said: str
) -> None:
    kernel_id, pid, lease_id, gpu = suspendable
    fault(driver_of(jp_serverapp), pid)
    lease = await ended(api, lease_id)
    assert lease["state"] == "reclaimed" and lease["suspended"] is None
    assert lease["reason"].startswith("idle for") and lease["reason"].endswith(said)
    (record,) = jp_serverapp.web_app.settings["gpubroker"].core.store.reclaims()
    assert record["kind"] == "idle"  # the verdict's cause: it was not suspended

    async def shut_down() -> bool:
        return kernel_id not in km

    await until("the fallback (shutdown) to stop the kernel", shut_down)


@pytest.fixture
def host_without_the_memory(jp_serverapp: Any) -> Any:
    """The broker's suspender, configured to keep a kernel it cannot suspend, on a host
    with 1 GiB free for a kernel's 4 GiB."""
    suspender = jp_serverapp.web_app.settings["gpubroker"].suspender
    suspender.fallback = "keep"
    suspender.suspender.host_mib = lambda: 1024.0
    return suspender


@pytest.mark.usefixtures("host_without_the_memory")  # before the kernel starts
async def test_a_host_without_the_memory_keeps_the_kernel_as_configured(
    jp_serverapp: Any, api: Any, simulator: Any, suspendable: Any
) -> None:
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    kernel_id, pid, lease_id, gpu = suspendable
    driver = driver_of(jp_serverapp)

    async def tried() -> bool:
        return not runtime.suspender.suspended and ("state", pid) in driver.calls

    await until("a suspend to be tried", tried)
    await until("the next idle warning", lambda: _warned(api, lease_id))
    _, lease = await api("GET", f"leases/{lease_id}")
    assert lease["state"] == "active"  # kept: the kernel holds its GPU
    assert ("lock", pid) not in driver.calls  # nothing was touched
    assert simulator.process_memory(pid) == {gpu: KERNEL_MIB}


async def _warned(api: Any, lease_id: str) -> bool:
    _, lease = await api("GET", f"leases/{lease_id}")
    return lease["reclaim_at"] is not None


async def test_interrupting_the_wait_withdraws_the_request_and_stays_suspended(
    api: Any, km: Any, simulator: Any, suspendable: Any
) -> None:
    kernel_id, pid, lease_id, gpu = suspendable
    _, other = await api("POST", "requests", {"gpus": 1, "holder": "other-kernel"})
    await ended(api, lease_id)
    cell = Cell(km.get_kernel(kernel_id), "print(sum(numbers))")

    await until("the cell to wait in the queue", lambda: cell.shows("position 1"))
    await km.interrupt_kernel(kernel_id)
    out = await cell.result()
    assert f"interrupted: the kernel stays {SUSPENDED_TEXT}" in out
    assert "6" not in out.splitlines()  # the cell did not run
    _, listed = await api("GET", "requests")
    assert not [r for r in listed["requests"] if r["holder"] == kernel_id]  # withdrawn
    _, lease = await api("GET", f"leases/{lease_id}")
    assert lease["suspended"] is not None and simulator.process_memory(pid) == {}
    released = await Cell(km.get_kernel(kernel_id), "%gpu release").result()
    assert released.strip() == (  # nothing to release, and where its memory is
        f"This kernel holds no GPU: it is {suspended_text(KERNEL_MIB)}. "
        "Restarting the kernel frees that memory."
    )

    _, other = await api("GET", f"requests/{other['id']}")
    await api("DELETE", f"leases/{other['lease']['id']}")
    out = await Cell(km.get_kernel(kernel_id), "print(sum(numbers))").result()
    assert out.endswith(f"Resumed on {gpu}.\n6")  # the next cell resumes it


async def test_a_suspended_kernel_that_is_shut_down_is_suspended_no_more(
    jp_serverapp: Any, api: Any, km: Any, suspendable: Any
) -> None:
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    kernel_id, pid, lease_id, gpu = suspendable
    await ended(api, lease_id)
    assert driver_of(jp_serverapp).held() == {pid: {gpu: KERNEL_MIB}}
    await km.shutdown_kernel(kernel_id)
    _, lease = await api("GET", f"leases/{lease_id}")
    assert lease["suspended"] is None
    assert lease["reason"].endswith(f"on the host; {ENDED_SHUT_DOWN}")
    assert (await overview(api))["suspended"] == []
    assert runtime.suspender.suspended == {}
    assert driver_of(jp_serverapp).held() == {}  # its memory on the host went with it


async def test_a_suspended_kernel_whose_process_dies_is_suspended_no_more(
    jp_serverapp: Any, api: Any, km: Any, suspendable: Any
) -> None:
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    kernel_id, pid, lease_id, gpu = suspendable
    async with following(jp_serverapp, api, lease_id) as events:
        await ended(api, lease_id)
        assert [x["id"] for x in (await overview(api))["suspended"]] == [lease_id]
        kernel = km.get_kernel(kernel_id)
        kernel.stop_restarter()  # nobody restarts it, nor tells the broker
        os.kill(pid, signal.SIGKILL)  # the out-of-memory killer, say

        # A sampling pass finds it gone (8 intervals: a busy machine runs some late).
        (over,) = await until(
            "the suspension's end",
            seen(events, "suspension_ended"),
            timeout=8 * runtime.sample_interval,
        )
        assert over["data"]["lease_id"] == lease_id
        assert over["data"]["reason"] == ENDED_EXITED
        _, lease = await api("GET", f"leases/{lease_id}")
        assert lease["suspended"] is None
        assert lease["reason"].endswith(f"on the host; {ENDED_EXITED}")
        assert (await overview(api))["suspended"] == []
        assert runtime.suspender.suspended == {}
        assert kernel_id in km and kernel.provisioner.pid == pid  # neither restarted nor shut


async def test_a_restore_that_fails_releases_the_gpu_and_says_so_in_the_cell(
    jp_serverapp: Any, api: Any, km: Any, suspendable: Any
) -> None:
    kernel_id, pid, lease_id, gpu = suspendable
    await ended(api, lease_id)
    driver_of(jp_serverapp).breaks[pid] = "unknown error"
    out = await Cell(km.get_kernel(kernel_id), "print(sum(numbers))").result()
    assert out.endswith(
        "the kernel could not be resumed: its restore failed (unknown error); "
        "its GPU memory is lost"
    ), out
    _, leases = await api("GET", "leases")
    assert leases["leases"] == []  # the GPU it was granted is released
    _, lease = await api("GET", f"leases/{lease_id}")
    assert lease["suspended"] is None  # lost: nothing left to resume


async def test_a_suspended_kernel_that_is_restarted_runs_its_cells_as_a_new_kernel(
    jp_serverapp: Any, api: Any, km: Any, simulator: Any, suspendable: Any
) -> None:
    kernel_id, pid, lease_id, gpu = suspendable
    async with following(jp_serverapp, api, lease_id) as events:
        await ended(api, lease_id)
        await km.restart_kernel(kernel_id)  # a new process: the old one's memory went with it
        _, lease = await api("GET", f"leases/{lease_id}")
        assert lease["suspended"] is None
        assert lease["reason"].endswith(f"on the host; {ENDED_RESTARTED}")
        assert (await overview(api))["suspended"] == []
        (over,) = await until("the suspension's end", seen(events, "suspension_ended"))
        assert over["data"]["lease_id"] == lease_id
        assert over["data"]["reason"] == ENDED_RESTARTED

        # Its first cell runs at once, on the GPU its kernelspec asked for at the restart.
        out = await Cell(
            km.get_kernel(kernel_id),
            "import os\nprint(os.getpid(), os.environ['GPUBROKER_LEASE_ID'], 'numbers' in dir())",
        ).result()
        new_pid, new_lease_id, kept = out.split()
        assert int(new_pid) != pid and new_lease_id != lease_id and kept == "False"
        _, new = await api("GET", f"leases/{new_lease_id}")
        assert new["state"] == "active" and new["devices"] == [gpu] and new["suspended"] is None
        assert simulator.process_memory(pid) == {}  # nothing of the old process came back
        assert driver_of(jp_serverapp).held() == {}
        assert [e["data"]["reason"] for e in events if e["type"] == "suspension_ended"] == [
            ENDED_RESTARTED
        ]


@pytest.fixture
def outside(
    jp_serverapp: Any, jp_kernel_dir: Any, api: Any, km: Any, kernels: Any, jp_asyncio_loop: Any
) -> Any:
    """A GPU kernel started as a kernel manager other than ``gpubroker-provisioner``
    would: it asks for a kernel token and a GPU itself, starts IPython with them in its
    environment (which a restart keeps), and names the kernel's process in a renewal.
    What ``use_gpu`` returns; shut down at the test's end."""
    return jp_asyncio_loop.run_until_complete(
        start_outside(jp_serverapp, jp_kernel_dir, api, km, kernels)
    )


async def start_outside(
    jp_serverapp: Any, jp_kernel_dir: Any, api: Any, km: Any, kernels: Any
) -> Any:
    kernel_id = str(uuid.uuid4())
    _, token = await api("POST", "tokens", {"kernel_id": kernel_id})
    _, request = await api("POST", "requests", {"gpus": 1, "holder": kernel_id})
    lease = request["lease"]
    _, spec = spec_for(None)
    del spec["metadata"]  # the default provisioner: the broker hears of no restart
    spec["env"] = {
        "GPUBROKER_URL": jp_serverapp.web_app.settings["gpubroker"].api_url,
        "GPUBROKER_TOKEN": token["token"],
        "GPUBROKER_KERNEL_ID": kernel_id,
        "GPUBROKER_LEASE_ID": lease["id"],
        "CUDA_VISIBLE_DEVICES": ",".join(lease["devices"]),
    }
    (jp_kernel_dir / "outside").mkdir()
    (jp_kernel_dir / "outside" / "kernel.json").write_text(json.dumps(spec))
    await kernels(kernel_name="outside", kernel_id=kernel_id)
    pid = km.get_kernel(kernel_id).provisioner.pid
    status, _ = await api("POST", f"leases/{lease['id']}/renew", {"holder_pid": pid})
    assert status == 200
    return await use_gpu(jp_serverapp, api, kernel_id)


async def test_a_suspended_kernel_restarted_without_the_provisioner_runs_as_a_new_kernel(
    jp_serverapp: Any, api: Any, km: Any, simulator: Any, outside: Any
) -> None:
    kernel_id, pid, lease_id, gpu = outside
    async with following(jp_serverapp, api, lease_id) as events:
        lease = await ended(api, lease_id)
        assert lease["suspended"]["kernel_id"] == kernel_id
        await km.restart_kernel(kernel_id)  # nobody tells the broker
        _, lease = await api("GET", f"leases/{lease_id}")
        assert lease["suspended"] is not None  # not known yet: told apart at its next cell

        # Its next cell asks to resume from a new process: no restore of the old one is
        # tried, the suspension ends saying why, and the cell runs on the GPU it got.
        out = await Cell(
            km.get_kernel(kernel_id),
            "import os\nprint(os.getpid(), 'numbers' in dir())",
        ).result()
        *said, printed = out.splitlines()
        new_pid, kept = printed.split()
        assert int(new_pid) != pid and kept == "False"
        assert said[-1] == (
            f"Not resumed: {ENDED_RESTARTED}. This cell runs on {gpu} as a new kernel's would."
        ), out
        assert "could not be resumed" not in out
        assert ("restore", pid) not in driver_of(jp_serverapp).calls
        _, lease = await api("GET", f"leases/{lease_id}")
        assert lease["suspended"] is None
        assert lease["reason"].endswith(f"on the host; {ENDED_RESTARTED}")
        (over,) = await until("the suspension's end", seen(events, "suspension_ended"))
        assert over["data"]["lease_id"] == lease_id
        assert over["data"]["reason"] == ENDED_RESTARTED
        (new,) = (await api("GET", "leases"))[1]["leases"]
        _, asked = await api("GET", f"requests/{new['request_id']}")
        assert asked["holder"] == kernel_id and new["devices"] == [gpu]

        async def named() -> bool:  # the new process renews its grant, as a new kernel's
            _, now = await api("GET", f"leases/{new['id']}")
            return now["holder_pid"] == int(new_pid)  # type: ignore[no-any-return]

        await until("the new process to renew its lease", named)
        assert simulator.process_memory(pid) == {} and driver_of(jp_serverapp).held() == {}
        assert (await overview(api))["suspended"] == []


def extension_of(jp_serverapp: Any) -> Any:
    """The server's GPUBrokerExtension."""
    (point,) = jp_serverapp.extension_manager.extensions[
        "jupyter_gpubroker"
    ].extension_points.values()
    return point.app


async def restart_broker(jp_serverapp: Any, monkeypatch: Any, while_down: Any) -> Any:
    """Stop the server's broker, run ``while_down``, and start a new one on the same state
    file and the same (simulated) machine, whose driver keeps what it checkpointed, as a
    machine's does; the server and its kernels run on. Returns the new broker."""
    extension = extension_of(jp_serverapp)
    simulator = jp_serverapp.web_app.settings["gpubroker"].backend.simulator
    await extension.stop_extension()
    await while_down()
    monkeypatch.setattr(
        inventory, "open_backend", lambda *a, log=None, **k: NvmlBackend(simulator, log=log).open()
    )
    extension.initialize_settings()
    jp_serverapp.web_app.settings.update(extension.settings)
    return jp_serverapp.web_app.settings["gpubroker"]


async def test_suspended_kernels_and_their_ends_outlive_a_broker_restart(
    jp_serverapp: Any, api: Any, monkeypatch: Any, km: Any, simulator: Any, suspendables: Any
) -> None:
    kernels = []
    for _ in range(4):  # one GPU: each kernel gets it once the one before is suspended
        kernels.append(await suspendables())
        await ended(api, kernels[-1][2])
    shut, _, shut_lease, _ = kernels[0]  # shut down while the broker runs
    kept, pid, kept_lease, gpu = kernels[1]  # suspended throughout
    gone, _, gone_lease, _ = kernels[2]  # shut down while the broker is down
    _, toggled_pid, toggled_lease, _ = kernels[3]  # resumed by hand meanwhile
    await km.shutdown_kernel(shut)

    async def while_down() -> None:
        await km.shutdown_kernel(gone)  # its process ends, and the broker is not told
        by_hand = SimulatedCheckpointDriver(simulator)  # as `cuda-checkpoint --toggle`
        by_hand.restore(toggled_pid, {gpu: gpu})
        by_hand.unlock(toggled_pid)

    runtime = await restart_broker(jp_serverapp, monkeypatch, while_down)
    assert runtime.backend.simulator is simulator

    assert [x["id"] for x in (await overview(api))["suspended"]] == [kept_lease]
    _, lease = await api("GET", f"leases/{kept_lease}")
    assert lease["suspended"]["kernel_id"] == kept
    assert lease["suspended"]["text"] == suspended_text(KERNEL_MIB)
    _, lease = await api("GET", f"leases/{shut_lease}")
    assert lease["suspended"] is None
    assert lease["reason"].endswith(f"on the host; {ENDED_SHUT_DOWN}")
    _, lease = await api("GET", f"leases/{gone_lease}")
    assert lease["suspended"] is None
    assert lease["reason"].endswith(f"on the host; {ENDED_AWAY}")
    _, lease = await api("GET", f"leases/{toggled_lease}")
    assert lease["suspended"] is None
    assert lease["reason"].endswith(
        f"on the host; the driver no longer holds its GPU memory: the kernel's process "
        f"{toggled_pid} is running"
    )
    simulator.remove_process(gpu, toggled_pid)  # its user stops using the GPU by hand

    out = await Cell(km.get_kernel(kept), "print(sum(numbers), os.getpid())").result()
    assert out.endswith(f"Resumed on {gpu}.\n6 {pid}"), out  # same process, same variables
    assert simulator.process_memory(pid) == {gpu: KERNEL_MIB}
    _, lease = await api("GET", f"leases/{kept_lease}")
    assert lease["suspended"] is None
    assert lease["reason"].endswith(f"resumed, its GPU memory back on the GPU ({gpu})")


async def test_a_restore_waiting_for_memory_outlives_a_broker_restart(
    jp_serverapp: Any, api: Any, monkeypatch: Any, km: Any, simulator: Any, suspendable: Any
) -> None:
    """A suspended kernel's cell got its GPU, but the GPU's memory is taken outside the
    broker, so the restore waits; the broker stops and starts again meanwhile. Once the
    memory is free the same cell runs, in the same process, with its variables."""
    kernel_id, pid, lease_id, gpu = suspendable
    await ended(api, lease_id)
    total = jp_serverapp.web_app.settings["gpubroker"].core.inventory.gpu(gpu).memory_mib
    simulator.set_load(gpu, memory_used_mib=total - 100)  # another user's CUDA, say
    cell = Cell(km.get_kernel(kernel_id), "print(sum(numbers), os.getpid())")

    async def waits() -> bool:
        _, lease = await api("GET", f"leases/{lease_id}")
        return bool((lease["suspended"] or {}).get("waiting"))

    await until("the restore to wait for memory", waits)

    async def while_down() -> None:
        pass

    await restart_broker(jp_serverapp, monkeypatch, while_down)
    await until("the restore to wait again after the restart", waits)
    assert not cell.task.done()
    simulator.set_load(gpu, memory_used_mib=0)
    out = await cell.result()
    assert out.endswith(f"Resumed on {gpu}.\n6 {pid}"), out  # same process, same variables
    assert simulator.process_memory(pid) == {gpu: KERNEL_MIB}
