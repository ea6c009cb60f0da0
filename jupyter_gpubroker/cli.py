"""``jupyter gpubroker``: the broker from a terminal.

The CLI prints; the library returns. Exit codes: 0 success, 1 the broker or
the hardware refused (e.g. no driver), 2 bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pynvml

from . import kernelspec
from .api import API_PREFIX
from .api.shapes import devices_json
from .broker.errors import BrokerError
from .broker.models import Lease, Size
from .broker.store import Store
from .client import TOKEN_ENV, URL_ENV, BrokerAPIError, BrokerClient, GrantTimeout
from .nvml import SIMULATE_ENV, NvmlUnavailable, TopologyError, open_backend
from .paths import STATE_FILE_ENV, default_state_path
from .replay.cli import add_replay_command
from .usage_cli import add_usage_command


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except (NvmlUnavailable, TopologyError, BrokerError, BrokerAPIError, GrantTimeout) as e:
        print(f"error: {getattr(e, 'message', None) or e}", file=sys.stderr)
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
    _add_broker_commands(sub)
    add_replay_command(sub)
    add_usage_command(sub)
    return parser


def _add_broker_commands(sub: Any) -> None:
    """Commands that talk to a running broker through its API."""

    def connected(name: str, **kw: Any) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, **kw)
        p.add_argument(
            "--url",
            default=None,
            help=f"the broker API URL (default ${URL_ENV}, else that of the running "
            "Jupyter server)",
        )
        p.add_argument("--token", default=None, help="a Jupyter token (default: the server's)")
        p.add_argument("--json", action="store_true", help="print JSON")
        return p

    queue = connected("queue", help="show the waiting requests, their positions and ETAs")
    queue.set_defaults(func=cmd_queue)

    def sized(p: argparse.ArgumentParser) -> None:
        p.add_argument("size", help="a MIG profile (1g.10gb), a GPU count (2) or memory (20GB)")
        p.add_argument(
            "--class", dest="job_class", default="interactive", choices=["interactive", "batch"]
        )

    request = connected(
        "request",
        help="ask for a GPU or MIG slice and print the grant",
        description="Submit a request and (by default) wait for the grant. The lease expires "
        "unless renewed within its TTL: use 'renew', or 'run' for a command.",
    )
    sized(request)
    request.add_argument("--no-wait", action="store_true", help="return once queued")
    request.add_argument("--timeout", type=float, default=600.0, help="seconds to wait")
    request.set_defaults(func=cmd_request)

    renew = connected("renew", help="renew a lease (a heartbeat)")
    renew.add_argument("lease_id")
    renew.set_defaults(func=cmd_renew)

    release = connected("release", help="release a lease or withdraw a request")
    release.add_argument("id", help="a lease id (l-...) or request id (r-...)")
    release.set_defaults(func=cmd_release)

    run = connected(
        "run",
        help="run a command on a granted GPU, renewing the lease while it runs",
        description="Wait for a grant, run COMMAND with CUDA_VISIBLE_DEVICES set, renew the "
        "lease while it runs, release it when it ends. Exits with the command's status.",
    )
    sized(run)
    run.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for a grant")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    run.set_defaults(func=cmd_run)

    kernelspec = sub.add_parser("kernelspec", help="install GPU kernelspecs")
    ks_sub = kernelspec.add_subparsers(metavar="ACTION")
    install = ks_sub.add_parser(
        "install",
        help="install a kernelspec whose kernels start on a granted GPU",
        description="Install e.g. 'Python 3 (GPU 1g.10gb)': its kernels queue for the size "
        "given and start with the device attached.",
    )
    what = install.add_mutually_exclusive_group(required=True)
    what.add_argument("--gpu", metavar="PROFILE", help="a MIG profile, e.g. 1g.10gb")
    what.add_argument("--gpus", type=int, help="a number of whole GPUs")
    what.add_argument("--min-memory", type=float, metavar="GB", help="any device this large")
    what.add_argument(
        "--on-demand",
        action="store_true",
        help="no GPU at start: the notebook asks with %%gpu request",
    )
    install.add_argument(
        "--class", dest="job_class", default="interactive", choices=["interactive", "batch"]
    )
    install.add_argument("--name", help="kernelspec name (default python3-gpu-<size>)")
    install.add_argument("--display-name", help="name shown in the launcher")
    where = install.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for this user only")
    where.add_argument("--prefix", help="install under this prefix")
    where.add_argument("--sys-prefix", action="store_true", help="install into sys.prefix")
    install.set_defaults(func=cmd_kernelspec_install)

    demo = sub.add_parser(
        "demo",
        help="start JupyterLab on a simulated GPU machine with the broker and GPU kernels",
        description="Start JupyterLab with the embedded broker on a simulated machine, in a "
        "temporary directory holding the GPU kernelspecs, the state file and a copy of the "
        "tour, which it opens. Ctrl-C or SIGTERM stops it and removes that directory.",
    )
    demo.add_argument(
        "--simulate",
        default="dgx-h100-mig",
        metavar="TOPOLOGY",
        help="the simulated machine (default dgx-h100-mig)",
    )
    demo.add_argument("--port", type=int, default=8888)
    demo.add_argument("--no-browser", action="store_true")
    demo.add_argument(
        "--server", action="store_true", help="start a plain jupyter server instead of JupyterLab"
    )
    demo.set_defaults(func=cmd_demo)


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
    holders, drains = _state_view(state)
    report = {
        "source": source,
        "gpus": devices_json(inventory, readings, holders, drains=drains),
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render_status(report))
    return 0


def _state_view(state: Path) -> tuple[dict[str, Lease], dict[str, tuple[str, float]]]:
    """Device uuid -> active lease, and drained uuid -> (reason, since), from the state
    file (none when there is no file yet)."""
    if not state.exists():
        return {}, {}
    store = Store(state)
    try:
        holders = {d: lease for lease, _ in store.active_leases() for d in lease.devices}
        return holders, store.drains()
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
                _gpu_state(g),
                g["uuid"],
            )
        )
        for d in g["devices"]:
            if d["kind"] == "gpu":
                rows[-1] = (*rows[-1][:6], _holder_text(d), g["uuid"])
                continue
            rows.append(
                (
                    f"  {d['label'].split(' / ')[1]}",
                    d["profile"],
                    f"{d['memory_mib'] / 1024:.1f} GiB",
                    _pct(d.get("utilization_gpu")),
                    "",
                    "",
                    _holder_text(d),
                    d["uuid"],
                )
            )
    lines = [_table(rows)]
    n_dev = sum(len(g["devices"]) for g in report["gpus"])
    held = sum(1 for g in report["gpus"] for d in g["devices"] if d["holder"])
    drained = sum(1 for g in report["gpus"] for d in g["devices"] if d.get("drained"))
    lines.append("")
    lines.append(
        f"{len(report['gpus'])} GPUs, {n_dev} grantable devices, {held} held, {drained} drained "
        f"({report['source']}); utilization '-' = not supported there (MIG)"
    )
    return "\n".join(lines)


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
    text = "free" if holder is None else f"{holder['user']} ({holder['lease_id']})"
    return f"{text}, drained" if d.get("drained") else text


# ------------------------------------------------------------ broker commands


def _client(args: argparse.Namespace) -> BrokerClient:
    """A client for --url/--token, $GPUBROKER_URL (+ $GPUBROKER_TOKEN inside a GPU kernel),
    or else the first running Jupyter server."""
    url = args.url or os.environ.get(URL_ENV)
    if url:
        return BrokerClient(url, token=args.token or "", broker_token=os.environ.get(TOKEN_ENV, ""))
    from jupyter_server.serverapp import list_running_servers

    for server in list_running_servers():
        return BrokerClient(
            server["url"].rstrip("/") + "/" + API_PREFIX,
            token=args.token or server.get("token", ""),
        )
    raise BrokerAPIError(
        0, "no_server", f"no running Jupyter server found: start one, or pass --url / set {URL_ENV}"
    )


def _print(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=2) if args.json else text)


def cmd_queue(args: argparse.Namespace) -> int:
    queue = asyncio.run(_client(args).queue())
    rows = [("POS", "USER", "SIZE", "CLASS", "SUBMITTED", "ETA")]
    for e in queue:
        size = e.get("profile") or (
            f"{e['gpus']} GPU" if e.get("gpus") else f">={e['min_memory_gb']}GB"
        )
        rows.append(
            (
                str(e["position"]),
                e["user"],
                size,
                e["job_class"],
                e["submitted_at"][11:19],
                (e["eta"] or "-")[11:19] or "-",
            )
        )
    _print(args, queue, _table(rows) + f"\n{len(queue)} waiting")
    return 0


def _size_fields(text: str) -> dict[str, Any]:
    return Size.parse(text).to_json()


def cmd_request(args: argparse.Namespace) -> int:
    async def go() -> dict[str, Any]:
        client = _client(args)
        r = await client.submit(**_size_fields(args.size), job_class=args.job_class, owner="cli")
        if r["state"] == "queued" and not args.no_wait:
            print(f"queued at position {r['position']} (request {r['id']})", file=sys.stderr)
            r = await client.wait_for_grant(r["id"], args.timeout)
        return r

    r = asyncio.run(go())
    if r["state"] != "granted":
        _print(args, r, f"request {r['id']} is {r['state']} at position {r['position']}")
        return 0
    lease = r["lease"]
    _print(
        args,
        r,
        f"CUDA_VISIBLE_DEVICES={','.join(lease['devices'])}\n"
        f"GPUBROKER_LEASE_ID={lease['id']}\n"
        f"# renew within {lease['ttl_s']:g} s: jupyter gpubroker renew {lease['id']}",
    )
    return 0


def cmd_renew(args: argparse.Namespace) -> int:
    lease = asyncio.run(_client(args).renew(args.lease_id))
    _print(args, lease, f"lease {lease['id']} expires at {lease['expires_at']}")
    return 0


def cmd_release(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.id.startswith("r-"):
        done = asyncio.run(client.cancel(args.id))
    else:
        done = asyncio.run(client.release(args.id))
    _print(args, done, f"{args.id}: {done['state']}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("error: give the command to run after --", file=sys.stderr)
        return 2
    return asyncio.run(_run(_client(args), args, command))


async def _run(client: BrokerClient, args: argparse.Namespace, command: list[str]) -> int:
    r = await client.submit(**_size_fields(args.size), job_class=args.job_class, owner="cli-run")
    try:
        if r["state"] == "queued":
            print(f"queued at position {r['position']}", file=sys.stderr)
            r = await client.wait_for_grant(r["id"], args.timeout)
        lease = r["lease"]
        devices = ",".join(lease["devices"])
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": devices, "NVIDIA_VISIBLE_DEVICES": devices}
        proc = await asyncio.create_subprocess_exec(*command, env=env)
        while True:
            try:
                return await asyncio.wait_for(proc.wait(), lease["ttl_s"] / 3)
            except asyncio.TimeoutError:
                await client.renew(lease["id"])
    finally:
        with contextlib.suppress(BrokerAPIError):
            await client.cancel(r["id"])


def cmd_kernelspec_install(args: argparse.Namespace) -> int:
    size: Size | None
    if args.on_demand:
        size = None
    elif args.gpu:
        size = Size(profile=args.gpu)
    elif args.gpus is not None:
        size = Size(gpus=args.gpus)
    else:
        size = Size(min_memory_gb=args.min_memory)
    path = kernelspec.install(
        size,
        args.job_class,
        name=args.name,
        display_name=args.display_name,
        user=args.user,
        prefix=sys.prefix if args.sys_prefix else args.prefix,
    )
    print(f"installed {kernelspec.spec_for(size, args.job_class)[1]['display_name']} in {path}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args.simulate, port=args.port, browser=not args.no_browser, lab=not args.server)


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


if __name__ == "__main__":
    sys.exit(main())
