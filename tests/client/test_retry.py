"""Every client's calls ride out a broker that does not answer for a while (a hub service
restarting behind the hub's proxy), and only that: the broker's own answers are final,
and a submit tried again is queued once."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from jupyter_gpubroker.client import BrokerAPIError, BrokerClient, NoReply

PROXY_PAGE = (503, b"<html><body>503: Service Unavailable</body></html>")
REFUSED = ConnectionRefusedError(111, "Connection refused")


class Flaky(BrokerClient):
    """A client whose transport follows a script: an exception is raised, a (status,
    body) answered; the last entry repeats. Bodies it sends are kept."""

    def __init__(self, *script: Any, retry_for: float = 10.0) -> None:
        super().__init__("http://broker/api/v1", retry_for=retry_for, on_retry=self.retries.append)
        self.script, self.sent = list(script), []

    retries: list[str] = []

    async def fetch(self, method: str, path: str, body: bytes | None = None) -> httpx.Response:
        self.sent.append(json.loads(body) if body else None)
        answer = self.script[min(len(self.sent) - 1, len(self.script) - 1)]
        if isinstance(answer, BaseException):
            raise answer
        code, data = answer
        return httpx.Response(code, content=data)


@pytest.fixture(autouse=True)
def quick(monkeypatch) -> None:
    monkeypatch.setattr("jupyter_gpubroker.client.RETRY_S", 0.01)
    Flaky.retries = []


def test_the_proxys_503_and_refused_connections_are_waited_out() -> None:
    client = Flaky(PROXY_PAGE, REFUSED, (502, b"Bad Gateway"), (200, b'{"user": "ada"}'))
    assert asyncio.run(client.me()) == {"user": "ada"}
    assert len(client.sent) == 4
    assert client.retries == ["Service Unavailable"]


def test_the_brokers_own_503_is_an_answer() -> None:
    held = b'{"error": "broker_unavailable", "message": "another broker holds the state file"}'
    client = Flaky((503, held), (200, b"{}"))
    with pytest.raises(BrokerAPIError) as e:
        asyncio.run(client.me())
    assert (e.value.code, len(client.sent)) == ("broker_unavailable", 1)


def test_a_broker_down_for_good_is_given_up_after_retry_for() -> None:
    client = Flaky(REFUSED, retry_for=0.1)
    with pytest.raises(ConnectionRefusedError):
        asyncio.run(client.me())
    assert 3 <= len(client.sent) < 10


def test_a_call_that_gets_no_reply_is_tried_again_and_then_named_so() -> None:
    client = Flaky(NoReply("no answer in 30 s"), (200, b'{"user": "ada"}'))
    assert asyncio.run(client.me()) == {"user": "ada"} and len(client.sent) == 2
    silent = Flaky(NoReply("no answer in 30 s"), retry_for=0.05)
    with pytest.raises(NoReply) as e:
        asyncio.run(silent.me())
    assert e.value.code == "no_reply" and "no answer in 30 s" in e.value.message


def test_a_submit_tried_again_names_the_same_request() -> None:
    client = Flaky(PROXY_PAGE, (201, b'{"id": "r-1"}'))
    asyncio.run(client.submit(gpus=1))
    first, again = client.sent
    assert first == again and first["id"].startswith("r-")


def closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_refused_connection_is_the_systems_error() -> None:
    """Through the real transport: nothing listens, so the caller gets the system's words
    (what the CLI and the relay say), not a transport library's exception."""
    client = BrokerClient(f"http://127.0.0.1:{closed_port()}/api/v1", retry_for=0)
    with pytest.raises(ConnectionRefusedError) as e:
        asyncio.run(client.me())
    assert e.value.strerror == "Connection refused"


def test_a_broker_that_never_answers_is_no_reply_in_words() -> None:
    async def silent() -> str:
        held = []  # its connections kept open (a writer nobody holds closes its connection)
        server = await asyncio.start_server(lambda r, w: held.append(w), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = BrokerClient(f"http://127.0.0.1:{port}/api/v1", timeout=1, retry_for=0)
        try:
            with pytest.raises(NoReply) as e:
                await client.me()
            return e.value.message
        finally:
            server.close()

    assert asyncio.run(silent()) == "the GPU broker did not answer within 1 s"
