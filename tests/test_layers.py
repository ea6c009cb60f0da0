"""The layers as DESIGN.md draws them: one core that imports no host, front or backend;
an API layer that loads without a running broker; fronts that share only the wire types
with the core. Read from each module's own import statements (those under ``if
TYPE_CHECKING:`` load nothing and are left out; those inside functions load when the
function runs and count), and checked where it shows: what a process that imports a
front loads. And the size of what a newcomer reads: modules, and functions' complexity."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from radon.complexity import cc_visit

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("jupyter_gpubroker", "hub_spawner")
HOSTS_AND_FRONTS = (
    "tornado",
    "jupyter_server",
    "jupyter_client",
    "jupyterhub",
    "IPython",
    "ipykernel",
    "ipywidgets",
    "traitlets",
    "pynvml",
    "kubernetes_asyncio",
)
"""Third-party packages of hosts, fronts and hardware backends, which the core never imports."""


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """The modules ``path`` imports when it runs: ``from a import b`` counts as
    ``a.b`` where ``b`` is a module of ours, else as ``a``."""
    tree = ast.parse(path.read_text())
    guarded = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
    }
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in guarded:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            for alias in node.names:
                sub = ROOT.joinpath(*f"{base}.{alias.name}".split("."))
                is_module = sub.with_suffix(".py").exists() or sub.is_dir()
                found.add(f"{base}.{alias.name}" if is_module else base)
    return found


MODULES = {
    module_name(p): imported(p)
    for package in PACKAGES
    for p in sorted((ROOT / package).rglob("*.py"))
    if "labextension" not in p.parts
}


def under(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def breaches(layer: str, allowed: object) -> dict[str, list[str]]:
    """Each module of ``layer`` with the imports ``allowed(name)`` refuses."""
    found = {
        module: sorted(i for i in imports if not allowed(i))  # type: ignore[operator]
        for module, imports in MODULES.items()
        if under(module, layer)
    }
    return {m: bad for m, bad in found.items() if bad}


def test_the_walk_sees_the_package() -> None:
    """The walk reads what it claims to (a rule over no modules would pass unread)."""
    assert "jupyter_gpubroker.broker.core" in MODULES
    assert "jupyter_gpubroker.wire.sizes" in MODULES["jupyter_gpubroker.broker.core"]
    assert "jupyter_gpubroker.runtime" in MODULES["hub_spawner.service"]
    assert "jupyter_gpubroker.kernel.magic" in MODULES
    assert "hub_spawner.spawner" in MODULES


def test_the_core_imports_no_host_front_or_backend() -> None:
    """``broker/`` imports only itself, the wire types and no host's, front's or
    backend's package (NVML, the engines, Jupyter, tornado, JupyterHub)."""

    def allowed(name: str) -> bool:
        if under(name, "jupyter_gpubroker.wire.traits"):  # the settings' traits: traitlets
            return False
        if under(name, *PACKAGES):
            return under(name, "jupyter_gpubroker.broker", "jupyter_gpubroker.wire")
        return not under(name, *HOSTS_AND_FRONTS)

    assert breaches("jupyter_gpubroker.broker", allowed) == {}
    assert "traitlets" in MODULES["jupyter_gpubroker.wire.traits"]


def test_the_wire_types_import_nothing_else_of_the_package() -> None:
    def allowed(name: str) -> bool:
        return not under(name, *PACKAGES) or under(name, "jupyter_gpubroker.wire")

    assert breaches("jupyter_gpubroker.wire", allowed) == {}


def test_the_api_layer_loads_without_runtime_or_a_host() -> None:
    """``api/`` takes a running broker as an argument; it imports no runtime, host,
    front or backend."""
    refused = (
        "jupyter_gpubroker.runtime",
        "jupyter_gpubroker.server",
        "jupyter_gpubroker.kernel",
        "jupyter_gpubroker.cli",
        "jupyter_gpubroker.client",
        "jupyter_gpubroker.nvml",
        "jupyter_gpubroker.engines",
        "hub_spawner",
        *HOSTS_AND_FRONTS,
    )
    assert breaches("jupyter_gpubroker.api", lambda name: not under(name, *refused)) == {}


def test_the_event_bus_imports_no_api_runtime_or_host() -> None:
    """``api/`` and the runtime import the bus (``events``), never the reverse: the
    envelope of its messages is its own, so the layers form no cycle."""
    refused = ("jupyter_gpubroker.api", "jupyter_gpubroker.runtime", *HOSTS_AND_FRONTS)
    assert "jupyter_gpubroker.broker.core" in MODULES["jupyter_gpubroker.events"]
    assert breaches("jupyter_gpubroker.events", lambda name: not under(name, *refused)) == {}


def test_the_shared_handlers_import_tornado_but_no_host() -> None:
    """The API's handlers, bound by both hosts, import neither host's framework."""
    refused = ("jupyter_server", "jupyterhub", "hub_spawner")
    assert breaches("jupyter_gpubroker.server.handlers", lambda n: not under(n, *refused)) == {}


def test_the_event_bus_imports_no_api_module() -> None:
    """DESIGN: the bus is imported by ``api/`` and the runtime, and imports neither: the
    envelope it sends is its own, not one of the API layer's shapes."""
    assert "jupyter_gpubroker.broker.core" in MODULES["jupyter_gpubroker.events"]
    refused = ("jupyter_gpubroker.api", "jupyter_gpubroker.runtime")
    assert breaches("jupyter_gpubroker.events", lambda name: not under(name, *refused)) == {}


