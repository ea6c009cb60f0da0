"""The ``%gpu`` status widget and a time limit: the lease's end shown while granted; its
warning shown plainly with an "Extend 1 hour" button, whose refusal (a waiting request
was promised the GPU) shows the broker's reason and whose extension moves the end shown."""

from __future__ import annotations

import asyncio
import re
from datetime import datetime
from typing import Any

import pytest

WARNED = (
    "import html, time\ndeadline = time.time() + 30\n"
    "while not r.widget.limit_warning and time.time() < deadline:\n    time.sleep(0.1)\n"
    "print(r.widget.limit_warning)\n"
    "print(r.widget.extend_button.description, r.widget.extend_button.layout.display)"
)
CLICK = (
    "r.widget.extend_button.click()\n"
    "print(html.unescape(r.widget._html.value))\n"
    "print(r.widget.ends_at, repr(r.widget.limit_warning), r.widget.extend_button.layout.display)"
)


@pytest.fixture
def broker_config(broker_config: dict[str, Any]) -> dict[str, Any]:
    """A limit of 90 s is warned 5 s after the grant, judged every quarter second."""
    return {**broker_config, "time_limit_warning": 85.0, "sample_interval": 0.25}


def hhmm(iso: str) -> str:
    return f"{datetime.fromisoformat(iso).astimezone():%H:%M}"


async def test_the_widget_warns_of_the_time_limit_and_extends_it(  # type: ignore[no-untyped-def]
    kernel, notebook, api, wait_until, request
):
    kid = await kernel()
    others = [  # the rest of the GPU, each for two hours
        (await api("POST", "requests", {"profile": "1g.10gb", "holder": "job", "limit_s": 7200}))[
            1
        ]["lease"]["id"]
        for _ in range(6)
    ]

    async def renew() -> None:
        while True:
            await asyncio.sleep(1)
            for lease in others:
                await api("POST", f"leases/{lease}/renew")

    request.addfinalizer(asyncio.ensure_future(renew()).cancel)
    nb = await notebook(kid, "r = %gpu request 1g.10gb --for 90s\nr", "print(r.widget.ends_at)")
    (lease,) = [x for x in (await api("GET", "leases"))[1]["leases"] if x["id"] not in others]
    assert nb.stdout(1) == lease["ends_at"]
    assert f"· until {hhmm(lease['ends_at'])}" in nb.text(0)

    _, waiting = await api("POST", "requests", {"profile": "1g.10gb", "limit_s": 600})

    async def promised() -> bool:
        return bool((await api("GET", f"requests/{waiting['id']}"))[1]["eta_bound"])

    await wait_until(promised)  # the waiting request needs this slice at its limit
    nb = await notebook(kid, WARNED, CLICK)
    warning, button = nb.stdout(0).splitlines()
    _, now = await api("GET", f"leases/{lease['id']}")
    assert warning == (
        f"⚠ Its time limit of 1 min ends at {hhmm(lease['ends_at'])}; the GPU is taken back "
        f"at {hhmm(now['reclaim_at'])} unless it is extended."
    )
    assert button == "Extend 1 hour None"  # shown
    *shown, state = nb.stdout(1).splitlines()
    assert re.search(
        r"not extended: a waiting request needs this "
        rf"GPU when its time limit ends, at {hhmm(lease['ends_at'])}",
        "\n".join(shown),
    )
    assert state.startswith(lease["ends_at"])  # refused: the end stays
    assert now["extensions"] == 0

    await api("DELETE", f"requests/{waiting['id']}")  # nobody waits any more
    nb = await notebook(kid, CLICK)
    _, now = await api("GET", f"leases/{lease['id']}")
    assert (now["extended_s"], now["extensions"]) == (3600, 1)
    *shown, state = nb.stdout(0).splitlines()
    assert state == f"{now['ends_at']} '' none"  # the new end; the warning gone, and Extend
    assert "not extended" not in "\n".join(shown)
    assert f"· until {hhmm(now['ends_at'])}" in "\n".join(shown)
