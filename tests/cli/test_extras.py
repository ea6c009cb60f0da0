"""A single Jupyter server installs none of JupyterHub's stack: the hub service, the GPU
spawner and the hub pages come with the ``hub`` extra, and the service command says so
when it is missing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from jupyter_gpubroker.cli import main

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def names(requirements: list[str]) -> set[str]:
    return {r.split(">")[0].split("<")[0].split("[")[0].split("=")[0].strip() for r in requirements}


def test_the_base_install_has_no_hub_and_the_hub_extras_bring_it() -> None:
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11's tomllib reads pyproject.toml")
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    extras = project["optional-dependencies"]
    assert not names(project["dependencies"]) & {"jupyterhub", "jinja2", "batchspawner"}
    assert {"jupyterhub", "jinja2"} <= names(extras["hub"])
    for engine in ("slurm", "kubernetes"):
        assert "jupyter-gpubroker[hub]" in extras[engine]


def test_the_service_without_jupyterhub_says_what_to_install(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [m for m in sys.modules if m == "jupyterhub" or m.startswith("jupyterhub.")]:
        monkeypatch.delitem(sys.modules, name)
    for name in [m for m in sys.modules if m.startswith("hub_spawner")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "jupyterhub", None)  # import jupyterhub: not installed
    assert main(["service"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "jupyter gpubroker service runs under JupyterHub, which is not installed: "
        "pip install 'jupyter-gpubroker[hub]'"
    )