def test_the_running_broker_knows_its_inventory_only_by_the_one_contract() -> None:
    """``GPUBroker`` is built from what ``inventory_class(...).open()`` returns
    (``inventory.OpenInventory``, the same shape from every source): it imports neither
    NVML's modules nor the engines', so it cannot branch on which source it has."""
    gpubroker = "jupyter_gpubroker.runtime.gpubroker"
    assert "jupyter_gpubroker.inventory" in MODULES[gpubroker]
    refused = ("jupyter_gpubroker.nvml", "jupyter_gpubroker.engines")
    assert breaches(gpubroker, lambda name: not under(name, *refused)) == {}


def test_every_inventory_class_implements_the_one_contract() -> None:
    """Every class ``c.GPUBroker.inventory_source`` names derives from the contract's
    ``BaseInventory``; the contract imports none of them, and neither it nor they import
    the running broker (they serve it; it uses them through the contract)."""
    from jupyter_gpubroker.inventory import BaseInventory
    from jupyter_gpubroker.runtime.inventory import source_class, source_names

    assert {name: issubclass(source_class(name), BaseInventory) for name in source_names()} == {
        name: True for name in ("nvml", "kubernetes", "slurm")
    }
    sources = ("jupyter_gpubroker.nvml", "jupyter_gpubroker.engines")
    contract = "jupyter_gpubroker.inventory"
    assert breaches(contract, lambda name: not under(name, *sources)) == {}
    hosts = ("jupyter_gpubroker.runtime", "jupyter_gpubroker.server", "hub_spawner")
    for layer in (contract, *sources):
        assert breaches(layer, lambda name: not under(name, *hosts)) == {}


def front_imports_only_wire(name: str) -> bool:
    return not under(name, "jupyter_gpubroker.broker")


@pytest.mark.parametrize(
    "front",
    [
        "jupyter_gpubroker.kernel",
        "jupyter_gpubroker.client",
        "hub_spawner",
        "jupyter_gpubroker.cli",
    ],
)
def test_a_front_imports_no_core_module(front: str) -> None:
    """The kernel side, the client, the hub's modules and the CLI share only the wire
    types with the core (the CLI's offline reads go through ``offline``, a host)."""
    assert any(under(m, front) for m in MODULES)
    assert breaches(front, front_imports_only_wire) == {}


def loaded_by(statement: str) -> list[str]:
    """The modules a fresh interpreter holds after ``statement``."""
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def test_a_hub_that_imports_the_spawner_loads_no_broker() -> None:
    """The JupyterHub process runs the spawner only: it loads neither the core, the
    NVML backends, the replay nor a running broker."""
    loaded = loaded_by("import hub_spawner.spawner")
    assert "hub_spawner.spawner" in loaded
    heavy = (
        "jupyter_gpubroker.broker",
        "jupyter_gpubroker.nvml",
        "jupyter_gpubroker.replay",
        "jupyter_gpubroker.runtime",
        "pynvml",
    )
    assert [m for m in loaded if under(m, *heavy)] == []


def test_the_hub_service_loads_no_jupyter_server() -> None:
    loaded = loaded_by("import hub_spawner.service")
    assert "jupyter_gpubroker.server.handlers" in loaded
    assert [m for m in loaded if under(m, "jupyter_server")] == []


def test_the_api_rules_load_without_a_running_broker() -> None:
    loaded = loaded_by("import jupyter_gpubroker.api.rules")
    assert "jupyter_gpubroker.events" in loaded
    refused = ("jupyter_gpubroker.runtime", "jupyter_gpubroker.nvml", "tornado")
    assert [m for m in loaded if under(m, *refused)] == []


MAX_LINES = 600
LONGER_ALLOWED = {
    "jupyter_gpubroker/nvml/simulated.py",  # mirrors the whole NVML surface it stands in for
}


def test_no_module_is_longer_than_600_lines() -> None:
    """A module past 600 lines holds more than one job (issue 29): split it."""
    lines = {
        p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines())
        for package in PACKAGES
        for p in (ROOT / package).rglob("*.py")
        if "labextension" not in p.parts
    }
    assert lines["jupyter_gpubroker/broker/core.py"] > 0  # the walk reads the package
    longer = {path: n for path, n in lines.items() if n > MAX_LINES}
    assert {path: n for path, n in longer.items() if path not in LONGER_ALLOWED} == {}


MAX_COMPLEXITY = 20
"""The top of radon's grade C: a function more complex holds more than one job (issue 45)."""


def test_no_function_is_more_complex_than_radon_grade_c() -> None:
    """Each function's and method's cyclomatic complexity, as radon counts it (``radon cc``
    shows the same figures), is at most 20."""
    complexity = {
        f"{p.relative_to(ROOT).as_posix()}:{block.fullname}": block.complexity
        for package in PACKAGES
        for p in sorted((ROOT / package).rglob("*.py"))
        if "labextension" not in p.parts
        for block in cc_visit(p.read_text())
        if hasattr(block, "is_method")  # functions and methods; a class sums its own
    }
    assert complexity["jupyter_gpubroker/broker/eta.py:list_schedule"] > 1  # the walk counts
    assert {name: n for name, n in complexity.items() if n > MAX_COMPLEXITY} == {}
