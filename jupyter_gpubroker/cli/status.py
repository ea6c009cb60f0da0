"""``jupyter gpubroker status``: the GPUs and slices, their load and holders.

From the running broker's API when there is one; else from NVML (or a simulated machine)
and the state file, opened read-only.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from ..client import URL_ENV, BrokerAPIError
from ..paths import STATE_FILE_ENV, default_state_path
from ..wire.text import devices_held, idle_reclaim_text, sentence
from .common import ask_broker, connection_args, table


def add_status(p: argparse.ArgumentParser) -> None:
    from ..nvml.backend import SIMULATE_ENV

    p.description = (
        "Show every GPU and MIG slice, its live load and the lease holding it: "
        "as the running Jupyter server's broker sees them (or the broker at --url), else as "
        "NVML (or --simulate) and the broker's state file (--state) say."
    )
    connection_args(p)
    p.add_argument(
        "--simulate",
        metavar="TOPOLOGY",
        default=None,
        help=f"a simulated machine: a preset (e.g. dgx-h100-mig, dgx-h100-mig:64) or a "
        f"topology file; default ${SIMULATE_ENV}, else the real driver",
    )
    p.add_argument(
        "--state",
        type=Path,
        default=None,
        help=f"the broker's state file (default ${STATE_FILE_ENV}, else {default_state_path()})",
    )
    p.set_defaults(func=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    """The running broker's view when there is one (or --url names one), else the local
    hardware's and the state file's."""
    report = None
    if args.state is None and args.simulate is None:
        found = ask_broker(args, lambda client: client.call("GET", "devices"))
        if found is not None:
            report = {"source": found[1], **found[0]}
    if report is None:
        report = _local_report(args)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render_status(report))
    return 0


def _local_report(args: argparse.Namespace) -> dict[str, Any]:
    """What NVML (or the simulated machine) and the state file say, read-only."""
    import pynvml

    from ..api.shapes import devices_json
    from ..nvml import NvmlUnavailable, open_backend, seed_for
    from ..offline import state_view
    from ..wire.errors import InvalidRequest

    state = args.state or Path(os.environ.get(STATE_FILE_ENV) or default_state_path())
    if args.state is not None and not state.exists():
        raise InvalidRequest(
            f"{state}: no such state file; check --state (a broker creates it when it first starts)"
        )
    try:
        backend = open_backend(args.simulate, seed=seed_for(str(state)))
    except NvmlUnavailable:
        if args.state is not None:
            raise
        raise BrokerAPIError(
            0,
            "no_server",
            "no running Jupyter server found, and this machine has no NVIDIA driver: "
            f"start a server, pass --url (or set {URL_ENV}), or look at a simulated "
            "machine with --simulate dgx-h100-mig",
        ) from None
    with backend:
        inventory = backend.inventory()
        readings = backend.read_all(inventory)
        source = (
            f"simulated: {backend.simulator.topology.name}"
            if backend.simulator
            else f"NVIDIA driver {pynvml.nvmlSystemGetDriverVersion()}"
        )
    holders, drains, causes = state_view(state)
    return {
        "source": source,
        "state": str(state) if state.exists() else None,
        "gpus": devices_json(inventory, readings, holders, drains=drains, causes=causes),
    }


def render_status(report: dict[str, Any]) -> str:
    rows = [("DEVICE", "MODEL / PROFILE", "MEMORY", "UTIL", "TEMP", "POWER", "HOLDER", "UUID")]
    for g in report["gpus"]:
        rows += _gpu_rows(g)
    return "\n".join([table(rows), "", *_summary_lines(report)])


Row = tuple[str, str, str, str, str, str, str, str]
"""One line of the status table, a text per column."""


def _gpu_rows(g: dict[str, Any]) -> list[Row]:
    """One GPU's rows: its own, with its holder (or its shared room), then one per share
    or MIG slice it holds."""
    from ..wire.text import memory

    rows: list[Row] = [
        (
            _gpu_label(g),
            f"{g['name']}" + (" [MIG]" if g["mig_enabled"] else ""),
            memory(g["memory_mib"]),
            _pct(g.get("utilization_gpu")),
            _num(g.get("temperature_c"), "C"),
            _num(g.get("power_w"), "W"),
            _gpu_state(g),
            g["uuid"],
        )
    ]
    sharing = g.get("sharing")
    for d in g["devices"]:
        if d["kind"] == "gpu" and sharing and sharing["mode"] != "whole":
            rows[-1] = (*rows[-1][:6], f"shared, {memory(sharing['room_mib'])} free", g["uuid"])
            rows += [_share_row(d, x) for x in sharing["shares"]]
            continue
        if d["kind"] == "gpu":
            rows[-1] = (*rows[-1][:6], _holder_text(d), g["uuid"])
            continue
        rows.append(
            (
                f"  {d['label'].split(' / ')[1]}",
                d["profile"],
                memory(d["memory_mib"]),
                _pct(d.get("utilization_gpu")),
                "",
                "",
                _holder_text(d),
                d["uuid"],
            )
        )
    return rows


def _share_row(d: dict[str, Any], x: dict[str, Any]) -> Row:
    """The row of one share ``x`` of the shared GPU ``d``: its memory used and granted,
    its holder."""
    from ..wire.text import memory

    used = "" if x.get("used_mib") is None else f"{memory(x['used_mib'])} used"
    return (
        "  share",
        used,
        memory(x["memory_mib"]),
        _pct(x.get("utilization")),
        "",
        "",
        _holder_text({**d, "holder": x}),
        "",
    )


def _summary_lines(report: dict[str, Any]) -> list[str]:
    """The lines under the table: the counts, each shared GPU's holds, idle reclaim, and
    an engine the broker cannot reach."""
    n_dev = sum(len(g["devices"]) for g in report["gpus"])
    drained = sum(1 for g in report["gpus"] for d in g["devices"] if d.get("drained"))
    lines = [
        f"{len(report['gpus'])} GPUs, {n_dev} grantable devices, {drained} drained; held: "
        f"{devices_held(_held(report['gpus']))} ({_read_from(report)}); utilization '-' = "
        "not known there (a MIG slice, a share NVML gives no per-process use of)"
    ]
    holds = sorted(
        {
            f"{_gpu_label(g)}: {g['sharing']['text']}"
            for g in report["gpus"]
            if (g.get("sharing") or {}).get("mode", "whole") != "whole"
        }
    )
    lines += holds
    lines += idle_reclaim_lines(report["gpus"])
    engine = report.get("engine")
    if engine and not engine["reachable"]:
        lines.append(
            f"{engine['error']} since {engine['since']}: the broker keeps its queue and its "
            f"last view of the cluster"
        )
    return lines


def _held(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What leases hold: each device with a holder, each share of a shared GPU."""
    held = [d for g in gpus for d in g["devices"] if d["holder"]]
    shares = [x for g in gpus for x in (g.get("sharing") or {}).get("shares", [])]
    return held + [{"kind": "share", "memory_mib": x["memory_mib"]} for x in shares]


