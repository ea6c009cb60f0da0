"""A server the hub starts with the GPU spawner runs in a device cgroup that lets it open
its grant's NVIDIA nodes only: a real hub as root, the broker service on the simulated
machine, the hub's own NVML on the same simulated machine, and the NVIDIA nodes made with
mknod in a scratch directory (no driver here: a node let through answers ENXIO, one
blocked EPERM). Once with the cgroup v1 devices controller, once with cgroup v2 (a BPF
device program). Needs root."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cgroup_versions import require
from live_hub import Hub, ServerKernel, wait_for

from hub_spawner.environment import LEASE_ENV
from jupyter_gpubroker.confine import DeviceConfinement
from jupyter_gpubroker.confine.nodes import DriverNodes, nvml_address
from jupyter_gpubroker.nvml import SIMULATE_ENV, SimulatedNvml, load_topology, open_backend

pytestmark = [pytest.mark.hub, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]
MACHINE = "dgx-h100-mig:1"
UVM, CAPS = 510, 511
OPEN_ALL = """
import errno, json, os
answers = {}
for path in sorted(json.loads(%r)):
    try:
        os.close(os.open(path, os.O_RDWR))
        answers[path] = "opened"
    except OSError as e:
        answers[path] = errno.errorcode[e.errno]
print(json.dumps(answers))
"""


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The machine's NVIDIA nodes and the driver's /proc files, as the driver would make
    them for the simulated machine (every GPU instance's caps on its one GPU)."""
    top = tmp_path_factory.mktemp("nvidia")
    table = SimulatedNvml(load_topology(MACHINE)).mig_minors()
    dev = top / "dev"
    (dev / "nvidia-caps").mkdir(parents=True)
    nodes = {"nvidia0": (195, 0), "nvidiactl": (195, 255), "nvidia-uvm": (UVM, 0)}
    for minor in DriverNodes.parse("", table).mig_minors.values():
        nodes[f"nvidia-caps/nvidia-cap{minor}"] = (CAPS, minor)
    for name, (major, minor) in nodes.items():
        os.mknod(dev / name, 0o20600, os.makedev(major, minor))
    chars, block = Path("/proc/devices").read_text().split("\nBlock devices:")
    nvidia = f"195 nvidia-frontend\n{UVM} nvidia-uvm\n{CAPS} nvidia-caps\n"
    (top / "devices").write_text(f"{chars}\n{nvidia}\nBlock devices:{block}")
    (top / "mig-minors").write_text(table)
    return top


@pytest.fixture(scope="module", params=["v1", "v2"])
def version(request: pytest.FixtureRequest) -> str:
    """The cgroup version that confines (``c.DeviceConfinement.cgroup``)."""
    require(request.param)
    return str(request.param)


@pytest.fixture(scope="module")
def hub(
    tmp_path_factory: pytest.TempPathFactory, proxy: None, scratch: Path, version: str
) -> Iterator[Hub]:
    config = f"""
c.DeviceConfinement.mode = "require"  # a server that cannot be confined does not start
c.DeviceConfinement.cgroup = "{version}"
c.DeviceConfinement.proc_devices = "{scratch / "devices"}"
c.DeviceConfinement.mig_minors = "{scratch / "mig-minors"}"
"""
    running = Hub(
        tmp_path_factory.mktemp("hub"),
        spawner="hub_spawner.spawner.SimpleGPUBrokerSpawner",
        extra_config=config,
        simulate=MACHINE,
        simulate_seed="",  # the UUIDs the hub's own NVML sees too
    )
    with pytest.MonkeyPatch.context() as env:
        env.setenv(SIMULATE_ENV, MACHINE)  # the hub's NVML: the broker's machine
        with running.running():
            yield running


def nodes_of(mig_uuid: str, scratch: Path) -> set[str]:
    """The scratch paths of a MIG slice's own nodes: its GPU's, its instances' caps."""
    backend = open_backend(MACHINE, seed="")
    try:
        a = nvml_address(backend.handle(mig_uuid))
    finally:
        backend.close()
    minors = DriverNodes.parse("", (scratch / "mig-minors").read_text()).mig_minors
    gi = f"gpu{a.gpu_minor}/gi{a.gpu_instance}"
    caps = [minors[f"{gi}/access"], minors[f"{gi}/ci{a.compute_instance}/access"]]
    return {str(scratch / "dev" / f"nvidia{a.gpu_minor}")} | {
        str(scratch / "dev" / "nvidia-caps" / f"nvidia-cap{m}") for m in caps
    }


def opened_by_kernel(hub: Hub, user: str, token: str, scratch: Path) -> dict[str, Any]:
    """What a kernel of the user's server got opening every NVIDIA node of the box."""
    paths = [str(p) for p in (scratch / "dev").rglob("nvidia*") if p.is_char_device()]
    kernel = ServerKernel(hub, user, token, "python3")
    try:
        return dict(json.loads(kernel.run(OPEN_ALL % json.dumps(paths))))
    finally:
        kernel.shutdown()


def test_a_gpu_server_and_its_kernels_open_only_the_nodes_of_its_slice(
    hub: Hub, scratch: Path, version: str
) -> None:
    token = hub.user("hana")
    hub.hub_api("POST", "users/hana/server", {"profile": "1g.10gb"}, expect=None)
    try:
        env = hub.ready_server_env("hana")
        pid = hub.hub_api("GET", "users/hana")["servers"][""]["state"]["pid"]
        cgroup = DeviceConfinement(cgroup=version).cgroups.of(pid)
        assert cgroup is not None and cgroup.name.startswith("server-hana-")
        granted = env["CUDA_VISIBLE_DEVICES"]
        assert granted.startswith("MIG-") and env[LEASE_ENV]
        answers = opened_by_kernel(hub, "hana", token, scratch)
        through = {p for p, a in answers.items() if a == "ENXIO"}
        always = {str(scratch / "dev" / "nvidiactl"), str(scratch / "dev" / "nvidia-uvm")}
        assert through == always | nodes_of(granted, scratch)
        assert {a for p, a in answers.items() if p not in through} == {"EPERM"}
    finally:
        hub.stop_server("hana")
    wait_for("the stopped server's cgroup to go", lambda: not cgroup.exists(), log=hub.log)


def test_a_cpu_only_server_opens_no_gpu(hub: Hub, scratch: Path) -> None:
    token = hub.user("ivan")
    hub.start_server("ivan")
    try:
        answers = opened_by_kernel(hub, "ivan", token, scratch)
        through = {p for p, a in answers.items() if a == "ENXIO"}
        assert through == {str(scratch / "dev" / "nvidiactl"), str(scratch / "dev" / "nvidia-uvm")}
    finally:
        hub.stop_server("ivan")
