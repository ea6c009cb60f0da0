"""The one renewal loop (``keep_alive``) of the provisioner, ``%gpu`` and ``run``, on a
fake transport: what the broker answers each renewal decides when the loop stops."""

from __future__ import annotations

import asyncio
from typing import Any

from jupyter_gpubroker.client import BrokerAPIError, Lost, keep_alive

TTL = 0.06  # seconds: renewals every 20 ms, so a test takes a fraction of a second


class Broker:
    """Answers renewals from a script: a dict is a reply, an exception is raised; the
    last entry repeats."""

    def __init__(self, *script: Any) -> None:
        self.script, self.renewals = list(script), 0

    async def renew(self, held_id: str) -> dict[str, Any]:
        answer = self.script[min(self.renewals, len(self.script) - 1)]
        self.renewals += 1
        if isinstance(answer, BaseException):
            raise answer
        return dict(answer)


HELD = {"id": "l-1", "ttl_s": TTL}
OK = {"id": "l-1", "ttl_s": TTL, "state": "active"}


def run(broker: Broker, **kw: Any) -> Lost | None:
    return asyncio.run(keep_alive(broker.renew, HELD, **kw))


def test_a_lease_ended_at_the_broker_stops_the_loop_once() -> None:
    for status in (404, 409):
        broker = Broker(OK, OK, BrokerAPIError(status, "conflict", "lease l-1 is reclaimed"))
        assert run(broker) == Lost("gone", "lease l-1 is reclaimed")
        assert broker.renewals == 3  # renewed while it lived, then told once and stopped


def test_a_refusal_is_reported_and_never_retried() -> None:
    broker = Broker(BrokerAPIError(403, "forbidden", "lease l-1 belongs to another user"))
    assert run(broker) == Lost("refused", "lease l-1 belongs to another user")
    assert broker.renewals == 1


def test_network_errors_are_retried_and_a_renewal_that_gets_through_keeps_it() -> None:
    refused = ConnectionRefusedError(111, "Connection refused")
    unavailable = BrokerAPIError(503, "unavailable", "the broker is starting")
    gone = BrokerAPIError(404, "not_found", "no lease 'l-1'")
    broker = Broker(refused, unavailable, OK, refused, OK, gone)
    assert run(broker) == Lost("gone", "no lease 'l-1'")  # not lost to the errors between
    assert broker.renewals == 6


def test_a_broker_unreachable_for_a_whole_ttl_loses_the_lease() -> None:
    # A TTL of 1.5 s: three retries fit in it (every 0.5 s) even on a starved machine.
    long = {"id": "l-1", "ttl_s": 1.5}
    broker = Broker({**OK, "ttl_s": 1.5}, ConnectionRefusedError(111, "Connection refused"))
    assert asyncio.run(keep_alive(broker.renew, long)) == Lost("unreachable", "Connection refused")
    assert broker.renewals >= 3  # retried until the TTL ran out, not given up at once


def test_a_request_that_leaves_the_queue_needs_no_more_renewals() -> None:
    broker = Broker({**OK, "state": "queued"}, {**OK, "state": "granted"})
    assert run(broker, request=True) is None
    assert broker.renewals == 2


def test_a_holder_that_is_gone_stops_renewing() -> None:
    broker, beats = Broker(OK), []

    async def alive() -> bool:
        beats.append(1)
        return len(beats) < 3

    assert run(broker, alive=alive) is None
    assert broker.renewals == 2  # the lease is left to expire


def test_now_renews_at_once_so_a_restarted_holder_learns_its_lease_is_gone() -> None:
    # A lease with an hour's TTL: without ``now`` the first renewal would come in 20 min.
    broker = Broker(BrokerAPIError(404, "not_found", "no lease 'l-1'"))
    held = {"id": "l-1", "ttl_s": 3600.0}
    lost = asyncio.run(asyncio.wait_for(keep_alive(broker.renew, held, now=True), 30))
    assert lost == Lost("gone", "no lease 'l-1'") and broker.renewals == 1


def test_a_renewal_still_retrying_at_the_ttl_loses_the_lease_then() -> None:
    """A client's call waits out an absent broker by itself; the loop does not wait past
    the lease's TTL for it."""

    async def never_answers(held_id: str) -> dict[str, Any]:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    lost = asyncio.run(asyncio.wait_for(keep_alive(never_answers, HELD), 5))
    assert lost == Lost("unreachable", "the GPU broker did not answer for a whole lease")
