"""Fixtures of the Kubernetes tests: a kubeconfig for a given API server address (KubeSpawner
loads one when it is made), ``kube``: the real control plane ``.ci/kube-up`` starts
(``kube_cluster.py``) with the test GPU nodes in it, and ``dra``: that cluster with the
nodes whose GPUs are ResourceSlices as NVIDIA's DRA driver publishes them
(``dra_publisher.py``). Without that cluster the cluster tests are skipped, except in CI
(``CI=true``), where that is a failure."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dra_publisher
import kube_cluster
import pytest
from kube_rbac import delete_account
from live_server import free_port

if TYPE_CHECKING:
    from hub_spawner.kubernetes import GPUBrokerKubeSpawner

KubeconfigFactory = Callable[..., Path]


@pytest.fixture
def kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> KubeconfigFactory:
    """Write a kubeconfig for ``server`` (default: a port nothing listens on) and make it
    $KUBECONFIG; returns its path."""
    kube_config = pytest.importorskip("kubernetes_asyncio.config.kube_config")

    def make(server: str = "") -> Path:
        path = tmp_path / "kubeconfig"
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f'clusters: [{{name: c, cluster: {{server: "{server or f"http://127.0.0.1:{free_port()}"}"}}}}]\n'
            "users: [{name: u, user: {token: t}}]\n"
            "contexts: [{name: x, context: {cluster: c, user: u}}]\n"
            "current-context: x\n"
        )
        monkeypatch.setenv("KUBECONFIG", str(path))
        # the client reads $KUBECONFIG once, when it is imported
        monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
        return path

    return make


STARTING_ENV = "GPUBROKER_KUBE_STATUS"
"""Where ``.ci/run``, which builds and starts the cluster beside the other tests, writes
how ``.ci/kube-up`` ended (its exit status, then its seconds); its output is beside it."""


def started_cluster() -> str:
    """Wait for a cluster ``.ci/run`` is still building; why it is not there ("" when it
    is, or nobody is building one)."""
    status = os.environ.get(STARTING_ENV)
    if not status:
        return ""
    path = Path(status)
    deadline = time.monotonic() + 60 * 60
    while not path.exists():
        if time.monotonic() > deadline:
            return f".ci/kube-up did not end within an hour ({path} is missing)"
        time.sleep(2)
    code = path.read_text().split()[0]
    if code != "0":
        log = path.with_suffix(".log")
        return (
            f".ci/kube-up failed (exit {code}): {log.read_text()[-2000:] if log.exists() else ''}"
        )
    return ""


def missing_cluster() -> str:
    """Why the test cluster is not there to test ("" when it answers)."""
    if why := started_cluster():
        return why
    if not kube_cluster.KUBECONFIG.is_file() or not kube_cluster.KUBECTL.is_file():
        return (
            f"no Kubernetes test cluster ({kube_cluster.KUBECONFIG} is missing): {kube_cluster.UP}"
        )
    try:
        kube_cluster.kubectl("get", "--raw", "/readyz")
    except (AssertionError, subprocess.TimeoutExpired) as e:
        return f"the Kubernetes test cluster does not answer ({e}): {kube_cluster.UP}"
    return ""


@pytest.fixture(scope="session")
def kube_nodes() -> None:
    """The test cluster answers; its GPU nodes made afresh once a session."""
    if why := missing_cluster():
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    kube_cluster.make_nodes()


@pytest.fixture
def kube(kube_nodes: None) -> Iterator[None]:
    """The cluster with its GPU nodes schedulable and no test pods, before and after."""
    kube_cluster.cleanup()
    yield
    kube_cluster.cleanup()


@pytest.fixture(scope="module")
def dra_nodes(kube_nodes: None) -> Iterator[None]:
    """The DRA nodes (``dra_publisher.NODES``) and their ResourceSlices, published for one
    test module and withdrawn after it, so the device plugin's tests never see them."""
    dra_publisher.publish()
    yield
    dra_publisher.withdraw()


def _delete_claims() -> None:
    kube_cluster.kubectl(
        "delete",
        "resourceclaims,resourceclaimtemplates",
        "--all",
        "-n",
        kube_cluster.NAMESPACE,
        "--wait=true",
        "--timeout=60s",
    )


@pytest.fixture
def dra(dra_nodes: None, kube: None) -> Iterator[None]:
    """The cluster with its DRA nodes too, and no test pods, ResourceClaims or
    ResourceClaimTemplates, before and after."""
    _delete_claims()
    yield
    kube_cluster.cleanup()
    _delete_claims()


