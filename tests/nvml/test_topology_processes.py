"""A topology file's ``processes``: real OS processes already computing on whole GPUs,
listed while they run; anything else in that key is refused, saying what is wrong."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from jupyter_gpubroker.nvml import open_backend
from jupyter_gpubroker.nvml.presets import TopologyError, read_topology_file


def machine(tmp_path: Path, processes: object, mig: bool = False) -> Path:
    path = tmp_path / "machine.yaml"
    entry = {"devices": "all", "mig-enabled": mig}
    if mig:
        entry["mig-devices"] = {"1g.10gb": 7}
    path.write_text(
        yaml.safe_dump(
            {
                "version": "v1",
                "simulate": {"gpu-model": "H100-80GB", "gpu-count": 2, "processes": processes},
                "mig-configs": {"only": [entry]},
            }
        )
    )
    return path


def test_a_listed_process_runs_on_its_gpu_until_it_exits(tmp_path: Path) -> None:
    p = subprocess.Popen(["sleep", "60"])
    backend = open_backend(str(machine(tmp_path, {1: [p.pid]})))
    try:
        gpu0, gpu1 = (g.uuid for g in backend.inventory().gpus)
        assert backend.compute_pids(gpu1) == (p.pid,) and backend.compute_pids(gpu0) == ()
        p.kill()
        p.wait()
        assert backend.compute_pids(gpu1) == ()
    finally:
        backend.close()
        if p.poll() is None:
            p.kill()


@pytest.mark.parametrize(
    "processes, mig, says",
    [
        ({2: [os.getpid()]}, False, "2 is not the index of a GPU with MIG off"),
        ({0: [os.getpid()]}, True, "0 is not the index of a GPU with MIG off"),
        ({0: "4242"}, False, "a list of process ids, not '4242'"),
        ({0: [0]}, False, "a list of process ids"),
        ([1, 2], False, "must be a non-empty mapping"),
    ],
)
def test_bad_processes_are_refused(tmp_path: Path, processes: object, mig: bool, says: str) -> None:
    with pytest.raises(TopologyError, match=says):
        read_topology_file(machine(tmp_path, processes, mig))
