"""The extension's life at every point: stopped before it loaded, loaded twice, a start
that fails, a second server in the same environment. Each says one sentence, never a
traceback; the host without GPUs is tests/server/test_no_gpu_host.py."""

from __future__ import annotations

import logging
import os
import pwd
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import prometheus_client
import pytest

from jupyter_gpubroker.paths import LOCK_DIR_ENV
from jupyter_gpubroker.server import GPUBrokerExtension, registry

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from live_server import LiveServer  # noqa: E402


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A fake host's / (``host_root``) with the NVIDIA driver loaded."""
    (tmp_path / "host" / "proc" / "driver" / "nvidia").mkdir(parents=True)
    return tmp_path / "host"


@pytest.fixture
def jp_server_config(
    jp_server_config: dict[str, Any], host: Path, extension_log: list[logging.LogRecord]
) -> dict[str, Any]:
    return {**jp_server_config, "GPUBrokerExtension": {"host_root": str(host)}}


async def test_stopping_before_loading_is_quiet() -> None:
    """A server that fails before loading the extension (a bad ``preferred_dir``) still
    stops it: nothing to stop, and no other server's broker forgotten."""
    runtime = object()
    registry.set_current(runtime)  # type: ignore[arg-type]
    try:
        await GPUBrokerExtension().stop_extension()
        assert registry.current() is runtime
    finally:
        registry.set_current(None)


async def test_loading_twice_changes_nothing(
    jp_serverapp: Any, api: Any, extension_log: list[logging.LogRecord]
) -> None:
    runtime = registry.current()
    GPUBrokerExtension._load_jupyter_server_extension(jp_serverapp)
    assert registry.current() is runtime is not None  # GPU kernels still find it
    assert (await api("GET", "devices"))[0] == 200
    assert [(r.levelname, r.getMessage()) for r in extension_log][-1] == (
        "WARNING",
        "GPU broker: this server has loaded the extension already; loading it again changes "
        "nothing",
    )


@pytest.fixture
def metrics_taken() -> Iterator[None]:
    """Another broker of this process (a second server in it) serves the metrics already:
    Prometheus' registry is one per process."""
    taken = prometheus_client.Gauge("gpubroker_devices", "another broker's", registry=None)
    prometheus_client.REGISTRY.register(taken)
    yield
    prometheus_client.REGISTRY.unregister(taken)


class TestASecondBrokerInOneProcess:
    @pytest.fixture
    def jp_server_config(self, jp_server_config: Any, metrics_taken: None) -> Any:
        return jp_server_config  # the metrics are taken before the server starts

    async def test_it_starts_without_its_metrics(
        self, api: Any, extension_log: list[logging.LogRecord]
    ) -> None:
        assert (await api("GET", "devices"))[0] == 200
        assert [(r.levelname, r.getMessage()) for r in extension_log if r.levelname != "INFO"] == [
            (
                "WARNING",
                "GPU broker: another GPU broker in this process serves its metrics at /metrics; "
                "this one's are not counted there",
            )
        ]
        assert not any(r.exc_info for r in extension_log)


@pytest.mark.parametrize("broker_config", [{"lease_ttl": -1}], indirect=True)
async def test_a_bad_setting_is_one_sentence(
    api: Any, extension_log: list[logging.LogRecord]
) -> None:
    status, reply = await api("GET", "devices")
    assert (status, reply["message"]) == (
        503,
        "GPUBroker.lease_ttl must be seconds, at least 1 and at most a year, not -1",
    )
    assert [(r.levelname, r.getMessage()) for r in extension_log] == [
        ("ERROR", f"GPU broker not started: {reply['message']}")
    ]


@pytest.fixture
def broker_config(broker_config: dict[str, Any], request: Any, tmp_path: Path) -> dict[str, Any]:
    """``c.GPUBroker`` with the test's own values (a dict, or made from ``tmp_path``)."""
    own = getattr(request, "param", {})
    return {**broker_config, **(own(tmp_path) if callable(own) else own)}


@pytest.mark.usefixtures("no_driver")
@pytest.mark.parametrize("broker_config", [{"simulate": ""}], indirect=True)
async def test_a_driver_without_its_library_is_an_error_saying_what_to_check(
    api: Any, extension_log: list[logging.LogRecord]
) -> None:
    why = (
        "the NVIDIA driver is loaded but its management library (NVML) does not work "
        "(NVML Shared Library Not Found): check that libnvidia-ml.so.1 is on the library "
        "path (in a container, start it with the NVIDIA container runtime) and that its "
        "version matches the driver's (nvidia-smi)"
    )
    status, reply = await api("GET", "overview")
    assert (status, reply["message"]) == (503, why)
    assert [(r.levelname, r.getMessage()) for r in extension_log] == [
        ("ERROR", f"GPU broker not started: {why}")
    ]


def test_a_second_server_on_the_same_state_says_whose_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ``jupyter server`` processes of one environment (one user's, same state file):
    the second serves on, and its log says in one line why it has no broker."""
    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path / "gpu-locks"))  # not this test's server's
    state = tmp_path / "state.sqlite"
    first = LiveServer(tmp_path / "first", state)
    second = LiveServer(tmp_path / "second", state)
    for server in (first, second):
        server.home.mkdir()
    first.start()
    try:
        second.start(status=503)
        second.stop()
        lines = [line for line in second.log.read_text().splitlines() if "GPU" in line]
        assert not any("Traceback" in line for line in second.log.read_text().splitlines())
        (line,) = lines
        assert line.startswith("[E ")
        assert line.endswith(
            f"GPU broker not started: {state}: in use by another GPU broker (pid "
            f"{first.proc.pid} of user {pwd.getpwuid(os.geteuid()).pw_name} on "  # type: ignore[union-attr]
            f"{socket.gethostname()}, serving "
            f"http://localhost:{first.port}/gpubroker/api/v1); use that "
            "server, stop it, or give this one its own state file with c.GPUBroker.state_file "
            "or $GPUBROKER_STATE"
        )
    finally:
        first.stop()


def under_a_file(tmp_path: Path) -> dict[str, Any]:
    """A state file whose directory cannot be made: a file is in the way."""
    (tmp_path / "a-file").write_text("")
    return {"state_file": str(tmp_path / "a-file" / "state.sqlite")}


@pytest.mark.parametrize("broker_config", [under_a_file], indirect=True)
async def test_a_state_file_that_cannot_be_made_is_one_sentence(
    broker_config: dict[str, Any], api: Any, extension_log: list[logging.LogRecord]
) -> None:
    status, reply = await api("GET", "overview")
    assert status == 503
    assert reply["message"].startswith(f"{broker_config['state_file']}: cannot create its lock")
    assert [(r.levelname, r.getMessage()) for r in extension_log] == [
        ("ERROR", f"GPU broker not started: {reply['message']}")
    ]
