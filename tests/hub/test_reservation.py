"""A hub server's reservation (``hub_spawner/reservation.py``) against a real broker, a
jupyter-server's, with no hub: asking, taking a request up again, refusals, the queue's
timeout and giving back."""

from __future__ import annotations

from typing import Any

import pytest

from hub_spawner import reservation
from hub_spawner.reservation import NotReserved
from jupyter_gpubroker.client import BrokerClient

SLICE = {"profile": "1g.10gb"}


@pytest.fixture
def client(jp_serverapp: Any, http_server_client: Any) -> BrokerClient:
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    return BrokerClient(runtime.api_url, token=jp_serverapp.identity_provider.token, retry_for=0)


async def test_a_restarted_start_takes_up_its_own_request_instead_of_asking_twice(client):
    first, again = await reservation.ask(client, SLICE, "server:ann")
    assert not again and first["state"] == "granted"
    second, again = await reservation.ask(client, SLICE, "server:ann")
    assert again and second["id"] == first["id"]
    other, again = await reservation.ask(client, SLICE, "server:ann:gpu1")
    assert not again and other["id"] != first["id"]
    assert len(await client.leases()) == 2


async def test_a_granted_reservation_is_kept_and_given_back_once(client):
    request, _ = await reservation.ask(client, SLICE, "server:bob")
    held = reservation.held(request)
    assert held["request_id"] == request["id"] and held["devices"][0].startswith("MIG-")
    assert await reservation.give_back(client, held) == ""
    assert (await client.lease(held["lease_id"]))["state"] == "released"
    assert await reservation.give_back(client, held) == ""  # already gone: nothing to say


async def test_a_size_the_broker_refuses_says_why_and_what_may_be_asked(client):
    with pytest.raises(NotReserved) as e:
        await reservation.ask(client, {"profile": "7g.80gb"}, "server:cat")
    assert e.value.status == 400 and e.value.reason == "gpu_request"
    assert e.value.message.startswith("Cannot start a GPU server: ")
    assert "1g.10gb" in e.value.message and "Error" not in e.value.message


async def test_an_absent_broker_is_named_with_its_url() -> None:
    absent = BrokerClient("http://127.0.0.1:9/api/v1", token="t", retry_for=0)
    with pytest.raises(NotReserved) as e:
        await reservation.ask(absent, SLICE, "server:dan")
    assert e.value.status == 503 and e.value.reason == "gpubroker_unreachable"
    assert e.value.message.startswith("The GPU broker at http://127.0.0.1:9/api/v1 does not")


async def test_a_wait_past_its_timeout_withdraws_the_request(client):
    for i in range(7):  # every slice of the machine
        await reservation.ask(client, SLICE, f"server:full{i}")
    request, _ = await reservation.ask(client, SLICE, "server:eve")
    assert request["state"] == "queued"
    heard: list[int] = []
    with pytest.raises(NotReserved) as e:
        await reservation.granted(client, request, 1.0, lambda r, a, n: heard.append(n))
    assert e.value.reason == "gpu_wait_timeout" and e.value.status == 503
    assert "position 1 in the queue" in e.value.message
    assert (await client.request(request["id"]))["state"] == "cancelled"
    assert heard and heard[-1] >= 1
