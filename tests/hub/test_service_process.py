"""The service process on its own, as the hub starts and stops it (no hub needed): it
serves under its prefix, stops cleanly on SIGTERM, and refuses to start with a sentence;
under its supervisor, it stops with it and a service that cannot start does not spin."""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests
from live_hub import ROOT, wait_for
from live_server import free_port

from hub_spawner.hubconfig import SUPERVISOR
from hub_spawner.service import GPUBrokerService
from hub_spawner.supervisor import passed_socket
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.statelock import StateLock
from jupyter_gpubroker.wire.errors import StateFileError

PREFIX = "/services/gpubroker/"


def start(
    tmp_path: Path, *options: str, env: dict[str, str] | None = None, supervised: bool = False
) -> subprocess.Popen[str]:
    """The service as the hub starts it (``supervised``: under its supervisor)."""
    paths = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        "JUPYTERHUB_API_TOKEN": "unused",
        "JUPYTERHUB_API_URL": "http://127.0.0.1:1/hub/api",
        "JUPYTERHUB_CLIENT_ID": "service-gpubroker",
        "JUPYTERHUB_SERVICE_PREFIX": PREFIX,
        **(env or {}),
    }
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            SUPERVISOR if supervised else "hub_spawner.service",
            f"--GPUBroker.state_file={tmp_path / 'state.sqlite'}",
            "--GPUBroker.simulate=dgx-h100-mig:1",
            *options,
        ],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_sigterm_stops_the_service_and_frees_its_state_file(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    proc = start(tmp_path, env={"JUPYTERHUB_SERVICE_URL": url})
    try:
        me = f"{url}{PREFIX}api/v1/me"
        wait_for("the service", lambda: requests.get(me, timeout=5).status_code == 403)
        lock = StateLock(tmp_path / "state.sqlite")
        with pytest.raises(StateFileError):  # held by the running service
            lock.acquire()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert "Traceback" not in out
    lock.acquire()  # given back
    lock.release()


def test_sigterm_to_the_supervisor_stops_its_service_cleanly(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    proc = start(tmp_path, "--log-level=INFO", env={"JUPYTERHUB_SERVICE_URL": url}, supervised=True)
    try:
        me = f"{url}{PREFIX}api/v1/me"
        wait_for("the service", lambda: requests.get(me, timeout=5).status_code == 403)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert "GPU broker service: stopping" in out and "Traceback" not in out
    lock = StateLock(tmp_path / "state.sqlite")
    lock.acquire()  # given back
    lock.release()


def test_a_killed_supervisor_takes_its_service_along(tmp_path: Path) -> None:
    """Nothing is left holding the state file or the port when the hub starts the
    supervisor again at its next poll."""
    port = free_port()
    proc = start(
        tmp_path, env={"JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}"}, supervised=True
    )
    lock = StateLock(tmp_path / "state.sqlite")
    try:
        wait_for("the service", lambda: _status(f"http://127.0.0.1:{port}{PREFIX}", {}))
        with pytest.raises(StateFileError):  # held by the service
            lock.acquire()
        proc.kill()
        proc.communicate(timeout=60)
        wait_for("the state file", lambda: _acquired(lock), timeout_s=10)
        lock.release()
        with socket.create_server(("127.0.0.1", port)):  # and the port is free
            pass
    finally:
        proc.kill()


def test_a_service_that_cannot_start_is_tried_again_less_and_less_often(tmp_path: Path) -> None:
    """It exits at once (a config file that is not there): the supervisor starts it again
    after 1 s, then 2 s, says so, and stops at once when told to, even during a pause."""
    url = f"http://127.0.0.1:{free_port()}"
    proc = start(
        tmp_path, "--config=/nowhere.py", env={"JUPYTERHUB_SERVICE_URL": url}, supervised=True
    )
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        while not any("again in 2 s" in line for line in lines):
            lines.append(proc.stdout.readline())
        proc.send_signal(signal.SIGTERM)  # in the 2 s pause
        stopped = time.monotonic()
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert time.monotonic() - stopped < 1.5
    pauses = re.findall(
        r"The GPU broker service exited with status 1 \d+ s after its start; starting it "
        r"again in (\d+) s",
        "".join(lines),
    )
    assert pauses == ["1", "2"], lines
    assert "no config file /nowhere.py" in "".join(lines)
    assert proc.returncode == 0 and "Traceback" not in "".join(lines) + out


def test_a_socket_is_taken_only_when_passed_to_this_process_and_one_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """systemd's protocol: $LISTEN_PID names the process the sockets are for (never its
    children, so both variables go); a unit that passes two is told to pass one."""
    monkeypatch.setenv("LISTEN_FDS", "1")
    monkeypatch.setenv("LISTEN_PID", str(os.getppid()))  # another process's
    assert passed_socket() is None
    assert "LISTEN_FDS" not in os.environ and "LISTEN_PID" not in os.environ
    monkeypatch.setenv("LISTEN_FDS", "2")
    monkeypatch.setenv("LISTEN_PID", str(os.getpid()))
    with pytest.raises(ValueError) as refused:
        passed_socket()
    assert str(refused.value) == (
        "2 sockets were passed to the service ($LISTEN_FDS), which listens on one: give its "
        "socket unit one ListenStream="
    )


def test_a_service_the_hub_started_wrongly_says_why_in_one_line(tmp_path: Path) -> None:
    cases = [
        ((), {}, "$JUPYTERHUB_SERVICE_URL is not set"),
        (("--config=/nowhere.py",), {}, "no config file /nowhere.py"),
    ]
    for options, env, why in cases:
        environment = {"JUPYTERHUB_SERVICE_URL": "", **env}
        proc = start(tmp_path, *options, env=environment)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 1 and why in out and "Traceback" not in out, out


def test_a_broker_that_cannot_run_is_a_503_saying_why_until_its_config_is_fixed(
    tmp_path: Path,
) -> None:
    """A config error must not end the service (the hub would exit at its start): it
    answers, says why in its log, and runs the broker once its config file is fixed."""
    config = tmp_path / "gpubroker_config.py"
    config.write_text('c.GPUBroker.identity = "owner"\n')
    url = f"http://127.0.0.1:{free_port()}"
    proc = start(
        tmp_path,
        f"--config={config}",
        "--GPUBrokerService.retry_interval=1",
        env={"JUPYTERHUB_SERVICE_URL": url},
    )
    me = f"{url}{PREFIX}api/v1/me"
    kernel = {"X-GPUBroker-Token": "k-not-a-token"}
    try:
        wait_for("the service", lambda: _status(me, kernel) == 503)
        answer = requests.get(me, headers=kernel, timeout=5).json()
        assert answer["error"] == "broker_unavailable"
        assert requests.get(me, timeout=5).status_code == 403  # no credential: nothing said
        config.write_text('c.GPUBroker.identity = "username"\n')
        wait_for("the broker", lambda: _status(me, kernel) == 403)  # the token is checked
        out = stopped(proc)
    finally:
        proc.kill()
    assert (
        "the broker cannot run: c.GPUBroker.identity = 'owner' would make every hub user one "
        "user: remove it, the service always names callers by their hub user name; every call "
        "is answered with this, and the service tries again in 1 s"
    ) in out


def _acquired(lock: StateLock) -> bool:
    try:
        lock.acquire()
    except StateFileError:
        return False
    return True


def test_a_state_file_cut_short_is_a_503_whose_log_says_to_restore_it(tmp_path: Path) -> None:
    """The hub service's broker on a truncated state file: its log gives the advice a
    damaged file needs (a backup), not the one an unreadable file needs (permissions)."""
    state = tmp_path / "state.sqlite"
    Store(state).close()
    state.write_bytes(state.read_bytes()[:5000])
    url = f"http://127.0.0.1:{free_port()}"
    proc = start(tmp_path, env={"JUPYTERHUB_SERVICE_URL": url})
    me = f"{url}{PREFIX}api/v1/me"
    try:
        wait_for("the service", lambda: _status(me, {"X-GPUBroker-Token": "k-x"}) == 503)
        out = stopped(proc)
    finally:
        proc.kill()
    assert (
        f"the broker cannot run: {state}: the database in it is damaged (cut short or "
        "overwritten); restore it from a backup, or move it aside (the broker then starts "
        "with an empty state), or set c.GPUBroker.state_file (or $GPUBROKER_STATE) to another "
        "file; every call is answered with this"
    ) in out
    assert "permission" not in out and "access to it" not in out


def stopped(proc: subprocess.Popen[str]) -> str:
    """The service's log once SIGTERM ended it cleanly (status 0, no traceback)."""
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in out, out
    return out


def _status(url: str, headers: dict[str, str]) -> int | None:
    try:
        return requests.get(url, headers=headers, timeout=5).status_code
    except requests.ConnectionError:
        return None


class Calls(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.mark.parametrize("level, logged", [("WARN", ["403"]), ("DEBUG", ["200", "403"])])
def test_the_request_log_makes_records_only_of_what_its_level_shows(level, logged) -> None:
    """Each successful call is debug output: below that level no record is made of it (a
    share of every call's cost at the load benchmark's rates); a refusal is a warning."""
    service = GPUBrokerService(log_level=level)
    calls = Calls()
    service.log.addHandler(calls)
    for status in (200, 403):
        request = SimpleNamespace(method="GET", path="/x", request_time=lambda: 0.001)
        service._log_request(SimpleNamespace(get_status=lambda s=status: s, request=request))
    assert [line.split()[:3] for line in calls.lines] == [[s, "GET", "/x"] for s in logged]
