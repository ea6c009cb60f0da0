"""`jupyter gpubroker demo`: the README's main command, started for real."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, token: str) -> object:
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


@pytest.mark.slow
def test_demo_serves_the_broker_on_a_simulated_machine(tmp_path: Path) -> None:
    port, token = free_port(), "demo-test-token"
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "JUPYTER_TOKEN": token,
        "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
        "JUPYTER_DATA_DIR": str(tmp_path / "data"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter_gpubroker.cli",
            "demo",
            "--port",
            str(port),
            "--no-browser",
            "--simulate",
            "h200-mig-balanced",
        ],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                devices = get(f"{base}/gpubroker/api/v1/devices", token)
                break
            except OSError:
                assert proc.poll() is None, "the demo exited early"
                assert time.monotonic() < deadline, "the demo did not come up"
                time.sleep(0.5)
        gpus = devices["gpus"]  # type: ignore[index]
        assert [g["name"] for g in gpus] == ["NVIDIA H200"] * 2
        profiles = sorted(d["profile"] for g in gpus for d in g["devices"])
        assert profiles == ["1g.18gb"] * 4 + ["2g.35gb"] * 2 + ["3g.71gb"] * 2
        specs = get(f"{base}/api/kernelspecs", token)["kernelspecs"]  # type: ignore[index]
        assert {"python3-gpu-1g.18gb", "python3-gpu-2g.35gb", "python3-gpu-3g.71gb"} <= set(specs)
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert "simulated 'h200-mig-balanced' machine" in out
    state_dir = out.split("state: ")[1].split("/state.sqlite")[0]
    assert not Path(state_dir).exists(), "the demo left its temporary files behind"
