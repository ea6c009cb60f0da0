"""Streams coalesce: within a window the latest message about each thing wins, each
window is decided and encoded once for all streams of one audience, the order of ids is
kept, and a stream that resumes after a coalesced window still has what its front needs.
Counted and compared, never timed (``benchmarks/api_load.py`` measures the cost)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from jupyter_gpubroker import events
from jupyter_gpubroker.api.rules import BrokerAPI

SLICE = {"profile": "1g.10gb"}


def ids(messages: list[dict[str, Any]]) -> list[int]:
    return [m["id"] for m in messages]


def run_window(team: BrokerAPI, change: Any) -> Any:
    """Run ``change()`` on an event loop, then wait for the window to end."""

    async def go() -> Any:
        result = change()
        await asyncio.sleep(team.runtime.events.fanout.window_s + 0.1)
        return result

    return asyncio.run(go())


def test_the_latest_state_of_a_request_wins_its_window(team: BrokerAPI) -> None:
    alice = team.user_identity("alice")
    sent: list[dict[str, Any]] = []

    def change() -> dict[str, Any]:
        team.follow(alice, sent.append)
        r = team.submit(alice, {**SLICE, "holder": "nb"})  # queued, granted
        team.cancel(alice, r["id"])  # released
        return r

    r = run_window(team, change)
    about = [m for m in sent if m["data"].get("request_id") == r["id"]]
    (last,) = about  # queued and granted were overtaken within the window
    assert last["type"] == "released"
    assert last["data"]["request"]["state"] == "released"
    assert last["data"]["request"]["lease"]["state"] == "released"
    assert ids(sent) == sorted(ids(sent))  # the order of ids is kept


def test_a_window_is_encoded_once_for_all_streams_of_one_audience(
    team: BrokerAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice = team.user_identity("alice")
    chunks: list[list[bytes]] = [[] for _ in range(50)]
    encoded: Counter[str] = Counter()
    real = events.frame

    def counted(message: dict[str, Any]) -> str:
        encoded[message["type"]] += 1
        return real(message)

    monkeypatch.setattr(events, "frame", counted)

    def change() -> None:
        for out in chunks:
            team.follow(alice, write=out.append)
        for i in range(5):
            team.submit(alice, {**SLICE, "holder": f"nb{i}"})

    run_window(team, change)
    assert all(c == chunks[0] for c in chunks) and len(chunks[0]) == 1  # one write each
    # each of five requests once (granted): not 50 times each
    assert encoded == Counter(granted=5)
    assert chunks[0][0].count(b"\ndata: ") == 5


def test_resume_after_a_coalesced_window_loses_nothing_a_front_needs(team: BrokerAPI) -> None:
    """A front that kept the last id of a window and reconnects gets each thing it missed
    in its latest state, then its positions: the same picture as a stream that stayed."""
    alice = team.user_identity("alice")
    stayed: list[dict[str, Any]] = []
    first: list[dict[str, Any]] = []

    def change() -> dict[str, Any]:
        team.follow(alice, stayed.append)
        leave = team.follow(alice, first.append)[1]
        held = [team.submit(alice, {**SLICE, "holder": f"nb{i}"}) for i in range(7)]
        return {"held": held, "leave": leave}

    state = run_window(team, change)
    state["leave"]()  # the second front goes away after the window
    last = first[-1]["id"]

    def more() -> list[dict[str, Any]]:
        waiting = team.submit(alice, {**SLICE, "holder": "w"})
        team.cancel(alice, state["held"][0]["id"])  # the waiting one is granted
        team.cancel(alice, state["held"][1]["id"])
        return [waiting]

    (waiting,) = run_window(team, more)
    resumed = team.resume(alice, last)

    def picture(messages: list[dict[str, Any]]) -> dict[str, str]:
        seen: dict[str, str] = {}
        for m in messages:
            r = m["data"].get("request")
            if r is not None:
                seen[r["id"]] = r["state"]
        return seen

    after = [m for m in stayed if m["id"] > last]
    assert picture(resumed) == picture(after)
    assert picture(resumed)[waiting["id"]] == "granted"
    assert picture(resumed)[state["held"][0]["id"]] == "released"
    assert resumed[-1]["type"] == "positions"
    assert ids(resumed) == sorted(ids(resumed))


def test_a_users_notice_about_no_request_reaches_its_kernels_streams(team: BrokerAPI) -> None:
    """``outside_use`` with "warn": the notice is about the user, not a request; each of
    its kernels' streams (``%gpu``) gets it, another user's kernels do not."""
    from jupyter_gpubroker.broker.core import Event

    alice, bob = team.user_identity("alice"), team.user_identity("bob")

    def kernel(user: Any, kid: str) -> Any:
        who = team.token_identity(team.issue_token(user, {"kernel_id": kid})["token"])
        assert who is not None
        return who

    got: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    team.follow(kernel(alice, "ka"), got["a"].append)
    team.follow(kernel(bob, "kb"), got["b"].append)
    text = "GPU 0: in use outside the broker by alice, pid 4242"
    notice = Event("outside_use", team.now(), "alice", detail={"message": text})
    team.runtime.events.publish(notice)
    assert [m["data"]["message"] for m in got["a"]] == [text]
    assert got["b"] == []
