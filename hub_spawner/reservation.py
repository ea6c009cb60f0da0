"""A hub server's GPU reservation at the broker, apart from the spawner that holds it:
ask (or take up the request a restarted hub left), wait for the grant, read the lease,
give it back. Only a ``BrokerClient`` and words, no JupyterHub: tested against a real
broker without a hub (tests/hub/test_reservation.py). The spawner turns ``NotReserved``
into the start's error and keeps the lease renewed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from jupyter_gpubroker.client import BrokerAPIError, BrokerClient, GrantTimeout
from jupyter_gpubroker.wire.text import duration

from .options import Choices

GIVE_BACK_RETRY_S = 5.0
"""How long a stopping server tries to give its GPU back: a hub that stops takes its
broker service down first, and the restarted service releases the lease itself
(``service.release_stopped_servers``)."""


class NotReserved(Exception):
    """A start that gets no GPU: the sentence its user reads, the reason label the hub's
    metrics count, and the HTTP status of the failed start."""

    def __init__(self, message: str, reason: str, status: int = 500) -> None:
        super().__init__(message)
        self.message, self.reason, self.status = message, reason, status


async def choices(client: BrokerClient) -> Choices:
    """What the user may ask for, from the broker's overview and their quotas."""
    overview, quotas = await asyncio.gather(client.overview(), client.quotas())
    return Choices(overview, quotas)


async def why_waiting(client: BrokerClient, request: dict[str, Any]) -> str:
    """Why a start waits, in words (``Choices.blocked``); "" where the broker cannot say."""
    try:
        return (await choices(client)).blocked(request)
    except (BrokerAPIError, OSError):
        return ""


async def refusal(client: BrokerClient, why: str) -> NotReserved:
    """A refused request in one sentence: why, and what the user may ask for."""
    try:
        what = (await choices(client)).text()
    except (BrokerAPIError, OSError):
        what = ""
    message = f"Cannot start a GPU server: {why.rstrip('.')}" + (f"; {what}." if what else ".")
    return NotReserved(message, "gpu_request", 400)


def unreachable(url: str, why: str) -> NotReserved:
    return NotReserved(
        f"The GPU broker at {url.rstrip('/')} does not answer ({why}): check that its "
        "service runs (the hub's log says why it stopped), or start a server without a GPU.",
        "gpubroker_unreachable",
        503,
    )


async def live_request(client: BrokerClient, holder: str) -> dict[str, Any] | None:
    """``holder``'s request still live at the broker (a start the hub's restart
    interrupted), so that no start asks twice."""
    live = [r for r in await client.requests() if r["holder"] == holder]
    return await client.request(live[0]["id"]) if live else None


async def ask(
    client: BrokerClient, body: dict[str, Any], holder: str
) -> tuple[dict[str, Any], bool]:
    """The server's request: the live one ``holder`` already has (True: taken up again),
    else a new one of ``body``'s size. A refusal or an absent broker is ``NotReserved``."""
    try:
        request = await live_request(client, holder)
        if request is not None:
            return request, True
        return await client.submit(**body, holder=holder), False
    except BrokerAPIError as e:
        if e.status >= 500:
            raise unreachable(client.url, e.message) from None
        raise await refusal(client, e.message) from None
    except OSError as e:
        raise unreachable(client.url, e.strerror or str(e)) from None


async def granted(
    client: BrokerClient,
    request: dict[str, Any],
    timeout: float,
    on_wait: Callable[[dict[str, Any], dict[str, int], int], None],
    on_notice: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """``request`` once granted, waiting in the queue for up to ``timeout`` seconds
    (``on_wait`` hears each move, ``on_notice`` what the broker says to the waiter); a
    wait cancelled (the hub going down) leaves it queued, for the restarted hub to take
    up. Giving up or an ended request is ``NotReserved``."""
    if request["state"] != "queued":
        return request
    try:
        return await client.wait_for_grant(
            request["id"], timeout, on_wait=on_wait, keep_on_cancel=True, on_notice=on_notice
        )
    except GrantTimeout as e:
        raise NotReserved(
            f"No GPU for this server within {duration(e.waited)} "
            f"(position {e.request.get('position') or '?'} in the queue); the request "
            "was withdrawn: try again later or ask for something smaller.",
            "gpu_wait_timeout",
            503,
        ) from None
    except BrokerAPIError as e:
        raise NotReserved(f"The server's GPU request ended: {e.message}.", "gpu_request") from None


def held(request: dict[str, Any]) -> dict[str, Any]:
    """The reservation a server keeps in the hub's state: its ``request_id``, and once
    granted its ``lease_id``, ``devices`` and ``ttl_s`` (a share: the environment its
    kernels need, ``share_env``, and what holds it, ``share_text``)."""
    kept: dict[str, Any] = {"request_id": request["id"]}
    lease = request.get("lease")
    if lease:
        kept.update(lease_id=lease["id"], devices=lease["devices"], ttl_s=lease["ttl_s"])
        if lease.get("share"):
            kept.update(share_env=lease["share"]["env"], share_text=lease["share"]["text"])
    return kept


async def give_back(client: BrokerClient, kept: dict[str, Any]) -> str:
    """Release the lease (or withdraw the request still queued); what went wrong, in
    words, or "" (one already gone is given back)."""
    try:
        if kept.get("lease_id"):
            await client.release(kept["lease_id"])
        else:
            await client.cancel(kept["request_id"])
    except BrokerAPIError as e:
        return "" if e.status in (404, 409) else e.message
    except OSError as e:  # unrenewed, it expires
        return f"{e.strerror or e}: it returns to the queue once its lease expires"
    return ""
