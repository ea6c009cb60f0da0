"""`jupyter gpubroker kernelspec install`: kernelspecs that start kernels on a GPU."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from jupyter_client.kernelspec import KernelSpecManager

from jupyter_gpubroker.cli import main


@pytest.mark.parametrize(
    ("args", "name", "display", "config"),
    [
        (["--gpu", "1g.10gb"], "python3-gpu-1g.10gb", "Python 3 (GPU 1g.10gb)", {"gpu": "1g.10gb"}),
        (["--gpus", "2"], "python3-gpu-2gpu", "Python 3 (2 GPUs)", {"gpus": 2}),
        (
            ["--on-demand"],
            "python3-gpu-on-demand",
            "Python 3 (GPU on demand)",
            {"on_demand": True},
        ),
        (
            ["--min-memory", "20", "--class", "batch"],
            "python3-gpu-20gb-batch",
            "Python 3 (GPU of at least 20 GB, batch)",
            {"min_memory_gb": 20.0, "job_class": "batch"},
        ),
    ],
)
def test_install_writes_a_provisioned_kernelspec(tmp_path, capsys, args, name, display, config):
    assert main(["kernelspec", "install", *args, "--prefix", str(tmp_path)]) == 0
    spec = json.loads((tmp_path / "share/jupyter/kernels" / name / "kernel.json").read_text())
    assert spec["display_name"] == display
    assert spec["metadata"]["kernel_provisioner"] == {
        "provisioner_name": "gpubroker-provisioner",
        "config": config,
    }
    assert f"installed {display}" in capsys.readouterr().out


def test_a_gpu_kernelspec_has_the_logos_of_the_stock_python_kernel(tmp_path):
    """The launcher shows the Python logo on a GPU kernel's tile, not a plain letter."""
    stock = Path(KernelSpecManager().get_kernel_spec("python3").resource_dir)
    logos = {p.name: p.read_bytes() for p in stock.glob("logo-*")}
    assert {"logo-32x32.png", "logo-64x64.png"} <= set(logos)
    assert main(["kernelspec", "install", "--gpu", "1g.10gb", "--prefix", str(tmp_path)]) == 0
    installed = tmp_path / "share/jupyter/kernels/python3-gpu-1g.10gb"
    assert {p.name: p.read_bytes() for p in installed.glob("logo-*")} == logos


def test_install_refuses_a_bad_size(tmp_path, capsys):
    assert main(["kernelspec", "install", "--gpu", "8g.1tb", "--prefix", str(tmp_path)]) == 1
    assert "unknown MIG profile '8g.1tb'" in capsys.readouterr().err
    assert not (tmp_path / "share").exists()
    with pytest.raises(SystemExit) as e:
        main(["kernelspec", "install", "--gpu", "1g.10gb", "--gpus", "2"])
    assert e.value.code == 2


def test_the_quick_starts_sys_prefix_install_as_written_is_found_by_every_server(
    tmp_path: Path,
) -> None:
    """docs/quickstart.md's command, typed into a shell: the spec lands in the
    environment's own prefix, where every user's server of that environment finds it.
    The environment is one of the test's own (a venv on this one's packages, with its
    ``jupyter`` commands), so no other test's servers see the spec meanwhile."""
    command = "jupyter gpubroker kernelspec install --gpu 1g.10gb --sys-prefix"
    ours = Path(sys.prefix) / "share/jupyter/kernels/python3-gpu-1g.10gb"
    existed = ours.exists()
    env_dir = environment_on_these_packages(tmp_path / "env", "jupyter", "jupyter-gpubroker")
    done = subprocess.run(
        shlex.split(command),
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": f"{env_dir / 'bin'}{os.pathsep}{os.environ['PATH']}"},
    )
    assert done.returncode == 0, done.stderr
    assert "installed Python 3 (GPU 1g.10gb)" in done.stdout
    target = env_dir / "share/jupyter/kernels/python3-gpu-1g.10gb"
    assert json.loads((target / "kernel.json").read_text())["display_name"] == (
        "Python 3 (GPU 1g.10gb)"
    )
    found = subprocess.run(
        [env_dir / "bin/python", "-m", "jupyter_client.kernelspecapp", "list", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")},
    )
    specs = json.loads(found.stdout)["kernelspecs"]
    assert Path(specs["python3-gpu-1g.10gb"]["resource_dir"]) == target
    assert ours.exists() == existed  # this suite's own environment is left alone


def environment_on_these_packages(path: Path, *commands: str) -> Path:
    """A venv at ``path`` that imports this one's packages and has its ``commands`` (their
    scripts, pointed at its own Python): what a second environment of a site looks like."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", path], check=True)
    (site,) = path.glob("lib/python*/site-packages")
    these = sysconfig.get_paths()["purelib"]  # with its own .pth files (the editable install)
    (site / "these-packages.pth").write_text(f"import site; site.addsitedir({these!r})\n")
    for name in commands:
        script = Path(sys.prefix, "bin", name).read_text().split("\n", 1)[1]
        (path / "bin" / name).write_text(f"#!{path / 'bin/python'}\n{script}")
        (path / "bin" / name).chmod(0o755)
    return path
