"""A server whose broker cannot start (its state file unusable, its GPUs managed by
another broker) serves on and says why, everywhere."""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import socket
import sqlite3
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_gpubroker.broker.store import SCHEMA_VERSION
from jupyter_gpubroker.nvml import open_backend, seed_for
from jupyter_gpubroker.runtime import GPUBroker
from jupyter_gpubroker.statelock import StateLock

OTHER_URL = "http://127.0.0.1:8899/gpubroker/api/v1"


def garbage(state: Path) -> None:
    state.write_bytes(b"this is not a database\n" * 200)


def truncated(state: Path) -> None:
    """A real state file cut short, as a full disk or a copy cut off leaves one."""
    broker = GPUBroker(simulate="dgx-h100-mig:1", state_file=str(state), simulate_seed="cut")
    broker.start()
    broker.stop()
    state.write_bytes(state.read_bytes()[:5000])
    for side in ("-wal", "-shm"):
        state.with_name(state.name + side).unlink(missing_ok=True)


RESTORE = "restore it from a backup, or move it aside (the broker then starts with an empty state)"
ME = pwd.getpwuid(os.geteuid()).pw_name


def too_new(state: Path) -> None:
    conn = sqlite3.connect(state)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()


def locked(state: Path) -> StateLock:
    lock = StateLock(state)
    lock.acquire("http://127.0.0.1:8888/gpubroker/api/v1")
    return lock


def other_broker(state: Path) -> GPUBroker:
    """Another embedded broker (another user's server, its own state file) on the same
    (simulated) machine: it holds the GPUs' machine-wide locks."""
    other = GPUBroker(
        simulate="dgx-h100-mig:1",
        state_file=str(state.with_name("other.sqlite")),
        simulate_seed=seed_for(str(state)),  # the server's own simulated machine
    )
    other.api_url = OTHER_URL
    other.start()
    return other


@pytest.fixture
def broker_config(broker_config: dict[str, Any], request: Any) -> Iterator[dict[str, Any]]:
    """The state file, spoiled by ``request.param`` before the server starts."""
    state = Path(broker_config["state_file"])
    state.parent.mkdir(parents=True, exist_ok=True)
    spoil: Callable[[Path], Any] = request.param
    held = spoil(state)
    yield broker_config
    if isinstance(held, StateLock):
        held.release()
    elif isinstance(held, GPUBroker):
        held.stop()


def expected(state: str, spoil: Callable[[Path], Any]) -> str:
    if spoil is garbage:
        return f"{state}: not a SQLite database; {RESTORE}"
    if spoil is truncated:
        return f"{state}: the database in it is damaged (cut short or overwritten); {RESTORE}"
    if spoil is other_broker:
        with open_backend("dgx-h100-mig:1", seed=seed_for(state)) as machine:
            gpu = machine.inventory().gpus[0].uuid
        return (
            f"GPU {gpu} is already managed by another GPU broker (pid {os.getpid()} "
            f"of user {ME} on {socket.gethostname()}, serving {OTHER_URL}): brokers that share "
            "a machine grant the same GPUs twice; run one broker for everyone as the JupyterHub "
            "service"
        )
    if spoil is too_new:
        return (
            f"{state}: schema version {SCHEMA_VERSION + 1} is newer than this "
            f"jupyter-gpubroker supports ({SCHEMA_VERSION}); upgrade the package"
        )
    return (
        f"{state}: in use by another GPU broker (pid {os.getpid()} of user {ME} "
        f"on {socket.gethostname()}, "
        "serving http://127.0.0.1:8888/gpubroker/api/v1); use that server, stop it, or give "
        "this one its own state file"
    )


CASES = pytest.mark.parametrize(
    "broker_config", [garbage, truncated, too_new, locked, other_broker], indirect=True
)


@CASES
async def test_every_api_route_answers_503_naming_the_file_and_the_cause(
    api: Any, broker_config: dict[str, Any], request: Any
) -> None:
    sentence = expected(broker_config["state_file"], request.node.callspec.params["broker_config"])
    for method, path in [
        ("GET", "devices"),
        ("POST", "requests"),
        ("DELETE", "leases/l-1"),
        ("GET", "no/such/route"),
    ]:
        status, reply = await api(method, path)
        assert status == 503, (method, path, reply)
        assert reply["error"] == "broker_unavailable"
        assert reply["message"].startswith(sentence)


@CASES
async def test_the_reason_needs_a_credential(jp_fetch: Any, broker_config: dict[str, Any]) -> None:
    from tornado.httpclient import HTTPClientError

    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("gpubroker", "api", "v1", "devices", headers={"Authorization": ""})
    assert info.value.code == 403
    assert broker_config["state_file"] not in (info.value.response.body or b"").decode()


@CASES
async def test_a_gpu_kernel_start_fails_with_the_same_sentence(
    jp_serverapp: Any, gpu_kernelspec: Any, broker_config: dict[str, Any], request: Any
) -> None:
    sentence = expected(broker_config["state_file"], request.node.callspec.params["broker_config"])
    with pytest.raises(RuntimeError) as info:
        await jp_serverapp.kernel_manager.start_kernel(kernel_name=gpu_kernelspec())
    assert str(info.value).startswith(sentence)


@CASES
async def test_cli_status_says_it(
    jp_serverapp: Any, broker_config: dict[str, Any], request: Any
) -> None:
    sentence = expected(broker_config["state_file"], request.node.callspec.params["broker_config"])
    jp_serverapp.write_server_info_file()  # found as `jupyter server list` finds it
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "jupyter_gpubroker.cli",
            "status",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
    finally:
        jp_serverapp.remove_server_info_file()
    assert proc.returncode == 1 and out == b""
    assert err.decode().startswith(f"error: {sentence}")
    assert err.decode().count("\n") == 1


@pytest.fixture
def jp_server_config(
    jp_server_config: dict[str, Any], extension_log: list[logging.LogRecord]
) -> dict[str, Any]:
    """The server's config, its extension's log kept from before the server starts."""
    return jp_server_config


@pytest.mark.parametrize("broker_config", [truncated], indirect=True)
async def test_the_servers_log_says_it_once(
    api: Any, broker_config: dict[str, Any], extension_log: list[logging.LogRecord]
) -> None:
    """A damaged file's log line gives the advice a damaged file needs, a backup, not its
    permissions (it is readable: SQLite cannot read it as a database)."""
    sentence = expected(broker_config["state_file"], truncated)
    assert (await api("GET", "devices"))[0] == 503
    logged = [(r.levelname, r.getMessage()) for r in extension_log if "GPU broker" in r.msg]
    assert len(logged) == 1 and logged[0][0] == "ERROR", logged
    assert logged[0][1].startswith(f"GPU broker not started: {sentence}")
    assert "access" not in sentence and "permission" not in sentence