def _fresh_clients(monkeypatch: pytest.MonkeyPatch) -> Any:
    """KubeSpawner loads its kubeconfig once and shares one API client per event loop:
    each test's spawners load theirs and get their own."""
    clients = pytest.importorskip("kubespawner.clients", reason="the kubernetes extra")
    from kubespawner import KubeSpawner

    monkeypatch.setattr(clients, "_client_cache", {})
    clients.load_config.cache_clear()
    # and its watches of pods and events, shared by its spawners, run on one event loop
    monkeypatch.setattr(KubeSpawner, "reflectors", {})
    WATCHES.append(KubeSpawner.reflectors)
    return clients


WATCHES: list[dict[str, Any]] = []
"""KubeSpawner's watches of each client a test made, which ``_close_clients`` stops."""


async def _close_clients() -> None:
    """Stop the watches and end the tasks that close the shared clients (in a hub: at its
    shutdown)."""
    while WATCHES:
        for reflector in list(WATCHES.pop().values()):
            await reflector.stop()
    tasks = [t for t in asyncio.all_tasks() if "close_client_task" in repr(t.get_coro())]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.fixture
def make_spawner(
    kubeconfig: KubeconfigFactory,
    monkeypatch: pytest.MonkeyPatch,
    jp_asyncio_loop: asyncio.AbstractEventLoop,
) -> Iterator[Callable[..., GPUBrokerKubeSpawner]]:
    """Make a spawner with these traits for KubeSpawner's stand-in of the hub's user
    ("mock@name"), in a test's event loop as the hub makes it in its own; the API server
    it would talk to is ``server`` (default: a port nothing listens on)."""
    from hub_spawner.kubernetes import GPUBrokerKubeSpawner

    _fresh_clients(monkeypatch)

    def make(server: str = "", **traits: Any) -> GPUBrokerKubeSpawner:
        kubeconfig(server)
        return GPUBrokerKubeSpawner(_mock=True, **traits)

    yield make
    jp_asyncio_loop.run_until_complete(_close_clients())


@pytest.fixture
def spawner(
    monkeypatch: pytest.MonkeyPatch, jp_asyncio_loop: asyncio.AbstractEventLoop
) -> Iterator[Callable[..., GPUBrokerKubeSpawner]]:
    """GPU KubeSpawners on the test cluster, for KubeSpawner's stand-in user ("mock@name")
    or ``user``, with the admin's kubeconfig or ``kubeconfig`` (one a test made for a
    service account)."""
    from hub_spawner.kubernetes import GPUBrokerKubeSpawner

    kube_config = pytest.importorskip("kubernetes_asyncio.config.kube_config")
    clients = _fresh_clients(monkeypatch)
    loaded: list[Path] = []

    def make(
        kubeconfig: Path = kube_cluster.KUBECONFIG, user: str = "", **traits: Any
    ) -> GPUBrokerKubeSpawner:
        if loaded[-1:] != [kubeconfig]:  # the client of another kubeconfig: a new one
            monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
            monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
            _fresh_clients(monkeypatch)
            loaded.append(kubeconfig)
        traits = {
            "namespace": kube_cluster.NAMESPACE,
            "image": kube_cluster.PAUSE,
            "cmd": ["/pause"],
            **traits,
        }
        if user:
            traits["user"] = MockUser(user)
        return GPUBrokerKubeSpawner(_mock=True, **traits)

    yield make
    jp_asyncio_loop.run_until_complete(_close_clients())
    clients.load_config.cache_clear()


class MockUser:
    """A hub user as KubeSpawner's ``_mock`` makes one (``mock@name``), named otherwise."""

    def __init__(self, name: str) -> None:
        self.name, self.id, self.url = name, f"id-{name}", f"/user/{name}/"


@pytest.fixture
def accounts() -> Iterator[list[str]]:
    """The names of the service accounts a test makes (``kube_rbac.service_account``),
    deleted with their roles after it."""
    made: list[str] = []
    yield made
    for name in made:
        delete_account(name)


@pytest.fixture
def dra_broker(tmp_path: Path) -> Iterator[Any]:
    """A running broker of the DRA nodes (``kube_broker.make_dra_broker``)."""
    from kube_broker import make_dra_broker, started

    with started(make_dra_broker(tmp_path / "state.sqlite")) as running:
        yield running
