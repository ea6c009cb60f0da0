"""A real JupyterHub (``jupyterhub`` + configurable-http-proxy) running the example config
(``examples/hub-simulated``), whose GPU broker service the hub starts under its
supervisor, which restarts it.

``Hub`` listens on free ports under a directory of its own, on the example's machine cut
to one GPU (seven 1g.10gb slices) so that a few requests fill it. Tests reach the hub's
REST API as a test-only admin service (``hub_api``), make users and their hub API tokens
(``user``) and call the broker through the proxy (``api``), as a user's server or a
script would; ``ServerKernel`` runs code in a kernel of a user's server, through the
proxy as a browser does. The ``hub`` fixture (tests/hub/conftest.py) starts one per test module.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import requests
import websocket
from live_server import free_port

from hub_spawner.hubconfig import SUPERVISOR
from jupyter_gpubroker.api import TOKEN_HEADER

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "hub-simulated" / "jupyterhub_config.py"
EXAMPLE_COMMAND = "jupyterhub -f examples/hub-simulated/jupyterhub_config.py"
"""How the README and the quick start start the example hub, from the checkout."""
SERVICE = "gpubroker"
API = f"/services/{SERVICE}/api/v1"


@contextlib.contextmanager
def example_ports() -> Iterator[None]:
    """The example hub's own ports (the docs' 127.0.0.1:8000, and the service's, the hub's
    and the proxy's), held by one test at a time on this machine, whichever run or worker
    it is of: a lock file that the next one waits on."""
    with open(Path(tempfile.gettempdir(), "gpubroker-example-hub.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def wait_for(
    what: str,
    check: Any,
    timeout_s: float = 90.0,
    log: Path | None = None,
    interval_s: float = 0.3,
) -> Any:
    """Poll ``check()`` every ``interval_s`` until it returns something true; fail with
    the hub's log."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            found = check()
            if found:
                return found
        except (OSError, requests.RequestException):
            pass
        if time.monotonic() > deadline:
            tail = log.read_text()[-4000:] if log is not None and log.exists() else ""
            raise AssertionError(f"timed out waiting for {what}\n{tail}")
        time.sleep(interval_s)


