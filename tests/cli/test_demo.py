"""`jupyter gpubroker demo`: the README's main command, started for real."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from live_server import free_port

from jupyter_gpubroker.demo import TOUR

TOKEN = "demo-test-token"
DEMO_COMMAND = "jupyter gpubroker demo"  # the README's first command, after its install
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Demo:
    proc: subprocess.Popen[str]
    base: str
    out: str = ""

    def request(
        self, path: str, method: str = "GET", body: object = None
    ) -> urllib.request.Request:
        return urllib.request.Request(
            f"{self.base}/{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"token {TOKEN}"},
        )

    def call(self, path: str, method: str = "GET", body: object = None) -> Any:
        with urllib.request.urlopen(self.request(path, method, body), timeout=30) as response:
            return json.loads(response.read())

    def stop(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)
        self.out, _ = self.proc.communicate(timeout=60)

    @property
    def state_dir(self) -> Path:
        """The temporary directory the demo said it runs in."""
        return Path(self.out.split("state: ")[1].split("/state.sqlite")[0])


@contextmanager
def demo(tmp_path: Path, cwd: Path, *args: str, command: list[str] | None = None) -> Iterator[Demo]:
    """The demo started in ``cwd`` with a Jupyter setup of its own under ``tmp_path``,
    once it serves the broker's API; stopped with SIGINT unless the test stopped it.
    ``command`` runs it as a person types it: the port then comes from
    ``$JUPYTER_PORT`` and the browser it opens is ``true``."""
    port = free_port()
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "JUPYTER_TOKEN": TOKEN,
        "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
        "JUPYTER_DATA_DIR": str(tmp_path / "data"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "JUPYTER_PORT": str(port),
        "BROWSER": "true",
    }
    proc = subprocess.Popen(
        command
        or [sys.executable, "-m", "jupyter_gpubroker.cli", "demo", "--port", str(port)]
        + ["--no-browser", *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    running = Demo(proc, f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                running.call("gpubroker/api/v1/devices")
                break
            except OSError:
                assert proc.poll() is None, "the demo exited early"
                assert time.monotonic() < deadline, "the demo did not come up"
                time.sleep(0.5)
        yield running
    finally:
        if proc.poll() is None:
            running.stop(signal.SIGINT)


@pytest.mark.slow
def test_the_readmes_demo_command_as_written_serves_the_dgx_h100(tmp_path: Path) -> None:
    first = (ROOT / "README.md").read_text().split("```bash\n")[1].splitlines()[0]
    assert first.endswith(" && " + DEMO_COMMAND)
    with demo(tmp_path, tmp_path, command=shlex.split(DEMO_COMMAND)) as running:
        gpus = running.call("gpubroker/api/v1/devices")["gpus"]
        assert [g["name"] for g in gpus] == ["NVIDIA H100 80GB HBM3"] * 8
        assert {d["profile"] for g in gpus for d in g["devices"]} == {"1g.10gb"}
        running.stop(signal.SIGINT)
    assert running.proc.returncode == 0
    assert not running.state_dir.exists()


@pytest.mark.slow
def test_demo_serves_the_broker_on_a_simulated_machine(tmp_path: Path) -> None:
    with demo(tmp_path, tmp_path, "--simulate", "h200-mig-balanced") as running:
        gpus = running.call("gpubroker/api/v1/devices")["gpus"]
        assert [g["name"] for g in gpus] == ["NVIDIA H200"] * 2
        profiles = sorted(d["profile"] for g in gpus for d in g["devices"])
        assert profiles == ["1g.18gb"] * 4 + ["2g.35gb"] * 2 + ["3g.71gb"] * 2
        specs = running.call("api/kernelspecs")["kernelspecs"]
        assert {"python3-gpu-1g.18gb", "python3-gpu-2g.35gb", "python3-gpu-3g.71gb"} <= set(specs)
        running.stop(signal.SIGINT)  # Ctrl-C
    assert "simulated 'h200-mig-balanced' machine" in running.out
    assert not running.state_dir.exists(), "the demo left its temporary files behind"


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


@pytest.mark.slow
def test_sigterm_stops_the_demo_and_its_kernels_and_the_checkout_stays_as_it_was(
    tmp_path: Path,
) -> None:
    cwd = tmp_path / "where-the-demo-was-started"
    cwd.mkdir()
    tour = TOUR.read_bytes()
    with demo(tmp_path, cwd) as running:
        with pytest.raises(urllib.error.HTTPError) as redirect:
            urllib.request.build_opener(NoRedirect).open(running.request(""))
        assert redirect.value.headers["Location"].rstrip("?") == "/lab/tree/gpu-broker-tour.ipynb"
        opened = running.call("api/contents/gpu-broker-tour.ipynb")
        assert opened["content"]["metadata"]["kernelspec"]["name"] == "python3-gpu-on-demand"
        running.call("api/contents/gpu-broker-tour.ipynb", "PUT", opened)  # as autosave does
        running.call("api/contents", "POST", {"type": "notebook"})  # File > New > Notebook
        running.call("api/kernels", "POST", {"name": "python3"})
        running.call("api/kernels", "POST", {"name": "python3-gpu-1g.10gb"})
        children = psutil.Process(running.proc.pid).children(recursive=True)
        assert len(children) >= 3  # the server and the kernels
        running.stop(signal.SIGTERM)
    assert running.proc.returncode == 0
    assert "c.GPUProvisioner" not in running.out  # a clean stop gives no advice
    assert not [c.pid for c in children if c.is_running()], "SIGTERM left processes running"
    assert not running.state_dir.exists(), "the demo left its temporary files behind"
    assert list(cwd.iterdir()) == [], "the demo wrote where it was started"
    assert TOUR.read_bytes() == tour


def test_a_demo_whose_broker_cannot_run_says_why_and_prints_no_url(tmp_path: Path) -> None:
    """Its GPUs' lock directory unusable (a directory everyone may write, for a broker run
    as root; a plain file, for anyone else): no server, no URL, the reason, exit 1."""
    everyone = tmp_path / "everyone"
    everyone.mkdir()
    everyone.chmod(0o1777)
    not_a_directory = tmp_path / "not-a-directory"
    not_a_directory.write_text("")
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "JUPYTER_TOKEN": TOKEN,
        "GPUBROKER_LOCK_DIR": str(everyone),
        "GPUBROKER_USER_LOCK_DIR": str(not_a_directory),
    }
    done = subprocess.run(
        [sys.executable, "-m", "jupyter_gpubroker.cli", "demo", "--port", str(free_port())]
        + ["--no-browser"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    why = (
        f"error: {everyone} cannot hold the GPU locks of a broker running as root: other users "
        "may write in it;"
        if os.geteuid() == 0
        else f"error: {not_a_directory} is not a directory (a link, or a file); remove it"
    )
    assert done.stderr.startswith(why), done.stderr
    assert "http" not in done.stdout + done.stderr


@pytest.mark.slow
def test_the_suspend_demo_as_docs_suspend_shows_it(tmp_path: Path) -> None:
    """docs/suspend.md's command: idle kernels are suspended, and a GPU kernel is listed on
    its simulated GPU with 2 GiB, so that there is memory to suspend (tests/suspend runs
    the suspend and the resume themselves)."""
    command = "jupyter gpubroker demo --simulate dgx-h100 --suspend"
    assert f"`{command}`" in (ROOT / "docs" / "suspend.md").read_text()
    with demo(tmp_path, tmp_path, command=shlex.split(command)) as running:
        running.call("api/kernels", "POST", {"name": "python3-gpu-1gpu"})
        deadline = time.monotonic() + 60
        while not (leases := running.call("gpubroker/api/v1/leases")["leases"]):
            assert time.monotonic() < deadline, "the GPU kernel got no lease"
            time.sleep(0.5)
        (lease,) = leases
        assert lease["on_reclaim"] == "suspend"
        (gpu,) = lease["devices"]
        while True:
            gpus = running.call("gpubroker/api/v1/devices")["gpus"]
            used = {d["uuid"]: d.get("memory_used_mib") for g in gpus for d in g["devices"]}
            if used[gpu] == 2048:
                break
            assert time.monotonic() < deadline, f"the kernel is not listed on its GPU: {used}"
            time.sleep(0.5)
        running.stop(signal.SIGINT)
    assert running.proc.returncode == 0


def test_demo_help_lists_and_describes_the_simulated_machines(capsys) -> None:
    """It named only its default (dgx-h100-mig), with no word of the others."""
    from jupyter_gpubroker.cli import main

    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    shown = capsys.readouterr().out
    assert (
        "simulated machines (--simulate):\n  dgx-h100            8 H100-80GB GPUs with MIG off\n"
        in shown
    )
    assert "  dgx-h100-mig        8 H100-80GB GPUs, each cut into 7 1g.10gb slices\n" in shown
    assert "  workstation-a100    one A100-40GB, cut into 3g.20gb, 2g.10gb and 2 1g.5gb\n" in shown
    assert "  NAME:N              any of them with N GPUs, e.g. dgx-h100-mig:2\n" in shown