SHOWN_LABELS = 6
"""Devices named on an idle reclaim line before the rest are counted."""


def idle_reclaim_lines(gpus: list[dict[str, Any]]) -> list[str]:
    """What idle reclaim does on which devices, and why, one line per answer (none where
    no broker runs)."""
    found: dict[tuple[str, str], list[str]] = {}
    for g in gpus:
        for d in g["devices"]:
            said = d.get("idle_reclaim")
            if said is not None:
                found.setdefault((said["action"], said["reason"]), []).append(d["label"])
    lines = []
    for (action, reason), labels in found.items():
        named = ", ".join(labels[:SHOWN_LABELS])
        if len(labels) > SHOWN_LABELS:
            named += f" and {len(labels) - SHOWN_LABELS} more"
        lines.append(sentence(idle_reclaim_text(action, reason, f"on {named}")))
    return lines


def _gpu_label(g: dict[str, Any]) -> str:
    """``GPU 3``, on a cluster with its node (``gpu-a GPU 3``), as its devices' labels say."""
    label = str(g["devices"][0].get("label", "")) if g["devices"] else ""
    return label.split(" / ")[0] or f"GPU {g['index']}"


def _read_from(report: dict[str, Any]) -> str:
    """Where the report comes from: a running broker, or the hardware and a state file."""
    if "state" not in report:
        return str(report["source"])
    state = report["state"]
    return f"{report['source']}; no broker running; " + (
        f"holders from {state}" if state else "no state file yet"
    )


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}%"


def _num(v: float | None, unit: str) -> str:
    return "-" if v is None else f"{v:.0f}{unit}"


def _gpu_state(g: dict[str, Any]) -> str:
    """A GPU row's last column but one: its trouble, if any."""
    if g.get("drained"):
        return f"DRAINED: {g['drained']['reason']}"
    return "" if g.get("health", "ok") == "ok" else g["health"].upper()


def _holder_text(d: dict[str, Any]) -> str:
    holder = d["holder"]
    if holder is None:
        text = "free"
    else:  # another user's lease, seen through a broker's API, shows no id
        text = holder["user"] + (f" ({holder['lease_id']})" if holder["lease_id"] else "")
    return f"{text}, drained" if d.get("drained") else text