@contextlib.contextmanager
def refusing(port: int) -> Iterator[None]:
    """``port`` taken, once what listens there is gone, by a listener that resets every
    connection at once: a caller is refused as if nothing listened, and nothing else can
    listen there meanwhile (a service the hub starts again fails to)."""
    listener = wait_for("the port to free", lambda: socket.create_server(("127.0.0.1", port)))
    listener.settimeout(0.2)
    done = threading.Event()

    def reset() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

    thread = threading.Thread(target=reset, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        listener.close()


@contextlib.contextmanager
def history_hub(home: Path, seed: Callable[[Path], None]) -> Iterator[Hub]:
    """A running hub whose broker starts on a state file ``seed`` wrote first (a history
    for the admin page's forecast and what-if), stopped at the end."""
    running = Hub(home)
    running.home.mkdir()
    seed(running.state_file)
    with running.running():
        yield running


class Hub:
    """One running hub, its broker service and the users the tests made."""

    def __init__(
        self,
        home: Path,
        spawner: str = "",
        extra_config: str = "",
        supervised: bool = True,
        **broker: Any,
    ) -> None:
        """``spawner``: the hub's ``spawner_class`` instead of the example's; ``extra_config``:
        lines appended to the hub's config; ``supervised``: the service under its
        supervisor, as ``configure`` runs it (``False``: the service alone, which the hub
        restarts at its next poll); ``broker``: ``c.GPUBroker`` options of the service
        beyond the example's."""
        self.home, self.spawner, self.extra_config = home, spawner, extra_config
        self.supervised = supervised
        self.broker = {
            "simulate": "dgx-h100-mig:1",
            "tick_interval": 0.5,
            # the hub passes services no environment of ours: the tests' own lock dir
            "gpu_lock_dir": str(home / "gpu-locks"),
            "user_gpu_lock_dir": str(home / "user-gpu-locks"),
            **broker,
        }
        self.port, self.proxy_port, self.hub_port, self.service_port = (
            free_port() for _ in range(4)
        )
        self.admin_token = secrets.token_hex(16)
        self.state_file = home / "gpubroker.sqlite"
        self.log = home / "hub.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        """The broker's API through the proxy."""
        return self.url + API

    @property
    def service_url(self) -> str:
        """The broker's API straight from the service, as user servers reach it."""
        return f"http://127.0.0.1:{self.service_port}{API}"

    def config(self) -> str:
        """The example's config, on this test's ports and files, plus an admin service."""
        service_url = f"http://127.0.0.1:{self.service_port}"
        return f"""
c = get_config()
load_subconfig({str(EXAMPLE)!r})
c.JupyterHub.port = {self.port}
c.JupyterHub.hub_port = {self.hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{self.proxy_port}"
c.JupyterHub.db_url = "sqlite:///{self.home}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{self.home}/jupyterhub_cookie_secret"
c.JupyterHub.pid_file = "{self.home}/jupyterhub.pid"
broker = c.JupyterHub.services[0]
broker["url"] = "{service_url}"
assert broker["command"][1:3] == ["-m", {SUPERVISOR!r}]
broker["command"] = [
    *broker["command"][:2],
    {SUPERVISOR if self.supervised else "hub_spawner.service"!r},
    *broker["command"][3:-1],
    "--GPUBroker.state_file={self.state_file}",
    *{[f"--GPUBroker.{k}={v}" for k, v in self.broker.items()]!r},
]
c.Spawner.environment = {{"GPUBROKER_URL": "{self.service_url}"}}
c.SimpleLocalProcessSpawner.home_dir_template = "{self.home}/users/{{username}}"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
{f"c.JupyterHub.spawner_class = {self.spawner!r}" if self.spawner else ""}
c.JupyterHub.services.append({{"name": "e2e-admin", "api_token": "{self.admin_token}"}})
c.JupyterHub.load_roles.append(
    {{
        "name": "e2e-admin",
        "scopes": [
            "admin:users", "admin:groups", "tokens", "read:users", "servers", "admin:server_state"
        ],
        "services": ["e2e-admin"],
    }}
)
{self.extra_config}
"""

    def start(self, broker_runs: bool = True) -> None:
        path = self.home / "jupyterhub_config.py"
        path.write_text(self.config())
        paths = [str(ROOT), os.environ.get("PYTHONPATH", "")]  # this checkout's code
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in paths if p),
            # the example's runtime files (the proxy's pid file too) in this test's home,
            # not in the Jupyter data dir that every other hub run on this machine shares
            "GPUBROKER_EXAMPLE_DIR": str(self.home),
        }
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "jupyterhub", "-f", str(path)],
                cwd=self.home,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.wait_for_service(broker_runs)

    def wait_for_service(self, broker_runs: bool = True) -> int:
        """Wait until the broker service answers through the proxy; its pid (0 when its
        broker does not run: no process holds the state file)."""

        def up() -> int | None:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"the hub exited:\n{self.log.read_text()[-4000:]}")
            if requests.get(f"{self.api_url}/me", timeout=5).status_code != 403:
                return None
            return self.service_pid() if broker_runs else -1

        return max(0, int(wait_for("the broker service", up, log=self.log)))

    def service_pid(self) -> int | None:
        """The service's pid, from its state file's lock (who holds the file)."""
        lock = self.state_file.with_name(self.state_file.name + ".lock")
        try:
            pid = int(json.loads(lock.read_text())["pid"])
        except (OSError, ValueError, KeyError):
            return None
        return pid if Path(f"/proc/{pid}").exists() else None

    def supervisor_pid(self) -> int:
        """The pid of the process the hub started for the service: the broker service's
        supervisor (the service itself when not ``supervised``)."""
        pid = self.service_pid()
        assert pid is not None, "no broker service runs"
        if not self.supervised:
            return pid
        status = Path(f"/proc/{pid}/status").read_text()
        return int(next(x for x in status.splitlines() if x.startswith("PPid:")).split()[1])

    def kill_service(self) -> int:
        """SIGKILL the broker service (the process holding its state file) and wait until a
        new one answers (its supervisor's, or the hub's); its pid."""
        before = self.service_pid()
        assert before is not None, "no broker service runs"
        os.kill(before, signal.SIGKILL)
        wait_for("the hub to notice", lambda: self.service_pid() != before, log=self.log)
        after = self.wait_for_service()
        assert after != before
        return after

    @contextlib.contextmanager
    def running(self, broker_runs: bool = True) -> Iterator[Hub]:
        """The hub started, stopped at the end (also when it failed to start)."""
        try:
            self.start(broker_runs)
            yield self
        finally:
            self.stop()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)  # the hub stops its services too
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    # -- the hub's REST API, as the test's admin service

    def hub_api(self, method: str, path: str, body: Any = None, expect: int | None = 200) -> Any:
        """A call to the hub's REST API; ``expect=None``: any success."""
        r = requests.request(
            method,
            f"{self.url}/hub/api/{path}",
            json=body,
            headers={"Authorization": f"token {self.admin_token}"},
            timeout=30,
        )
        good = r.ok if expect is None else r.status_code == expect
        assert good, f"{method} {path}: {r.status_code} {r.text}"
        return r.json() if r.text else None

    def user(self, name: str, scopes: list[str] | None = None) -> str:
        """Make ``name`` a hub user (once) and return a new hub API token of theirs, with
        all their permissions or only ``scopes``."""
        if (
            requests.get(
                f"{self.url}/hub/api/users/{name}",
                headers={"Authorization": f"token {self.admin_token}"},
                timeout=30,
            ).status_code
            == 404
        ):
            self.hub_api("POST", f"users/{name}", expect=201)
        body: dict[str, Any] = {"note": "e2e"}
        if scopes is not None:
            body["scopes"] = scopes
        return str(self.hub_api("POST", f"users/{name}/tokens", body, expect=201)["token"])

    def login(self, name: str) -> requests.Session:
        """A browser's session of ``name``: logged in to the hub (any password: the dummy
        authenticator), then to the broker service's pages through the hub's OAuth."""
        s = requests.Session()
        s.get(f"{self.url}/hub/login", timeout=30)
        form = {"username": name, "password": "any", "_xsrf": s.cookies.get("_xsrf", path="/hub/")}
        assert s.post(f"{self.url}/hub/login", data=form, timeout=30).ok
        page = s.get(f"{self.url}/services/{SERVICE}/", timeout=60)  # the OAuth dance
        assert page.status_code == 200, page.text
        return s

    # -- single-user servers, started by the hub's spawner

    def start_server(self, name: str) -> dict[str, str]:
        """Start ``name``'s server through the hub and wait until it is ready; the
        environment the hub gave it (its ``JUPYTERHUB_API_TOKEN``, ``GPUBROKER_URL``)."""
        self.hub_api("POST", f"users/{name}/server", expect=None)
        return self.ready_server_env(name)

    def ready_server_env(self, name: str) -> dict[str, str]:
        """Wait until ``name``'s server (however it was started) is ready; its environment."""

        def ready() -> dict[str, Any] | None:
            server = self.hub_api("GET", f"users/{name}")["servers"].get("", {})
            return server if server.get("ready") else None

        server = wait_for(f"{name}'s server", ready, timeout_s=180, log=self.log)
        environ = Path(f"/proc/{server['state']['pid']}/environ").read_bytes()
        return dict(v.split("=", 1) for v in environ.decode().split("\0") if "=" in v)

    def stop_server(self, name: str) -> None:
        self.hub_api("DELETE", f"users/{name}/server", expect=None)

    # -- the broker's API, through the proxy

    def api(
        self, token: str, method: str, path: str, body: Any = None, *, kernel: bool = False
    ) -> tuple[int, Any]:
        """(status, JSON) of one broker call with a hub token (or a kernel token)."""
        header = {TOKEN_HEADER: token} if kernel else {"Authorization": f"token {token}"}
        r = requests.request(
            method,
            f"{self.api_url}/{path}",
            json=body if body is not None or method != "POST" else {},
            headers=header,
            timeout=30,
        )
        return r.status_code, r.json() if r.text else None

    def ok(self, token: str, method: str, path: str, body: Any = None) -> Any:
        """The JSON of a broker call that must succeed."""
        status, data = self.api(token, method, path, body)
        assert status in (200, 201, 204), f"{method} {path}: {status} {data}"
        return data


