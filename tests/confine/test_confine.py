"""Servers and kernels confined to their grant's GPU device nodes, for real: device cgroups
of this machine's cgroup v1 devices controller and of its cgroup v2 hierarchy (a BPF
device program), NVIDIA device nodes made with mknod in a scratch directory under the
driver's majors, and a process of another user that opens them. There is no NVIDIA
driver here, so a node the cgroup lets through answers ENXIO (no such device) and one it
blocks EPERM, before any driver is asked."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from confine_boxes import Box, Probe, allowed, always, root_broker
from traitlets import TraitError

from jupyter_gpubroker.confine import ConfinementError
from jupyter_gpubroker.confine.nodes import nvml_address

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


def test_a_server_opens_its_whole_gpu_and_no_other_nvidia_node(
    make_box: Callable[[str], Box], probes: Callable[[Callable[[], None]], Probe]
) -> None:
    box = make_box("dgx-h100:4")
    path = box.confinement.server("alice", "", [box.gpu(2)])
    assert path is not None
    server = probes(box.confinement.joiner(path))
    answers = server.open(box.all_nodes)
    assert allowed(box, answers) == always(box) | {str(box.dev / "nvidia2")}
    for denied in ("nvidia0", "nvidia1", "nvidia3", "nvidia-uvm-tools", "nvidia-modeset"):
        assert answers[str(box.dev / denied)] == "EPERM"
    assert server.open(["/dev/null"]) == {"/dev/null": "opened"}  # the rest of /dev as before


def test_a_server_on_a_mig_slice_opens_its_gpu_and_its_instances_caps_only(
    make_box: Callable[[str], Box], probes: Callable[[Callable[[], None]], Probe]
) -> None:
    box = make_box("dgx-h100-mig:2")
    mine, neighbour = box.slices(0)[:2]
    path = box.confinement.server("bob", "train", [mine])
    assert path is not None
    answers = probes(box.confinement.joiner(path)).open(box.all_nodes)
    own = box.node(mine)
    assert own[0].endswith("/nvidia0") and len(own) == 3  # the GPU, its GI's and CI's caps
    assert allowed(box, answers) == always(box) | set(own)
    for cap in box.node(neighbour)[1:]:  # the slice next to it on the same GPU
        assert answers[cap] == "EPERM"
    for cap in ("nvidia-cap1", "nvidia-cap2"):  # mig config and monitor
        assert answers[str(box.dev / "nvidia-caps" / cap)] == "EPERM"


def test_a_cpu_only_server_opens_no_gpu_until_its_kernel_is_granted_one(
    make_box: Callable[[str], Box], probes: Callable[[Callable[[], None]], Probe]
) -> None:
    box = make_box("dgx-h100-mig:2")
    c = box.confinement
    path = c.server("carol", "", [])
    assert path is not None
    kernel = probes(c.joiner(path))  # a process of the server: a kernel it started
    assert allowed(box, kernel.open(box.all_nodes)) == always(box)
    granted = box.slices(1)[3]
    with pytest.raises(ConfinementError, match="not in a server of mallory"):
        c.allow(kernel.pid, [granted], "mallory")  # a pid reported by, or for, someone else
    moved = c.allow(kernel.pid, [granted], "carol")
    assert moved is not None and moved != path
    assert allowed(box, kernel.open(box.all_nodes)) == always(box) | set(box.node(granted))
    more = box.slices(0)[0]  # a second grant to the same kernel
    again = c.allow(kernel.pid, [more], "carol")
    assert again is not None and not moved.exists()
    both = set(box.node(granted)) | set(box.node(more))
    assert allowed(box, kernel.open(box.all_nodes)) == always(box) | both
    c.withdraw(kernel.pid)  # its lease ended
    assert allowed(box, kernel.open(box.all_nodes)) == always(box)
    assert not again.exists()
    assert f"{kernel.pid}" in (path / "cgroup.procs").read_text().split()


def test_a_kernel_granted_a_gpu_takes_along_the_workers_it_started_before(
    make_box: Callable[[str], Box], probes: Callable[[Callable[[], None]], Probe]
) -> None:
    """A pool of workers the kernel made before it had a GPU (a data loader at its start)
    may open its GPU with it; another kernel of the same server may not."""
    box = make_box("dgx-h100:2")
    c = box.confinement
    path = c.server("carol", "", [])
    assert path is not None
    kernel = probes(c.joiner(path))
    worker = kernel.fork()
    neighbour = probes(c.joiner(path))
    assert c.allow(kernel.pid, [box.gpu(1)], "carol") is not None
    mine = always(box) | {str(box.dev / "nvidia1")}
    opened = {pid: allowed(box, said) for pid, said in kernel.open_all(box.all_nodes).items()}
    assert opened == {kernel.pid: mine, worker: mine}
    assert allowed(box, neighbour.open(box.all_nodes)) == always(box)
    c.withdraw(kernel.pid)  # its lease ended: both back in the server's cgroup
    assert {kernel.pid, worker} <= set(c.cgroups.processes(path))


def test_a_stopped_servers_cgroups_go_and_a_process_left_behind_keeps_no_gpu(
    make_box: Callable[[str], Box], probes: Callable[[Callable[[], None]], Probe]
) -> None:
    box = make_box("dgx-h100:2")
    c = box.confinement
    path = c.server("dave", "", [box.gpu(0)])
    assert path is not None
    stray = probes(c.joiner(path))
    c.allow(stray.pid, [box.gpu(1)], "dave")
    c.release(path)  # the server stopped; this process outlived it
    assert path.exists() is False
    kernel_cgroups = list(path.parent.glob(path.name + "*"))
    assert len(kernel_cgroups) == 1  # the stray's own, kept while it lives
    assert allowed(box, stray.open(box.all_nodes)) == set()
    stray.stop()
    c.release(path)
    assert not list(path.parent.glob(path.name + "*"))


def test_a_process_not_confined_gets_nothing_added(
    make_box: Callable[[str], Box], probes: Callable[[Callable[[], None]], Probe]
) -> None:
    box = make_box("dgx-h100:2")
    free = probes(lambda: None)
    assert box.confinement.allow(free.pid, [box.gpu(0)], "nobody") is None


def test_a_grant_the_driver_cannot_place_refuses_to_confine(
    make_box: Callable[[str], Box], scratch: Path
) -> None:
    box = make_box("dgx-h100-mig:1")
    (scratch / "proc" / "mig-minors").unlink()  # a driver without the MIG caps table
    with pytest.raises(ConfinementError, match="nvidia-caps"):
        box.confinement.server("erin", "", [box.slices(0)[0]])
    assert not list(box.confinement.cgroups.root.glob("server-erin*"))


def test_where_it_cannot_confine_it_says_why_and_require_refuses(
    make_box: Callable[[str], Box], scratch: Path, caplog: pytest.LogCaptureFixture
) -> None:
    box = make_box("dgx-h100:1")
    c = box.confinement
    c.cgroup_devices = c.cgroup2 = str(scratch)  # no cgroups there
    c.cgroup = "v1"
    assert "no cgroup v1 devices controller" in c.why_not()
    c.cgroup = "auto"  # no v1 controller: v2
    assert "no cgroup v2 hierarchy" in c.why_not()
    assert c.server("frank", "", [box.gpu(0)]) is None
    assert "GPU servers are not confined to their GPU devices" in caplog.text
    c.mode = "require"
    with pytest.raises(ConfinementError, match="must be confined"):
        c.server("frank", "", [box.gpu(0)])
    c.mode = "off"
    assert c.server("frank", "", [box.gpu(0)]) is None
    with pytest.raises(TraitError, match="absolute path"):
        c.proc_devices = "proc/devices"
    with pytest.raises(TraitError):
        c.mode = "sometimes"


def test_the_root_broker_gives_a_reported_kernel_its_lease_and_takes_it_back_at_the_end(
    make_box: Callable[[str], Box],
    probes: Callable[[Callable[[], None]], Probe],
    tmp_path: Path,
) -> None:
    """The wiring a GPU kernel in a CPU-only server goes through: its renewal names its
    pid (``holder_pid``), the root broker moves it to its lease's devices; the lease's
    end takes them back; a server's own lease is left to the spawner."""
    from jupyter_gpubroker.api.rules import BrokerAPI
    from jupyter_gpubroker.wire.sizes import Size

    box = make_box("dgx-h100-mig:2")
    rt = root_broker(box, "dgx-h100-mig:2", tmp_path)
    try:
        api = BrokerAPI(rt)
        server = box.confinement.server("nobody", "", [])
        assert server is not None
        kernel = probes(box.confinement.joiner(server))
        lease = rt.core.lease(rt.core.submit("nobody", Size(profile="1g.10gb")).lease_id)
        a = nvml_address(rt.backend.handle(lease.devices[0]))
        mine = {str(box.dev / f"nvidia{a.gpu_minor}")}
        assert allowed(box, kernel.open(box.all_nodes)) == always(box)
        api.renew(api.identify("nobody"), lease.id, {"holder_pid": kernel.pid})
        assert mine < allowed(box, kernel.open(box.all_nodes))
        held = rt.core.submit("nobody", Size(profile="1g.10gb"), holder="server:nobody")
        api.renew(api.identify("nobody"), held.lease_id, {"holder_pid": kernel.pid})
        assert f"{kernel.pid}" not in (server / "cgroup.procs").read_text().split()
        rt.core.release(lease.id)
        assert allowed(box, kernel.open(box.all_nodes)) == always(box)
        assert f"{kernel.pid}" in (server / "cgroup.procs").read_text().split()
    finally:
        rt.stop()
        box.confinement.release(server)
