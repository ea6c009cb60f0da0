"""The CLI is a front: at module level it imports the client and small shared modules,
never the core, the store, the NVML backends, the replay or the running broker. A command
that reads without a broker (``status``, ``usage``) imports what it needs when it runs."""

from __future__ import annotations

import ast
from pathlib import Path

import jupyter_gpubroker.cli

CORE_AND_BACKENDS = ("broker", "nvml", "replay", "runtime", "engines", "server", "monitor")


def module_level_imports(path: Path) -> list[str]:
    """The ``jupyter_gpubroker`` modules a file imports outside its functions."""
    tree = ast.parse(path.read_text())
    found = []
    for node in tree.body:  # statements at module level (a TYPE_CHECKING block loads nothing)
        if isinstance(node, ast.ImportFrom) and node.level:  # ``.x`` in cli/, ``..x`` above it
            base = ["jupyter_gpubroker", "cli"][: 3 - node.level]
            found.append(".".join([*base, node.module or ""]).rstrip("."))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "jupyter_gpubroker"
        ):
            found.append(node.module or "")
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("jupyter_gpubroker")]
    return found


def test_the_cli_imports_no_core_module_at_load() -> None:
    package = Path(jupyter_gpubroker.cli.__file__).parent
    files = sorted(package.glob("*.py"))
    assert len(files) >= 5
    for path in files:
        for module in module_level_imports(path):
            top = module.split(".")
            assert top[0] == "jupyter_gpubroker" and len(top) > 1, (path.name, module)
            assert top[1] not in CORE_AND_BACKENDS, (path.name, module)