class ServerKernel:
    """A kernel of a user's server, started and driven through the hub's proxy as
    JupyterLab does: the server's kernels API, then its channels websocket (JSON
    messages). A reader thread keeps every message the kernel sends, so a test reads a
    cell's output, and the successive states of the widget models it opened, while the
    cell still runs."""

    def __init__(self, hub: Hub, user: str, token: str, kernelspec: str) -> None:
        self.hub, self.user = hub, user
        self.headers = {"Authorization": f"token {token}"}
        r = requests.post(
            f"{self.server}/api/kernels",
            json={"name": kernelspec},
            headers=self.headers,
            timeout=180,  # a GPU kernel starts once granted
        )
        assert r.status_code == 201, f"{kernelspec} in {user}'s server: {r.status_code} {r.text}"
        self.id = str(r.json()["id"])
        self.session = uuid.uuid4().hex
        self.messages: list[dict[str, Any]] = []
        self._changed = threading.Condition()
        ws_url = self.server.replace("http", "ws", 1)
        self.ws = websocket.create_connection(
            f"{ws_url}/api/kernels/{self.id}/channels?session_id={self.session}",
            header=[f"{k}: {v}" for k, v in self.headers.items()],
            timeout=30,
        )
        self.ws.settimeout(None)
        threading.Thread(target=self._read, name=f"kernel-{self.id}", daemon=True).start()

    @property
    def server(self) -> str:
        return f"{self.hub.url}/user/{self.user}"

    def _read(self) -> None:
        while True:
            try:
                frame = self.ws.recv()
            except (websocket.WebSocketException, OSError):
                return
            if not frame:  # closed
                return
            if isinstance(frame, str):  # binary frames carry widget buffers: none of ours
                with self._changed:
                    self.messages.append(json.loads(frame))
                    self._changed.notify_all()

    def start(self, code: str) -> str:
        """Send ``code`` to run; the request's message id."""
        msg_id = uuid.uuid4().hex
        self.ws.send(
            json.dumps(
                {
                    "header": {
                        "msg_id": msg_id,
                        "msg_type": "execute_request",
                        "session": self.session,
                        "username": self.user,
                        "version": "5.3",
                    },
                    "parent_header": {},
                    "metadata": {},
                    "content": {"code": code, "silent": False, "allow_stdin": False},
                    "channel": "shell",
                }
            )
        )
        return msg_id

    def replies(self, msg_id: str) -> list[dict[str, Any]]:
        with self._changed:
            return [m for m in self.messages if m["parent_header"].get("msg_id") == msg_id]

    def wait(self, msg_id: str, timeout_s: float = 120.0) -> str:
        """Wait until the cell ``msg_id`` finished; what it showed as text: its streams,
        errors and the text/plain of what it displayed."""

        def done(m: dict[str, Any]) -> bool:
            return m["msg_type"] == "status" and m["content"]["execution_state"] == "idle"

        with self._changed:
            ended = self._changed.wait_for(lambda: any(map(done, self.replies(msg_id))), timeout_s)
        assert ended, f"cell {msg_id} still runs in kernel {self.id}: {self.replies(msg_id)}"
        parts = []
        for m in self.replies(msg_id):
            content = m["content"]
            if m["msg_type"] == "stream":
                parts.append(content["text"])
            elif m["msg_type"] == "error":
                parts.append("\n".join(content["traceback"]))
            elif "text/plain" in content.get("data", {}):
                parts.append(content["data"]["text/plain"])
        return "\n".join(parts).strip()

    def run(self, code: str, timeout_s: float = 120.0) -> str:
        """Run ``code`` and return what it showed (``wait``)."""
        return self.wait(self.start(code), timeout_s)

    def widget_states(self, key: str) -> list[dict[str, Any]]:
        """Successive states of the widget models that have ``key``, whichever cell or
        background thread of the kernel sent them."""
        models: dict[str, dict[str, Any]] = {}
        seen = []
        with self._changed:
            messages = list(self.messages)
        for m in messages:
            if m["msg_type"] not in ("comm_open", "comm_msg"):
                continue
            data = m["content"].get("data", {})
            if "state" in data:
                comm = m["content"]["comm_id"]
                models[comm] = {**models.get(comm, {}), **data["state"]}
                if key in models[comm]:
                    seen.append(dict(models[comm]))
        return seen

    def alive(self) -> bool:
        """Does the user's server still run this kernel?"""
        r = requests.get(f"{self.server}/api/kernels", headers=self.headers, timeout=30)
        assert r.ok, r.text
        return any(k["id"] == self.id for k in r.json())

    def shutdown(self) -> None:
        self.ws.close()
        requests.delete(f"{self.server}/api/kernels/{self.id}", headers=self.headers, timeout=60)
