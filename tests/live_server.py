"""A real ``jupyter server`` process with the extension on a simulated machine, for tests
that drive it from outside over HTTP and kill it (schemathesis, the REST crash test)."""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from jupyter_gpubroker.api import API_PREFIX
from jupyter_gpubroker.paths import LOCK_DIR_ENV, USER_LOCK_DIR_ENV

TOKEN = "live-server-token"
UNSHARED = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child")
"""A ``wrap`` that runs the server in a pid namespace of its own, as in a container of its
own (root only); killing ``unshare`` kills the server."""
EXTENSIONS = {  # only ours: the others slow every start down
    "jupyter_gpubroker": True,
    "jupyterlab": False,
    "jupyter_lsp": False,
    "jupyter_server_terminals": False,
    "notebook_shim": False,
}


def free_port() -> int:
    """A port nothing is bound to now, below the kernel's ephemeral ports where it can: each
    outgoing connection of the suite takes its local port from those, so one could take a
    port a hub chose a moment before (a proxy failed to listen that way, under load)."""
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")  # Linux's
    first = int(ephemeral.read_text().split()[0]) if ephemeral.exists() else 0
    while first > 20000:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", random.randrange(20000, first)))
            except OSError:
                continue
            return int(s.getsockname()[1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiveServer:
    """``jupyter server`` on ``state_file`` (one H100 in seven 1g.10gb slices unless
    ``GPUBroker`` options say otherwise), its Jupyter dirs under ``home``; ``args``: more
    of its command line (a server in remote mode: ``--GPUBrokerExtension.broker_url=``);
    ``wrap``: what runs it (``UNSHARED``: in a pid namespace of its own)."""

    def __init__(
        self,
        home: Path,
        state_file: Path,
        extensions: dict[str, bool] | None = None,
        args: tuple[str, ...] = (),
        wrap: tuple[str, ...] = (),
        **broker: Any,
    ) -> None:
        self.home, self.state_file, self.args, self.wrap = home, state_file, args, wrap
        self.extensions = {**EXTENSIONS, **(extensions or {})}
        self.broker = {"simulate": "dgx-h100-mig:1", **broker}
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = home / "server.log"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}/{API_PREFIX}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {TOKEN}"}

    def start(self, timeout_s: float = 60.0, status: int = 200) -> None:
        """Start it on a fresh port and wait until the API answers (with ``status``: 503
        where its broker is not to start)."""
        self.port = free_port()
        options = [f"--GPUBroker.{k}={v}" for k, v in self.broker.items()]
        env = {
            **os.environ,
            "HOME": str(self.home),
            "JUPYTER_CONFIG_DIR": str(self.home / "config"),
            "JUPYTER_DATA_DIR": str(self.home / "data"),
            "JUPYTER_RUNTIME_DIR": str(self.home / "runtime"),
            # its simulated GPUs are its own (a benchmark's too), unless a test says whose
            LOCK_DIR_ENV: os.environ.get(LOCK_DIR_ENV) or str(self.home / "gpu-locks"),
            USER_LOCK_DIR_ENV: os.environ.get(USER_LOCK_DIR_ENV) or str(self.home / "user-locks"),
        }
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    *self.wrap,
                    sys.executable,
                    "-m",
                    "jupyter_server",
                    f"--ServerApp.port={self.port}",
                    "--ServerApp.port_retries=0",
                    f"--IdentityProvider.token={TOKEN}",
                    "--ServerApp.open_browser=False",
                    "--allow-root",
                    f"--ServerApp.jpserver_extensions={self.extensions}",
                    f"--GPUBroker.state_file={self.state_file}",
                    *options,
                    *self.args,
                ],
                env=env,
                cwd=self.home,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self.call("GET", "me")[0] == status:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"the server did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        conn: http.client.HTTPConnection | None = None,
    ) -> tuple[int, Any]:
        """(status, JSON reply) of one API call, on ``conn`` if given (kept alive)."""
        own = conn is None
        conn = conn or self.connection()
        try:
            conn.request(
                method,
                f"/{API_PREFIX}/{path}",
                body=None if body is None else json.dumps(body),
                headers=self.headers,
            )
            response = conn.getresponse()
            data = response.read()
            return response.status, json.loads(data) if data else None
        finally:
            if own:
                conn.close()

    @property
    def server_pid(self) -> int:
        """The server's process, in this test's pid namespace (under ``wrap``, the child
        of what runs it: ``unshare`` ignores SIGTERM)."""
        assert self.proc is not None
        if not self.wrap:
            return self.proc.pid
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        return int(children.split()[0]) if children.split() else self.proc.pid

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        """A clean shutdown: SIGTERM, as a service manager stops a server. (Ctrl-C without a
        terminal raises KeyboardInterrupt wherever the server is: jupyter-server 2.10 then
        logs the traceback of the request it happened to interrupt.)"""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.server_pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
