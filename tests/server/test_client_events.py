"""``BrokerClient.events``: the server-sent stream, what closing it does, resuming it
after a reconnect, and following a wait without reading the request again."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from jupyter_gpubroker.api import API_PREFIX, TOKEN_HEADER
from jupyter_gpubroker.client import BrokerAPIError, BrokerClient
from jupyter_gpubroker.server import handlers

SLICE = {"profile": "1g.10gb"}
BUFFER = 8


@pytest.fixture
def broker_config(broker_config: dict[str, Any]) -> dict[str, Any]:
    # Leases outlive the test; a short ring of recent events, to fall behind it.
    return {**broker_config, "lease_ttl": 120.0, "event_buffer": BUFFER}


def kernel_client(runtime: Any, kernel_id: str) -> BrokerClient:
    return BrokerClient(runtime.api_url, kernel_token=runtime.issue_token(runtime.owner, kernel_id))


async def take(events: Any, n: int) -> list[dict[str, Any]]:
    return [await asyncio.wait_for(anext(events), 10) for _ in range(n)]


async def test_closing_the_stream_ends_the_servers_subscription(jp_serverapp, api):
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    client = kernel_client(runtime, "k-events")
    async with contextlib.aclosing(client.events()) as events:
        hello = await anext(events)
        assert hello["type"] == "hello" and runtime.events.subscribers == 1
    await api("POST", "requests", SLICE)  # the server writes to it, and learns
    for _ in range(50):
        if not runtime.events.subscribers:
            break
        await asyncio.sleep(0.05)
    assert runtime.events.subscribers == 0


async def test_streams_that_close_leave_nothing_subscribed(jp_serverapp, jp_http_port, jp_base_url):
    """Streams whose clients go away without a word, with no event after (issue 23's 200
    streams), end their subscriptions: none is kept, nor an idle kernel's bucket, round
    after round."""
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    user = f"Authorization: token {jp_serverapp.identity_provider.token}"
    for round_ in range(3):
        tokens = [runtime.issue_token(runtime.owner, f"k-{round_}-{i}") for i in range(5)]
        streams = []
        for auth in [user] * 5 + [f"{TOKEN_HEADER}: {t}" for t in tokens]:
            reader, writer = await asyncio.open_connection("127.0.0.1", jp_http_port)
            writer.write(
                f"GET {jp_base_url}{API_PREFIX}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"{auth}\r\n\r\n".encode()
            )
            await asyncio.wait_for(reader.readuntil(b"data:"), 10)  # its hello: subscribed
            streams.append(writer)
        assert runtime.events.subscribers == 10
        for writer in streams:
            writer.close()
        for _ in range(100):
            if not runtime.events.subscribers:
                break
            await asyncio.sleep(0.05)
        assert runtime.events.subscribers == 0
        assert runtime.events._by_kernel == {}  # no bucket of a gone kernel's stream kept


async def test_a_refused_stream_raises_the_brokers_error(jp_serverapp):
    client = BrokerClient(jp_serverapp.web_app.settings["gpubroker"].api_url, kernel_token="nope")
    with pytest.raises(BrokerAPIError) as e:
        await anext(client.events())
    assert e.value.status == 403 and "unknown or revoked" in e.value.message


async def test_a_reconnect_resumes_where_the_stream_broke(jp_serverapp):
    """What happened while the client was away arrives on reconnect in order, each request
    in its latest state (as a window sends it: queued then granted is one granted), then
    its positions; nothing is read again."""
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    client = kernel_client(runtime, "k-resume")
    async with contextlib.aclosing(client.events()) as events:
        (hello,) = await take(events, 1)
        held = await client.submit(**SLICE)
        granted = await anext(e async for e in events if e["type"] != "readings")
    assert granted["type"] == "granted" and granted["data"]["request"]["state"] == "granted"
    assert hello["id"] < granted["id"]

    await client.release(held["lease"]["id"])  # while away
    again = await client.submit(**SLICE)
    async with contextlib.aclosing(client.events(granted["id"])) as events:
        missed = await take(events, 3)
    assert [(e["type"], e["data"]["request_id"]) for e in missed[:2]] == [
        ("released", held["id"]),
        ("granted", again["id"]),
    ]
    assert [e["id"] for e in missed[:2]] == [granted["id"] + 1, granted["id"] + 3]
    assert missed[1]["data"]["request"]["lease"]["state"] == "active"
    assert missed[2]["type"] == "positions" and missed[2]["data"]["requests"] == []


async def test_a_client_too_far_behind_gets_a_snapshot_first(jp_serverapp, api):
    """Events it missed are no longer kept (or its id is from another run of the broker):
    it starts again from the whole picture, as GET overview shows it."""
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    client = kernel_client(runtime, "k-behind")
    async with contextlib.aclosing(client.events()) as events:
        (hello,) = await take(events, 1)
    mine = await client.submit(**SLICE)
    for _ in range(BUFFER):  # more events than the broker keeps
        await api("POST", "requests", SLICE)
    for last in (hello["id"], 1):
        async with contextlib.aclosing(client.events(last)) as events:
            (snapshot,) = await take(events, 1)
        assert snapshot["type"] == "snapshot"
        assert snapshot["data"] == await client.call("GET", "overview")
        assert [r["id"] for r in snapshot["data"]["requests"]] == [mine["id"]]


async def test_a_waiting_client_follows_its_positions_without_reading_its_request(
    jp_serverapp, api, monkeypatch
):
    """Every move in the queue reaches the waiting kernel as a positions event carrying
    its request; it reads its request when the stream starts and once granted, however
    often the queue moves."""
    reads: list[str] = []
    get = handlers.RequestHandler.get

    def counted(self: Any, request_id: str) -> Any:
        reads.append(request_id)
        return get(self, request_id)

    monkeypatch.setattr(handlers.RequestHandler, "get", counted)
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    held = [(await api("POST", "requests", SLICE))[1] for _ in range(7)]
    assert all(r["state"] == "granted" for r in held)
    ahead = [(await api("POST", "requests", SLICE))[1] for _ in range(3)]
    client = kernel_client(runtime, "k-wait")
    mine = await client.submit(**SLICE)
    assert mine["position"] == 4

    async with contextlib.aclosing(client.events()) as events:
        (hello,) = await take(events, 1)
        assert [r["position"] for r in hello["data"]["requests"]] == [4]
        waiting = asyncio.ensure_future(client.wait_for_grant(mine["id"], 30))
        for i, r in enumerate(ahead):
            await api("DELETE", f"requests/{r['id']}")
            while (e := await asyncio.wait_for(anext(events), 10))["type"] != "positions":
                pass
            (moved,) = e["data"]["requests"]
            assert (moved["id"], moved["position"]) == (mine["id"], 3 - i)
            assert e["data"]["queue_length"] == 3 - i
        await api("DELETE", f"leases/{held[0]['lease']['id']}")
        granted = await asyncio.wait_for(waiting, 10)
    assert granted["state"] == "granted" and granted["lease"]["devices"]
    assert len(reads) <= 3  # the renewal loop's first read, the stream's start, the grant


async def test_a_waiter_is_told_when_its_promised_start_cannot_be_kept(jp_serverapp, api):
    """Six slices held for 4 h and one for 1 h: a waiting request is promised a start from
    the short one's limit. An admin drains that slice: the waiter hears, in a sentence,
    that the promise cannot be kept and the start promised now (what the CLI's wait and
    the hub's spawner pass on)."""
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    short = (await api("POST", "requests", {**SLICE, "limit_s": 3600}))[1]
    for _ in range(6):
        assert (await api("POST", "requests", {**SLICE, "limit_s": 4 * 3600}))[1]["lease"]
    client = kernel_client(runtime, "k-promised")
    mine = await client.submit(**SLICE, limit_s=3600)
    assert mine["state"] == "queued" and mine["eta_bound"]
    heard: list[str] = []
    waiting = asyncio.ensure_future(client.wait_for_grant(mine["id"], 60, on_notice=heard.append))
    try:
        await asyncio.sleep(0.5)  # the stream is open
        (device,) = short["lease"]["devices"]
        status, _ = await api("POST", f"devices/{device}/drain", {"reason": "a fan"})
        assert status == 200
        for _ in range(100):
            if heard:
                break
            await asyncio.sleep(0.1)
        (said,) = heard
        assert said.startswith("The start promised by ")
        assert "cannot be kept: a GPU was taken out of service (drained by " in said
        assert said.endswith(" at the latest.")
        again = await client.request(mine["id"])
        assert again["eta_bound"] and again["eta_bound"] > mine["eta_bound"]
    finally:
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
