"""``jupyter gpubroker``: the broker from a terminal.

The CLI prints; the library returns. Exit codes: 0 success, 1 the broker or
the hardware refused (e.g. no driver), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pynvml

from .api.shapes import devices_json
from .broker.models import Lease
from .broker.store import Store
from .nvml import SIMULATE_ENV, NvmlUnavailable, TopologyError, open_backend
from .paths import STATE_FILE_ENV, default_state_path


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except (NvmlUnavailable, TopologyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jupyter gpubroker",
        description="A notebook-centric GPU broker: queues, leases and shares GPUs and MIG slices.",
    )
    sub = parser.add_subparsers(metavar="COMMAND")
    status = sub.add_parser(
        "status",
        help="show the GPUs and MIG slices, their load, and who holds them",
        description="Show every GPU and MIG slice NVML reports (or the simulated machine), "
        "its live load, and the lease holding it according to the broker's state file.",
    )
    status.add_argument(
        "--simulate",
        metavar="TOPOLOGY",
        default=None,
        help=f"a simulated machine: a preset (e.g. dgx-h100-mig, dgx-h100-mig:64) or a "
        f"topology file; default ${SIMULATE_ENV}, else the real driver",
    )
    status.add_argument(
        "--state",
        type=Path,
        default=None,
        help=f"the broker's state file (default ${STATE_FILE_ENV}, else {default_state_path()})",
    )
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    status.set_defaults(func=cmd_status)
    return parser


def cmd_status(args: argparse.Namespace) -> int:
    state = args.state or Path(os.environ.get(STATE_FILE_ENV) or default_state_path())
    with open_backend(args.simulate) as backend:
        inventory = backend.inventory()
        readings = backend.read_all(inventory)
        source = (
            f"simulated: {backend.simulator.topology.name}"
            if backend.simulator
            else f"NVIDIA driver {pynvml.nvmlSystemGetDriverVersion()}"
        )
    holders = _holders(state)
    report = {"source": source, "gpus": devices_json(inventory, readings, holders)}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render_status(report))
    return 0


def _holders(state: Path) -> dict[str, Lease]:
    """Device uuid -> active lease, read from the state file without changing it."""
    if not state.exists():
        return {}
    store = Store(state)
    try:
        return {d: lease for lease, _ in store.active_leases() for d in lease.devices}
    finally:
        store.close()


def render_status(report: dict[str, Any]) -> str:
    rows = [("DEVICE", "MODEL / PROFILE", "MEMORY", "UTIL", "TEMP", "POWER", "HOLDER", "UUID")]
    for g in report["gpus"]:
        rows.append(
            (
                f"GPU {g['index']}",
                f"{g['name']}" + (" [MIG]" if g["mig_enabled"] else ""),
                f"{g['memory_mib'] / 1024:.0f} GiB",
                _pct(g.get("utilization_gpu")),
                _num(g.get("temperature_c"), "C"),
                _num(g.get("power_w"), "W"),
                "" if g.get("health", "ok") == "ok" else g["health"].upper(),
                g["uuid"],
            )
        )
        for d in g["devices"]:
            if d["kind"] == "gpu":
                rows[-1] = (*rows[-1][:6], _holder_text(d["holder"]), g["uuid"])
                continue
            rows.append(
                (
                    f"  {d['label'].split(' / ')[1]}",
                    d["profile"],
                    f"{d['memory_mib'] / 1024:.1f} GiB",
                    _pct(d.get("utilization_gpu")),
                    "",
                    "",
                    _holder_text(d["holder"]),
                    d["uuid"],
                )
            )
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]
    n_dev = sum(len(g["devices"]) for g in report["gpus"])
    held = sum(1 for g in report["gpus"] for d in g["devices"] if d["holder"])
    lines.append("")
    lines.append(
        f"{len(report['gpus'])} GPUs, {n_dev} grantable devices, {held} held "
        f"({report['source']}); utilization '-' = not supported there (MIG)"
    )
    return "\n".join(lines)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}%"


def _num(v: float | None, unit: str) -> str:
    return "-" if v is None else f"{v:.0f}{unit}"


def _holder_text(holder: dict[str, Any] | None) -> str:
    return "free" if holder is None else f"{holder['user']} ({holder['lease_id']})"


if __name__ == "__main__":
    sys.exit(main())
