"""What holds a share on a host, chosen from what the host offers, and said why; the MPS
daemons the broker runs (a real process: the simulated control daemon), and the
simulated clients that fail as NVIDIA documents when they go over their limit."""

from __future__ import annotations

import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from jupyter_gpubroker.enforce import HostFacts, choose
from jupyter_gpubroker.enforce.limits import CgroupLimits, nvml_set_limit
from jupyter_gpubroker.enforce.mps import MpsDaemons, MpsError
from jupyter_gpubroker.nvml import NvmlBackend, SimulatedNvml, load_topology
from jupyter_gpubroker.runtime.sharing import SIMULATED_MPS, read_facts

DEFAULT = pynvml.NVML_COMPUTEMODE_DEFAULT
NEW = HostFacts("615.20.01", 13040, True, True, "/sys/fs/cgroup/kernels", "/usr/bin/mps", True)
OLD = HostFacts("570.86.15", 12080, False, True, "", "/usr/bin/mps", True)


@pytest.mark.parametrize(
    ("host", "mode", "mechanism", "words"),
    [
        (NEW, DEFAULT, "driver", "the driver (615.20.01) holds each share of GPU 2"),
        (OLD, DEFAULT, "mps", "the driver is 570.86.15, and r615 with CUDA 13.4 is the first"),
        (
            HostFacts("570.86.15", 12080, False, False, "", "", False),
            DEFAULT,
            "watched",
            "no nvidia-cuda-mps-control on this host",
        ),
        (
            HostFacts("570.86.15", 12080, False, False, "", "/usr/bin/mps", False),
            DEFAULT,
            "watched",
            "the broker runs as neither root nor the kernels' user",
        ),
        (
            HostFacts("615.20.01", 13040, True, True, "", "/usr/bin/mps", True),
            DEFAULT,
            "mps",
            "no cgroup v2 directory is set aside for kernels",
        ),
        (
            NEW,
            pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
            "none",
            "GPU 2 is in exclusive-process compute mode: one process at a time may use it",
        ),
    ],
)
def test_the_strongest_mechanism_the_host_offers_holds_and_says_why(host, mode, mechanism, words):
    chosen = choose(host, "GPU 2", mode)
    assert chosen.mechanism == mechanism
    assert words in chosen.why


def test_the_admin_may_choose_a_weaker_mechanism():
    assert choose(NEW, "GPU 0", DEFAULT, strongest="mps").mechanism == "mps"
    assert choose(NEW, "GPU 0", DEFAULT, strongest="watched").mechanism == "watched"


@pytest.fixture
def mps_root() -> Iterator[Path]:
    """A short directory for the daemons' sockets (a socket path holds 108 bytes)."""
    with tempfile.TemporaryDirectory(prefix="mps", dir="/tmp") as d:
        yield Path(d) / "daemons"


def run_client(env: dict[str, str], code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30
    )


