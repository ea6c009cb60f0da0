"""``BrokerClient.events``: the server-sent stream, and what closing it does."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from jupyter_gpubroker.client import BrokerAPIError, BrokerClient


async def test_closing_the_stream_ends_the_servers_subscription(jp_serverapp, api):
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    client = BrokerClient(
        runtime.api_url, kernel_token=runtime.issue_token(runtime.owner, "k-events")
    )
    async with contextlib.aclosing(client.events()) as events:
        hello = await anext(events)
        assert hello["type"] == "hello" and len(runtime._subscribers) == 1
    await api("POST", "requests", {"profile": "1g.10gb"})  # the server writes to it, and learns
    for _ in range(50):
        if not runtime._subscribers:
            break
        await asyncio.sleep(0.05)
    assert runtime._subscribers == []


async def test_a_refused_stream_raises_the_brokers_error(jp_serverapp):
    client = BrokerClient(jp_serverapp.web_app.settings["gpubroker"].api_url, kernel_token="nope")
    with pytest.raises(BrokerAPIError) as e:
        await anext(client.events())
    assert e.value.status == 403 and "unknown or revoked" in e.value.message
