"""The kernel's event feed (``kernel/feed.py``) against a real broker: a token the broker
refuses ends the feed with one sentence instead of a retry every 30 s for ever; a valid
one says when its connection opens."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from jupyter_gpubroker.client import BrokerClient
from jupyter_gpubroker.kernel.feed import REVOKED, EventFeed, Runner


async def follow(jp_serverapp: Any, kernel_id: str, revoked: bool) -> tuple[EventFeed, list[Any]]:
    """A kernel's feed, subscribed to, once it heard something (or 5 s went by)."""
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    token = runtime.issue_token(runtime.owner, kernel_id)
    if revoked:
        runtime.revoke_tokens(kernel_id, runtime.owner)
    client = BrokerClient(runtime.api_url, kernel_token=token)
    feed = EventFeed(Runner(), client, logging.getLogger())
    heard: list[dict[str, Any]] = []

    async def listen(event: dict[str, Any]) -> None:
        heard.append(event)

    feed.subscribe(listen)
    for _ in range(100):
        if heard:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)  # a feed that would try again is still running by now
    return feed, heard


async def test_a_revoked_token_ends_the_feed_with_one_sentence(
    jp_serverapp: Any, http_server_client: Any, capsys: Any
) -> None:
    feed, heard = await follow(jp_serverapp, "k-revoked", revoked=True)
    assert not feed.active  # ended, not waiting 30 s to try again
    assert heard == [{"type": "ended", "data": {"message": REVOKED}}] and feed.ended == REVOKED
    assert capsys.readouterr().err == REVOKED + "\n"
    assert REVOKED.count(". ") == 0 and "403" not in REVOKED and "Error" not in REVOKED


async def test_a_valid_feed_keeps_running(jp_serverapp: Any, http_server_client: Any) -> None:
    feed, heard = await follow(jp_serverapp, "k-live", revoked=False)
    # the feed's own word that a connection opened (readings are read again then), then
    # the stream's first message
    assert [e["type"] for e in heard[:2]] == ["connected", "hello"]
    assert feed.active and feed.ended is None
