"""Idle reclaim end to end: a real jupyter-server, a real GPU kernel started through the
provisioner, its ``%gpu`` widget on display, seconds-long timeouts. The idle kernel is
warned, then reclaimed; the waiting request gets the slice; the kernel's event stream (what
its widget follows) and the widget's own model show the warning, then the reclaim."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from openapi_check import EventStream, validate

from jupyter_gpubroker.api import API_PREFIX, TOKEN_HEADER

EVENT = "#/components/schemas/Event"
pytestmark = pytest.mark.slow  # real kernels, seconds-long timeouts


@pytest.fixture
def broker_config(broker_config: dict[str, Any]) -> dict[str, Any]:
    return {
        **broker_config,
        "sample_interval": 0.25,
        "idle_timeout": 3.0,
        "grace": 3.0,
        "stalled_timeout": 0.0,
        "lease_ttl": 60.0,  # the other leases are not renewed: they must not expire meanwhile
    }


class WidgetSpy:
    """Every widget state the kernel publishes on IOPub, read by a client of our own that
    only listens: it sends the kernel nothing, so it is no activity."""

    def __init__(self, km: Any) -> None:
        self.client = km.client()
        self.client.start_channels(shell=False, iopub=True, stdin=False, hb=False, control=False)
        self.states: list[dict[str, Any]] = []
        self._task = asyncio.ensure_future(self._listen())

    async def _listen(self) -> None:
        while True:
            msg = await self.client.get_iopub_msg()
            content = msg["content"]
            if msg["msg_type"] == "comm_msg" and "state" in content.get("data", {}):
                self.states.append(content["data"]["state"])

    def texts(self) -> list[str]:
        return [s["value"] for s in self.states if isinstance(s.get("value"), str)]

    def close(self) -> None:
        self._task.cancel()
        self.client.stop_channels()


async def until(what: str, predicate: Any, timeout: float = 30.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout
    while not (found := predicate()):
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)
    return found


async def test_an_idle_kernel_is_warned_then_reclaimed_and_its_widget_shows_it(
    jp_serverapp: Any,
    gpu_kernelspec: Any,
    api: Any,
    run_in_kernel: Any,
    jp_http_port: int,
    jp_base_url: str,
) -> None:
    km = jp_serverapp.kernel_manager
    for _ in range(6):  # the rest of the GPU is busy with work that has no kernel here
        status, r = await api("POST", "requests", {"profile": "1g.10gb", "holder": "batch-job"})
        assert r["state"] == "granted"
    kernel_id = await km.start_kernel(kernel_name=gpu_kernelspec())
    spy = WidgetSpy(km.get_kernel(kernel_id))
    stream = None
    try:
        token = await run_in_kernel(
            km.get_kernel(kernel_id),
            "import os\nprint(os.environ['GPUBROKER_TOKEN'])\n"
            "%config GPUMagics.refresh_interval = 0.25\n%gpu status",
        )
        _, mine = await api("GET", "requests", headers={TOKEN_HEADER: token})
        (request,) = mine["requests"]
        assert request["state"] == "granted" and request["holder"] == kernel_id
        _, waiting = await api("POST", "requests", {"profile": "1g.10gb", "holder": "next"})
        assert waiting["state"] == "queued"

        # The stream the kernel's widget follows: its own kernel's events only.
        stream = await EventStream.open(
            jp_http_port, f"{jp_base_url}{API_PREFIX}/events", {TOKEN_HEADER: token}
        )
        seen: list[dict[str, Any]] = []
        while not any(e["type"] == "reclaimed" for e in seen):
            event = await stream.next(timeout=30)
            validate(event, EVENT, f"event {event['type']}")
            if event["data"].get("request_id") == request["id"]:
                seen.append(event)
        kinds = [e["type"] for e in seen]
        assert kinds[kinds.index("warning") :] == ["warning", "reclaimed"]
        warning, reclaimed = seen[-2]["data"], seen[-1]["data"]
        assert warning["lease_id"] == request["lease_id"] and warning["deadline"]
        assert warning["reason"].startswith("idle for")
        assert reclaimed["cause"] == "idle" and reclaimed["reason"].startswith("idle for")

        # The waiting request got the slice; the reclaim is on record with its evidence.
        _, next_request = await api("GET", f"requests/{waiting['id']}")
        assert next_request["state"] == "granted"
        _, reclaimed_lease = await api("GET", f"leases/{request['lease_id']}")
        assert next_request["lease"]["devices"] == reclaimed_lease["devices"]
        assert reclaimed_lease["state"] == "reclaimed"
        runtime = jp_serverapp.web_app.settings["gpubroker"]
        (record,) = runtime.core.store.reclaims()
        assert record["evidence"]["kernel_state"] == "idle" and record["kind"] == "idle"

        # The widget showed the warning, then the reclaim.
        texts = await until(
            "the widget to show the reclaim",
            lambda: (t := spy.texts()) and any(": reclaimed" in x for x in t) and t,
        )
        warned = next(i for i, x in enumerate(texts) if re.search(r"reclaimed at \S+ unless", x))
        ended = next(i for i, x in enumerate(texts) if ": reclaimed" in x)
        assert warned < ended
        # the model's state may arrive in a message of its own, after the text's
        await until(
            "the widget model to say reclaimed",
            lambda: any(s.get("state") == "reclaimed" for s in spy.states),
        )
        # And the kernel was shut down (after a short notice).
        await until("the kernel to be shut down", lambda: kernel_id not in km)
    finally:
        if stream is not None:
            stream.close()
        spy.close()
        if kernel_id in km:
            await km.shutdown_kernel(kernel_id)


async def test_revoke_interrupts_the_kernel_and_keeps_it(
    jp_serverapp: Any, gpu_kernelspec: Any, api: Any
) -> None:
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    runtime.reclaim_action = "revoke"
    km = jp_serverapp.kernel_manager
    kernel_id = await km.start_kernel(kernel_name=gpu_kernelspec())
    try:
        _, leases = await api("GET", "leases")
        (lease,) = leases["leases"]

        async def ended() -> dict[str, Any] | None:
            _, now = await api("GET", f"leases/{lease['id']}")
            return now if now["state"] != "active" else None

        deadline = asyncio.get_running_loop().time() + 30
        while (found := await ended()) is None:
            assert asyncio.get_running_loop().time() < deadline, "never reclaimed"
            await asyncio.sleep(0.2)
        assert found["state"] == "reclaimed" and found["reason"].startswith("idle for")
        await asyncio.sleep(0.5)
        assert kernel_id in km  # interrupted, not shut down
    finally:
        await km.shutdown_kernel(kernel_id)
