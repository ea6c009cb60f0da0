"""What a change costs the broker while event streams follow it: work counted, never timed
(the rates are ``benchmarks/api_load.py``'s). A thousand idle kernels' streams must not
each be asked about every other kernel's events, and a request granted at once must not
rank the queue for an answer that shows no position."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from jupyter_gpubroker.api.identity import Identity
from jupyter_gpubroker.api.rules import BrokerAPI
from jupyter_gpubroker.broker.store import Store

SLICE = {"profile": "1g.10gb"}


def count_calls(monkeypatch: pytest.MonkeyPatch, obj: Any, name: str, calls: Counter[str]) -> None:
    """Count the calls of ``obj.name`` in ``calls[name]``, still calling it."""
    real = getattr(obj, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(obj, name, counted)


def kernel(api: BrokerAPI, user: Identity, kernel_id: str) -> Identity:
    who = api.token_identity(api.issue_token(user, {"kernel_id": kernel_id})["token"])
    assert who is not None
    return who


def test_an_event_asks_only_the_streams_that_may_see_it(team: BrokerAPI, monkeypatch) -> None:
    alice = team.user_identity("alice")
    kernels = [kernel(team, alice, f"k{i}") for i in range(300)]
    got: dict[str, list[str]] = {}
    for who in [alice, *kernels]:
        name = who.kernel_id or who.user
        team.follow(who, lambda m, name=name: got.setdefault(name, []).append(m["type"]))
    calls: Counter[str] = Counter()
    count_calls(monkeypatch, team, "event", calls)
    count_calls(monkeypatch, team, "moved", calls)

    team.submit(alice, {**SLICE, "holder": "notebook"})  # queued, granted: nobody's kernel
    assert calls["event"] == 2  # alice's own stream only, not 301 streams twice
    for i in range(6):  # k0..k5 take the other six slices
        team.submit(kernels[i], SLICE)
    waiting = team.submit(kernels[7], SLICE)
    assert waiting["position"] == 1
    # each event of k0..k5 asks alice's stream and its kernel's; k7's queued too
    assert calls["event"] == 2 + 6 * 2 * 2 + 2
    assert calls["moved"] == 2
    assert got["k7"] == ["queued", "positions"]
    assert got["k0"] == ["queued", "granted"]
    assert "k8" not in got
    # alice's fronts: 15 events and the positions (with no event loop each message is
    # its own window)
    assert Counter(got["alice"]) == Counter(queued=8, granted=7, positions=1)


def test_an_ended_requests_event_reads_nothing_back_from_the_state_file(
    team: BrokerAPI, monkeypatch
) -> None:
    alice = team.user_identity("alice")
    team.runtime.events.subscribe(lambda published: None)
    held = team.submit(alice, {**SLICE, "holder": "nb"})
    calls: Counter[str] = Counter()
    count_calls(monkeypatch, Store, "request", calls)
    count_calls(monkeypatch, Store, "lease", calls)
    done = team.cancel(alice, held["id"])
    assert done["state"] == "released" and done["lease"]["state"] == "released"
    assert calls == Counter()


def test_a_request_granted_at_once_ranks_no_queue(team: BrokerAPI, monkeypatch) -> None:
    alice = team.user_identity("alice")
    calls: Counter[str] = Counter()
    count_calls(monkeypatch, team.core, "queue", calls)
    held = team.submit(alice, {**SLICE, "holder": "nb"})
    team.renew(alice, held["lease"]["id"])
    team.cancel(alice, held["id"])
    assert held["position"] is None and calls["queue"] == 0


def test_a_stream_opened_after_unwatched_changes_follows_the_queue_as_it_is(
    team: BrokerAPI,
) -> None:
    """With no stream open the positions are left for whoever asks; one that opens later
    starts from the queue as it is and gets the next move pushed."""
    alice, bob = team.user_identity("alice"), team.user_identity("bob")

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        held = [team.submit(alice, {**SLICE, "holder": f"nb{i}"}) for i in range(7)]
        first, second = (team.submit(bob, {**SLICE, "holder": f"b{i}"}) for i in range(2))
        dan = team.submit(team.user_identity("dan"), SLICE)
        team.cancel(team.user_identity("dan"), dan["id"])  # the queue moved; nobody ranked it
        await asyncio.sleep(0)  # the burst's pass: nobody follows
        pushed: list[dict[str, Any]] = []
        start, _ = team.follow(bob, pushed.append)
        team.cancel(alice, held[0]["id"])  # bob's first is granted, his second moves up
        await asyncio.sleep(team.runtime.events.fanout.window_s + 0.1)  # the window's end
        assert (first["position"], second["position"]) == (1, 2)
        return start, pushed

    (hello,), pushed = asyncio.run(scenario())
    moves = [m for m in pushed if m["type"] == "positions"]
    assert [r["position"] for r in hello["data"]["requests"]] == [1, 2]
    (move,) = moves
    assert [r["position"] for r in move["data"]["requests"]] == [1]
    assert move["data"]["queue_length"] == 1
