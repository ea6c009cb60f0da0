"""A real ``jupyter lab`` with the broker on a simulated DGX H100 (8 GPUs x 7 slices) whose
slices other users hold all but one of, and the checkout's build of the JupyterLab
extension: what the UI tests drive."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from live_server import free_port

from jupyter_gpubroker import kernelspec
from jupyter_gpubroker.api import API_PREFIX
from jupyter_gpubroker.wire.sizes import Size

ROOT = Path(__file__).resolve().parents[2]
BUILT = ROOT / "jupyter_gpubroker" / "labextension"
CHROMIUM = os.environ.get("GPUBROKER_CHROMIUM", "/usr/bin/chromium")
TOKEN = "ui-test-token"
HOLDERS = ["alice", "bob", "carol", "dave"]
"""The other users, who hold 55 of the 56 slices."""
GPU_KERNEL = kernelspec.spec_for(Size(profile="1g.10gb"))[0]


def scene(job_class: str = "interactive") -> str:
    """A Lab's scene (a server extension's source): other users hold all but one of the
    56 slices, as ``job_class`` requests (of a class with no default time limit: none)."""
    return f'''
"""UI test scene: other users hold all but one of the 56 slices."""

from tornado.ioloop import IOLoop

from jupyter_gpubroker.wire.sizes import Size
from jupyter_gpubroker.server import registry

HOLDERS = {HOLDERS!r}


def fill():
    broker = registry.current()
    if broker is None:
        IOLoop.current().call_later(0.2, fill)
        return
    for i in range(55):
        broker.core.submit(
            HOLDERS[i % 4], Size(profile="1g.10gb"), holder="training", job_class={job_class!r}
        )


def _load_jupyter_server_extension(serverapp):
    IOLoop.current().call_later(0.2, fill)
'''


SCENE = scene()


def jupyter_dirs(tmp: Path, token: str) -> dict[str, str]:
    """The environment that keeps a Jupyter server's every directory under ``tmp``
    (its config in ``tmp/config``, kernelspecs under ``tmp/share/jupyter``)."""
    return {
        "JUPYTER_TOKEN": token,
        "JUPYTER_PATH": str(tmp / "share" / "jupyter"),
        "JUPYTER_CONFIG_DIR": str(tmp / "config"),
        "JUPYTER_DATA_DIR": str(tmp / "data"),
        "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(tmp / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"),
    }


def filled(overview: dict[str, Any]) -> bool:
    """The default scene is set: 55 slices held."""
    return len(overview["leases"]) >= 55


class Lab:
    """``jupyter lab`` in ``tmp`` on a fresh port, on ``simulate`` with ``scene`` (a server
    extension's source) set; ``api`` calls the broker as the owner. ``docs/screenshot.py
    --panel`` uses it too, with a scene of its own."""

    def __init__(
        self,
        tmp: Path,
        extension: Path,
        broker: dict[str, Any],
        *,
        scene: str = SCENE,
        ready: Callable[[dict[str, Any]], bool] = filled,
        simulate: str = "dgx-h100-mig",
        profile: str = "1g.10gb",
        lab_settings: dict[str, str] | None = None,
    ) -> None:
        self.tmp, self.port, self.ready = tmp, free_port(), ready
        for size in (None, Size(profile=profile)):
            kernelspec.install(size, prefix=str(tmp))
        # Served by the name it has in the wheel (share/jupyter/labextensions/<name>).
        extensions = tmp / "labextensions"
        extensions.mkdir()
        (extensions / "jupyter-gpubroker").symlink_to(extension)
        config = tmp / "config"
        config.mkdir()
        (config / "jupyter_server_config.json").write_text(
            json.dumps(
                {
                    "ServerApp": {"jpserver_extensions": {"gpubroker_ui_scene": True}},
                    "LabServerApp": {"extra_labextensions_path": [str(extensions)]},
                    "GPUBroker": {"lease_ttl": 3600, **broker},
                }
            )
        )
        settings = {"@jupyterlab/apputils-extension/notification": '{"fetchNews": "false"}'}
        for plugin, text in {**settings, **(lab_settings or {})}.items():
            path = tmp / "settings" / f"{plugin}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        (tmp / "gpubroker_ui_scene.py").write_text(textwrap.dedent(scene))
        self.notebooks = tmp / "notebooks"
        self.notebooks.mkdir()
        self.env = {
            **os.environ,
            **jupyter_dirs(tmp, TOKEN),
            "GPUBROKER_SIMULATE": simulate,
            "GPUBROKER_STATE_FILE": str(tmp / "state.sqlite"),
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(tmp), str(ROOT), os.environ.get("PYTHONPATH")])
            ),
        }
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={self.port}"]
        cmd += [f"--ServerApp.root_dir={self.notebooks}", "--ServerApp.ip=127.0.0.1"]
        cmd += ["--ServerApp.port_retries=0", "--allow-root", "--LabApp.expose_app_in_browser=True"]
        log = (self.tmp / "lab.log").open("ab")
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 90
        while True:
            try:
                if self.ready(self.api("GET", "overview")):
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"JupyterLab did not start; see {self.tmp / 'lab.log'}")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def call(self, method: str, path: str, body: Any = None) -> Any:
        request = urllib.request.Request(
            f"{self.url}/{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"token {TOKEN}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as reply:
            text = reply.read()
        return json.loads(text) if text else None

    def api(self, method: str, path: str, body: Any = None) -> Any:
        return self.call(method, f"{API_PREFIX}/{path}", body)

    def notebook(self, name: str, kernel: str = GPU_KERNEL) -> str:
        """A new empty notebook set to start ``kernel``."""
        content = {
            "cells": [],
            "metadata": {"kernelspec": {"name": kernel, "display_name": kernel}},
            "nbformat": 4,
            "nbformat_minor": 5,
        }
        self.call("PUT", f"api/contents/{name}", {"type": "notebook", "content": content})
        return name
