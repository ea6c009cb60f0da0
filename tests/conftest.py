"""Fixtures shared by every test package, and the jupyter-server ones shared by the
server and kernel tests: a real jupyter-server with the extension on a simulated
one-GPU MIG machine. Kernels reach its API over HTTP, so the tests that start them
also request ``http_server_client`` (tests/server with an autouse fixture)."""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import pynvml
import pytest
from kernel_cells import execute
from tornado.httpclient import HTTPClientError

from jupyter_gpubroker.api import API_PREFIX
from jupyter_gpubroker.client import URL_ENV
from jupyter_gpubroker.kernelspec import spec_for
from jupyter_gpubroker.nvml.simulated import PRIVILEGE_ENV
from jupyter_gpubroker.paths import LOCK_DIR_ENV, USER_LOCK_DIR_ENV
from jupyter_gpubroker.wire.sizes import Size

pytest_plugins = ["pytest_jupyter.jupyter_server"]
PROXY = "configurable-http-proxy"


def pytest_configure(config: pytest.Config) -> None:
    """Let SIGINT act as Ctrl-C in this process and the subprocesses the tests start (the
    demo, servers, the CLI), even when the suite runs as a background job, which starts
    with SIGINT ignored: the tests that send it would otherwise wait for nothing."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


SHARED = {
    "tests/slurm/": "slurm",
    "tests/kubernetes/": "kubernetes",
    "tests/confine/": "device-cgroups",
    "tests/hub/test_confine_hub.py": "device-cgroups",
}
"""Tests that share one thing of this machine's, by path: the Slurm and Kubernetes test
clusters (``.ci/slurm-up``, ``.ci/kube-up``: one cluster a checkout, whose inventory every
test of it reads whole) and the machine's device cgroups (each test checks that it left
none of its own, which another's would spoil). Each group runs on one worker, one test at
a time."""


ORDER = ("tests/slurm/", "tests/kubernetes/", "tests/ui/", "tests/hub/", "tests/")
"""The order the groups are handed out in (``--no-loadscope-reorder`` keeps it): the
longest first, so that no worker is left with one at the end (each cluster's tests run
one after another, for minutes; the browser's and the hub's start hubs)."""

KUBE_BUILDING = ORDER[:1] + ORDER[2:] + ORDER[1:2]
"""The order while CI still builds Kubernetes (a machine's first run): its tests last."""


def _order() -> tuple[str, ...]:
    """``KUBE_BUILDING`` while the file ``.ci/run`` writes once ``.ci/kube-up`` has ended
    (``STARTING_ENV`` of tests/kubernetes/conftest.py) is missing, else ``ORDER``."""
    status = os.environ.get("GPUBROKER_KUBE_STATUS")
    return KUBE_BUILDING if status and not os.path.exists(status) else ORDER


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist's controller picks the order once for every worker: a worker that
    read it a moment later, once the file was there, would collect another order."""
    node.workerinput["gpubroker_order"] = list(_order())


def _place(item: pytest.Item, order: tuple[str, ...]) -> int:
    """Where ``item`` comes in ``order``: at the longest path there its own starts with."""
    return order.index(max((p for p in order if item.nodeid.startswith(p)), key=len))


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Any:
    """How pytest-xdist (``-n``, ``--dist loadgroup``) shares the tests out: a module's
    tests go to one worker together (its module-scoped fixture, a hub or a server, is then
    started once), the tests of a shared cluster (``SHARED``) or a marked
    ``xdist_group`` to one worker, in the ``ORDER`` of their paths. Without xdist the
    marks change nothing but the order.

    Once pytest-xdist has written each group into its test's node id (``@group``), a
    worker checks that it did: pytest 9.2 with pytest-xdist 3.8 groups nothing
    (pytest-xdist#1386), and tests that share a cluster would run at once."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        path = item.nodeid.split("::")[0]
        group = next((g for prefix, g in SHARED.items() if path.startswith(prefix)), path)
        item.add_marker(pytest.mark.xdist_group(group))
    worker = getattr(config, "workerinput", None)
    order = tuple(worker["gpubroker_order"]) if worker else _order()
    items.sort(key=lambda item: _place(item, order))
    result = yield
    grouping = hasattr(config, "workerinput") and config.getvalue("loadgroup")
    if grouping and items and "@" not in items[0].nodeid.rpartition("]")[2]:
        raise pytest.UsageError(
            f"pytest-xdist does not group tests with pytest {pytest.__version__}: "
            "install a pytest this project supports (pip install -e '.[test]')"
        )
    return result


@pytest.fixture(autouse=True)
def _own_machine(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every broker a test starts (in process or as a subprocess: servers, the demo, the
    CLI) locks its simulated GPUs in a directory of this test's own, not the machine-wide
    one: the simulated GPUs' UUIDs of a state kept in memory are the same in every test,
    and tests (of other checkouts too) run in parallel. No test server talks to a central
    broker unless it says so. The simulated caller is root, whoever runs the suite (CI
    does as root, a developer seldom): the tests of an unprivileged broker say so."""
    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path_factory.mktemp("gpu-locks")))
    monkeypatch.setenv(USER_LOCK_DIR_ENV, str(tmp_path_factory.mktemp("user-gpu-locks")))
    monkeypatch.setenv(PRIVILEGE_ENV, "root")
    monkeypatch.delenv(URL_ENV, raising=False)


@pytest.fixture(scope="module")
def proxy() -> None:
    """configurable-http-proxy, which every real hub needs: without it a hub test is
    skipped, except in CI (``CI=true``), where that is a failure."""
    if shutil.which(PROXY) is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{PROXY} is not on PATH: .ci/run installs it with npm")
        pytest.skip(f"{PROXY} is not on PATH: npm install -g {PROXY}")


@pytest.fixture
def no_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make loading libnvidia-ml fail, as on a machine without an NVIDIA driver
    (so the no-driver paths are tested the same way on a GPU machine)."""

    def missing(name: str) -> None:
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(pynvml, "CDLL", missing)


Api = Callable[..., Awaitable[Any]]


@pytest.fixture
def broker_config(tmp_path) -> dict[str, Any]:
    """``c.GPUBroker``: one H100 cut in seven 1g.10gb slices, fast ticks, short leases."""
    return {
        "simulate": "dgx-h100-mig:1",
        "state_file": str(tmp_path / "broker" / "state.sqlite"),
        "tick_interval": 0.2,
        "lease_ttl": 4.0,
        "request_ttl": 60.0,  # what the tests queue through the API is not renewed
    }


@pytest.fixture
def jp_server_config(broker_config) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_gpubroker": True}},
        "GPUBroker": broker_config,
    }


@pytest.fixture
def gpu_kernelspec(jp_kernel_dir) -> Callable[..., str]:
    """Write a kernelspec that starts IPython on a GPU through the provisioner."""

    def make(name: str = "gpu-1g", **config: Any) -> str:
        _, spec = spec_for(Size(profile="1g.10gb"))
        spec["metadata"]["kernel_provisioner"]["config"] = config or {"gpu": "1g.10gb"}
        spec_dir = jp_kernel_dir / name
        spec_dir.mkdir(parents=True, exist_ok=True)
        (spec_dir / "kernel.json").write_text(json.dumps(spec))
        return name

    return make


@pytest.fixture
def api(jp_fetch) -> Api:
    """Call the broker API; returns (status, JSON body) without raising on 4xx.
    ``raw``: send this text as the body instead of ``body`` as JSON."""

    async def call(
        method: str,
        path: str,
        body: Any = None,
        headers: dict | None = None,
        raw: str | None = None,
        **params,
    ):
        kwargs: dict[str, Any] = {"method": method, "params": params or None}
        if raw is not None or body is not None:
            kwargs["body"] = raw if raw is not None else json.dumps(body)
            kwargs["allow_nonstandard_methods"] = method == "DELETE"  # a DELETE with a body
        elif method == "POST":
            kwargs["body"] = "{}"
        if headers:
            kwargs["headers"] = headers
        try:
            response = await jp_fetch(*API_PREFIX.split("/"), *path.split("/"), **kwargs)
        except HTTPClientError as e:
            assert e.response is not None
            return e.code, json.loads(e.response.body or b"null")
        return response.code, json.loads(response.body) if response.body else None

    return call


@pytest.fixture
def run_in_kernel() -> Callable[[Any, str], Awaitable[str]]:
    return _run_in_kernel


async def _run_in_kernel(km: Any, code: str) -> str:
    """Execute ``code`` in a running kernel and return what it printed."""
    client = km.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=60)
        out: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                out.append("\n".join(msg["content"]["traceback"]))

        await execute(client, code, hook)
        return "".join(out).strip()
    finally:
        client.stop_channels()