def test_a_daemon_per_gpu_and_user_and_clients_held_to_their_limits(mps_root):
    daemons = MpsDaemons(shlex.split(SIMULATED_MPS), mps_root, lambda user: None)
    try:
        ann = daemons.ensure("GPU-a", "ann", 8192, None)
        bob = daemons.ensure("GPU-a", "bob", 4096, 50)
        assert ann.alive() and bob.alive() and ann.pid != bob.pid
        assert ann.env["CUDA_MPS_PIPE_DIRECTORY"] != bob.env["CUDA_MPS_PIPE_DIRECTORY"]
        assert daemons.command(bob, "get_default_active_thread_percentage") == "50.0\n"
        over = run_client(
            {**bob.env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M"},
            "from jupyter_gpubroker.enforce.mpsim import cuda_malloc\n"
            "cuda_malloc(3000)\n"
            "try:\n    cuda_malloc(2000)\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
            "print('still running', cuda_malloc(1000))\n",
        )
        assert over.stdout.splitlines() == [
            "OutOfMemory CUDA error: out of memory",
            "still running 4000",
        ]
        within = run_client(
            {**ann.env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M"},
            "from jupyter_gpubroker.enforce.mpsim import cuda_malloc\nprint(cuda_malloc(7000))\n",
        )
        assert within.stdout == "7000\n"
        (ann.home / "log" / "control.log").read_text().index("Control daemon started")
    finally:
        daemons.close()
    assert not ann.alive() and not ann.home.exists(), "a stopped daemon leaves nothing behind"


def test_a_daemon_that_died_is_started_again_with_its_limit(mps_root):
    daemons = MpsDaemons(shlex.split(SIMULATED_MPS), mps_root, lambda user: None)
    try:
        first = daemons.ensure("GPU-a", "ann", 8192, None)
        daemons.command(first, "quit")
        for _ in range(100):
            if not first.alive():
                break
            subprocess.run(["sleep", "0.05"], check=True)
        (again,) = daemons.check()
        assert again.alive() and again.pid != first.pid
        answer = daemons.command(again, "get_default_device_pinned_mem_limit 0")
        assert answer == "8192M\n"
    finally:
        daemons.close()


def test_a_directory_another_user_could_write_is_not_used(mps_root):
    mps_root.mkdir(mode=0o777)
    mps_root.chmod(0o777)
    daemons = MpsDaemons(shlex.split(SIMULATED_MPS), mps_root, lambda user: None)
    with pytest.raises(MpsError, match="may be written by others"):
        daemons.ensure("GPU-a", "ann", 8192, None)


def test_under_the_driver_each_share_s_kernel_gets_a_capped_cgroup(tmp_path):
    """Driver r615: the kernel moves into a cgroup of its own, which NVML caps at the
    share's memory; the cap is lifted and the cgroup removed when the share ends."""
    sim = SimulatedNvml(load_topology("l40s-4"), privilege="root")
    sim.driver_version = "615.20.01"
    backend = NvmlBackend(sim).open()
    try:
        gpu = backend.inventory().gpus[0].uuid
        limits = CgroupLimits(tmp_path)  # a cgroup v2 tree stands in: the kernel's files
        limits.hold("l-1", gpu, 4242, 8192)
        cgroup = tmp_path / "gpubroker-l-1"
        assert (cgroup / "cgroup.procs").read_text() == "4242\n"
        assert sim.memory_limit(gpu, str(cgroup)) == (8192 << 20, 8192 << 20)
        (cgroup / "cgroup.procs").unlink()  # the kernel left it
        limits.end("l-1")
        assert sim.memory_limit(gpu, str(cgroup)) is None and not cgroup.exists()
    finally:
        backend.close()


def test_an_older_driver_has_no_memory_limits_to_set():
    sim = SimulatedNvml(load_topology("l40s-4"), privilege="root")
    backend = NvmlBackend(sim).open()
    try:
        gpu = backend.inventory().gpus[0].uuid
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            nvml_set_limit(gpu, "/sys/fs/cgroup/x", 1 << 30, 1 << 30)
        facts = read_facts("", "", True)
        assert (facts.driver, facts.cuda, facts.memory_limits) == ("570.86.15", 12080, False)
    finally:
        backend.close()


def test_a_daemon_that_no_longer_answers_is_ended_at_its_stop(mps_root):
    daemons = MpsDaemons(shlex.split(SIMULATED_MPS), mps_root, lambda user: None)
    d = daemons.ensure("GPU-a", "ann", 8192, None)
    (d.home / "pipe" / "control").unlink()  # its pipes gone: the front end cannot reach it
    daemons.stop("GPU-a", "ann")
    for _ in range(100):
        if not d.alive():
            break
        subprocess.run(["sleep", "0.05"], check=True)
    assert not d.alive() and not d.home.exists()


def test_why_the_driver_does_not_hold_a_share_is_a_whole_sentence():
    """The admin page shows this reason as it is: it once ended '... is the first to'."""
    assert choose(OLD, "GPU 0", pynvml.NVML_COMPUTEMODE_DEFAULT).why == (
        "MPS holds each share of GPU 0 to its memory; the driver does not: the driver is "
        "570.86.15, and r615 with CUDA 13.4 is the first that can"
    )
