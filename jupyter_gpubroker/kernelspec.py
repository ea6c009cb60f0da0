"""GPU kernelspecs: "Python 3 (GPU 1g.10gb)", "Python 3 (8 GB of a shared GPU)", started
through ``gpubroker-provisioner``.

Their kernels load the ``%gpu`` magic at start (IPython's ``--ext``), so the notebook
can show its lease and ask for more without a ``%load_ext``.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

from jupyter_client.kernelspec import KernelSpecManager

from .wire.sizes import Size
from .wire.text import size_text


def spec_for(size: Size | None, job_class: str = "interactive") -> tuple[str, dict[str, object]]:
    """(kernel name, kernel.json) for a kernel that waits for ``size`` before it starts;
    ``None``: one that starts at once with no GPU and asks with ``%gpu request``."""
    if size is None:
        config: dict[str, object] = {"on_demand": True}
        label, slug = "GPU on demand", "on-demand"
    elif size.gpus is not None:  # "1 GPU", not "GPU 1 GPU"
        config, label, slug = {"gpus": size.gpus}, size_text(size.to_json()), f"{size.gpus}gpu"
    elif size.profile is not None:
        config, label, slug = {"gpu": size.profile}, f"GPU {size.profile}", size.profile
    elif size.share_gb is not None:
        config = {"share_gb": size.share_gb}
        label, slug = f"{size.share_gb:g} GB of a shared GPU", f"share-{size.share_gb:g}gb"
        if size.compute_percent is not None:
            config["compute_percent"] = size.compute_percent
            label += f", {size.compute_percent}% of its compute"
            slug += f"-{size.compute_percent}pct"
    else:
        config = {"min_memory_gb": size.min_memory_gb}
        label, slug = f"GPU of {size_text(size.to_json())}", f"{size.min_memory_gb:g}GB"
    if job_class != "interactive":
        config["job_class"] = job_class
        label, slug = f"{label}, {job_class}", f"{slug}-{job_class}"
    name = "python3-gpu-" + re.sub(r"[^a-z0-9._-]", "-", slug.lower())
    spec: dict[str, object] = {
        "argv": [
            sys.executable,
            "-m",
            "ipykernel_launcher",
            "-f",
            "{connection_file}",
            "--ext",
            "jupyter_gpubroker",
        ],
        "display_name": f"Python 3 ({label})",
        "language": "python",
        "metadata": {
            "kernel_provisioner": {"provisioner_name": "gpubroker-provisioner", "config": config}
        },
    }
    return name, spec


def install(
    size: Size | None,
    job_class: str = "interactive",
    *,
    name: str | None = None,
    display_name: str | None = None,
    user: bool = False,
    prefix: str | None = None,
) -> str:
    """Install the kernelspec; returns the directory it was written to."""
    default_name, spec = spec_for(size, job_class)
    if display_name:
        spec["display_name"] = display_name
    # here, not at the top: ipykernel 6.25 (the lowest allowed) imports IPython with it,
    # seconds that every CLI command would pay at its start
    from ipykernel.kernelspec import RESOURCES

    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(RESOURCES, tmp, dirs_exist_ok=True)  # the launcher's Python logo
        (Path(tmp) / "kernel.json").write_text(json.dumps(spec, indent=1))
        return str(
            KernelSpecManager().install_kernel_spec(
                tmp, name or default_name, user=user, prefix=prefix
            )
        )
