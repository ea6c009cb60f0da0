"""Time limits at the command line, against a real server: `extend` granted while nobody
waits and refused with the broker's reason when a promised start would move; `run`
printing the time limit's warning, with the command that extends it, then the extension,
and the reclaim at the limit."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from datetime import datetime
from typing import Any

import pytest

DOCS_EXTEND = "jupyter gpubroker extend --by 1h"
"""docs/cli.md's command."""
WARNING_S = 8.0
"""The time limit's warning: shorter than the limits `run` states here."""


@pytest.fixture
def broker_config(broker_config: dict[str, Any]) -> dict[str, Any]:
    """Warned ``WARNING_S`` before a limit ends, reclaimed a second after it, judged every
    quarter of a second."""
    return {
        **broker_config,
        "time_limit_warning": WARNING_S,
        "time_limit_grace": 1.0,
        "sample_interval": 0.25,
    }


def when(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


async def test_extend_is_granted_while_nobody_waits_and_refused_when_a_start_would_move(  # type: ignore[no-untyped-def]
    cli, api, held
):
    async with held(api, 1, limit_s=1800) as (short,):
        lease = short["lease"]
        code, out, err = await cli("extend", "--by", "30min", json_out=False)  # my only lease
        assert (code, err) == (0, "")
        _, now = await api("GET", f"leases/{lease['id']}")
        assert when(now["ends_at"]) == when(lease["ends_at"]) + 1800
        hhmm = datetime.fromtimestamp(when(now["ends_at"])).strftime("%H:%M")
        assert out == f"lease {lease['id']}: time limit extended: it now ends at {hhmm}\n"

        async with held(api, 6, limit_s=7200):  # the GPU is full
            _, waiting = await api("POST", "requests", {"profile": "1g.10gb", "limit_s": 600})
            assert waiting["state"] == "queued"
            for _ in range(100):  # the next scheduling pass promises it a start
                _, waiting = await api("GET", f"requests/{waiting['id']}")
                if waiting["eta_bound"]:
                    break
                await asyncio.sleep(0.1)
            assert waiting["eta_bound"], "no start was promised"

            code, _, err = await cli("extend", lease["id"], "--by", "1h", json_out=False)
            assert code == 1
            assert re.fullmatch(
                r"error: not extended: a waiting request needs this GPU when its time limit "
                r"ends, at \d\d:\d\d\n",
                err,
            )
            _, after = await api("GET", f"leases/{lease['id']}")
            assert after["ends_at"] == now["ends_at"] and after["extensions"] == 1

            code, _, err = await cli(*DOCS_EXTEND.split()[2:], json_out=False)  # which one?
            assert code == 1
            assert err.startswith(
                f"error: you hold seven leases; name the one to extend: {lease['id']} (MIG-"
            )
            assert f", until {hhmm}), l-" in err


async def test_extend_with_no_lease_says_so(cli):  # type: ignore[no-untyped-def]
    code, _, err = await cli("extend", "--by", "1h", json_out=False)
    assert (code, err) == (1, "error: you hold no lease to extend\n")


async def read_until(stream: asyncio.StreamReader, words: str, seen: list[str]) -> str:
    """The next line of ``stream`` that holds ``words`` (every line read kept in ``seen``)."""
    while True:
        line = (await asyncio.wait_for(stream.readline(), 60)).decode()
        assert line, f"no line with {words!r} in {seen}"
        seen.append(line)
        if words in line:
            return line


async def test_run_prints_the_warning_with_the_command_that_extends_then_the_extension(  # type: ignore[no-untyped-def]
    start_cli, cli, api
):
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    proc = await start_cli("run", "--time", "12s", "1g.10gb", "--", *sleep, json_out=False)
    assert proc.stderr is not None
    seen: list[str] = []
    warning = await read_until(proc.stderr, "warning:", seen)
    _, leases = await api("GET", "leases")
    (lease,) = leases["leases"]
    ends, deadline = (datetime.fromtimestamp(when(lease[k])) for k in ("ends_at", "reclaim_at"))
    url = warning.rsplit(" --url ", 1)[-1].strip()
    assert warning == (
        f"warning: lease {lease['id']}: its time limit of 12 s ends at {ends:%H:%M}; the GPU "
        f"is taken back at {deadline:%H:%M} unless it is extended: "
        f"jupyter gpubroker extend {lease['id']} --by 1h --url {url}\n"
    )
    # the command as printed (its user's token added, where the CLI finds it)
    command = warning.split(": jupyter gpubroker ", 1)[1].split()
    code, _, err = await asyncio.wait_for(cli(*command, json_out=False), 60)
    assert (code, err) == (0, "")

    extended = await read_until(proc.stderr, "extended", seen)
    _, now = await api("GET", f"leases/{lease['id']}")
    assert when(now["ends_at"]) == when(lease["ends_at"]) + 3600
    hhmm = datetime.fromtimestamp(when(now["ends_at"])).strftime("%H:%M")
    assert extended == f"lease {lease['id']}: time limit extended: it now ends at {hhmm}\n"
    assert proc.returncode is None  # the command runs on
    proc.send_signal(signal.SIGINT)  # Ctrl-C: it stops the command and gives the GPU back
    assert await asyncio.wait_for(proc.wait(), 60) == 130


async def test_run_says_the_lease_was_taken_back_at_its_limit_and_stops(start_cli, api):  # type: ignore[no-untyped-def]
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    proc = await start_cli("run", "--time", "12s", "1g.10gb", "--", *sleep, json_out=False)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1
    warning, taken, *rest = err.decode().splitlines()
    assert warning.startswith("warning: lease l-") and "unless it is extended" in warning
    lease_id = warning.split()[2].rstrip(":")
    assert taken == (
        f"error: the broker took lease {lease_id} back: its time limit of 12 s is up: "
        "stopping the command"
    )
    assert rest == []
    _, leases = await api("GET", "leases")
    assert leases["leases"] == []
