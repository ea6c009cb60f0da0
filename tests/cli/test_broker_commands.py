"""The broker commands' mistakes, each one clear line (no server needed to make them)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator

import pytest

from jupyter_gpubroker.cli import main
from jupyter_gpubroker.cli.leases import _hold, _stop

NOWHERE = "http://127.0.0.1:9/gpubroker/api/v1"  # the discard port: nothing listens


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse's usage errors
        code = int(e.code or 0)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def test_an_unreachable_broker_says_what_to_check(capsys) -> None:
    code, err = run(capsys, "queue", "--url", NOWHERE, "--retry-for", "3")
    assert code == 1
    assert err == (
        f"the GPU broker at {NOWHERE} does not answer (Connection refused): trying again for "
        "up to 3 s (--retry-for)\n"
        f"error: could not reach the GPU broker at {NOWHERE} (Connection refused): check --url "
        "(or $GPUBROKER_URL) and that the Jupyter server is running\n"
    )


def test_a_wrong_url_typed_by_hand_says_it_retries_and_gives_up_soon(capsys, monkeypatch) -> None:
    """It tried a mistyped --url for two minutes, saying once "trying again": it looked
    hung. A URL given by hand is tried for ten seconds, and the command says so."""
    monkeypatch.delenv("GPUBROKER_RETRY_S", raising=False)
    started = time.monotonic()
    code, err = run(capsys, "queue", "--url", NOWHERE)
    assert code == 1 and time.monotonic() - started < 30
    assert err.startswith(
        f"the GPU broker at {NOWHERE} does not answer (Connection refused): trying again for "
        "up to 10 s (--retry-for)\n"
    )


@pytest.mark.parametrize(
    ("size", "message"),
    [
        ("-2", "error: a GPU count must be positive, not -2\n"),
        ("-5GB", "error: sizes cannot be negative: -5GB (give e.g. 1g.10gb, 2 or 20GB)\n"),
    ],
)
def test_a_negative_size_is_named_as_such(capsys, size: str, message: str) -> None:
    assert run(capsys, "request", "--url", NOWHERE, size) == (1, message)
    assert run(capsys, "request", "--url", NOWHERE, "--", size) == (1, message)


@pytest.mark.parametrize("timeout", ["-1", "0", "nan"])
def test_a_timeout_must_be_positive(capsys, timeout: str) -> None:
    code, err = run(capsys, "request", "--url", NOWHERE, "--timeout", timeout, "1g.10gb")
    assert code == 2
    assert f"argument --timeout: must be more than 0 seconds, not {timeout}" in err


@pytest.mark.parametrize(
    ("command", "words"),
    [
        ("queue", "in the order the broker will grant them"),
        ("renew", "A lease or request nobody renews expires"),
        ("release", "withdraw a request (r-...)"),
        ("extend", "Granted only where no waiting request was promised an earlier start"),
    ],
)
def test_every_command_describes_itself(capsys, command: str, words: str) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert words in " ".join(capsys.readouterr().out.split())


class Unreachable:
    """A broker that stopped answering: every renewal is refused a connection."""

    def __init__(self) -> None:
        self.renewals = 0

    async def renew(self, lease_id: str) -> None:
        self.renewals += 1
        raise ConnectionRefusedError(111, "Connection refused")

    async def follow(self) -> AsyncIterator[dict]:  # the stream retries as long as it is read
        await asyncio.Event().wait()
        yield {}


def test_run_retries_an_unreachable_broker_until_the_ttl_then_stops_the_command(capsys) -> None:
    broker = Unreachable()

    async def go() -> tuple[int, int | None]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import time; time.sleep(600)"
        )
        code = await _hold(broker, {"id": "l-1", "ttl_s": 0.9}, proc)  # type: ignore[arg-type]
        alive = proc.returncode
        await _stop(proc)
        return code, alive

    code, alive_at_loss = asyncio.run(go())
    assert code == 1 and alive_at_loss is None
    assert broker.renewals >= 2  # retried, not given up at the first failure
    assert capsys.readouterr().err == (
        "error: lost lease l-1 (Connection refused): stopping the command\n"
    )


@pytest.mark.parametrize(
    ("limit", "said"),
    [
        ("0", "the time must be more than zero, such as '2h', not '0'"),
        ("2 weeks", "the time must be a number of seconds or a duration like"),
        ("-1h", "the time must be a number of seconds or a duration like"),
        ("2y", "the time must be a number of seconds or a duration like"),
    ],
)
def test_a_bad_time_limit_is_one_line(capsys, limit: str, said: str) -> None:
    code, err = run(capsys, "request", "--url", NOWHERE, "--time", limit, "1g.10gb")
    assert code == 2
    assert f"argument --time: {said}" in err


@pytest.mark.parametrize(
    ("by", "said"),
    [
        ("0", "the extension must be more than zero, such as '2h', not '0'"),
        ("soon", "the extension must be a number of seconds or a duration like"),
        ("-1h", "the extension must be a number of seconds or a duration like"),
        ("400d", "the extension must be at most a year, not '400d'"),
    ],
)
def test_a_bad_extension_is_one_line(capsys, by: str, said: str) -> None:
    code, err = run(capsys, "extend", "--url", NOWHERE, "l-1", "--by", by)
    assert code == 2
    assert f"argument --by: {said}" in err


def test_an_extension_says_how_much(capsys) -> None:
    code, err = run(capsys, "extend", "--url", NOWHERE, "l-1")
    assert code == 2 and "the following arguments are required: --by" in err
