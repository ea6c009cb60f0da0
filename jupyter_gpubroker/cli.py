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
import re
import signal
import sys
from asyncio.subprocess import Process
from collections.abc import Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pynvml

from . import kernelspec
from .api import API_PREFIX
from .api.shapes import devices_json
from .broker.errors import BrokerError, InvalidRequest
from .broker.models import Lease, Size
from .broker.store import Store
from .broker.text import memory
from .client import (
    HUB_TOKEN_ENV,
    JUPYTER_TOKEN_ENV,
    RETRY_ENV,
    RETRY_FOR_S,
    TOKEN_ENV,
    URL_ENV,
    BrokerAPIError,
    BrokerClient,
    GrantTimeout,
    eta_text,
    keep_alive,
    user_token_from_env,
)
from .nvml import SIMULATE_ENV, NvmlUnavailable, TopologyError, open_backend, seed_for
from .paths import STATE_FILE_ENV, default_state_path
from .replay.cli import add_replay_command
from .usage_cli import add_usage_command

STOP_GRACE_S = 5.0
"""Seconds ``run`` gives its command after SIGTERM before it kills it."""
T = TypeVar("T")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["service"]:  # its options are traitlets' (--GPUBroker.x=...), not ours
        try:
            from hub_spawner.service import main as service_main
        except ModuleNotFoundError as e:
            if (e.name or "").split(".")[0] not in ("jupyterhub", "jinja2"):
                raise
            print(
                "jupyter gpubroker service runs under JupyterHub, which is not installed: "
                "pip install 'jupyter-gpubroker[hub]'",
                file=sys.stderr,
            )
            return 2
        return service_main(argv[1:])
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        print(f"interrupted{getattr(args, 'withdrawn', '')}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `status --json | head`: the reader left; say nothing
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except BrokerAPIError as e:
        print(f"error: {_api_error_text(args, e)}", file=sys.stderr)
        return 1
    except GrantTimeout as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (NvmlUnavailable, TopologyError, BrokerError) as e:
        print(f"error: {getattr(e, 'message', None) or e}", file=sys.stderr)
        return 1
    except OSError as e:  # the network (connection refused, unknown host) or a local file
        url = getattr(args, "broker_url", "")
        if url:
            print(f"error: {_unreachable(url, e.strerror or str(e))}", file=sys.stderr)
        else:
            print(f"error: {e}", file=sys.stderr)
        return 1


def _unreachable(url: str, why: str) -> str:
    return (
        f"could not reach the GPU broker at {url} ({why}): check --url (or ${URL_ENV}) "
        "and that the Jupyter server is running"
    )


def _api_error_text(args: argparse.Namespace, e: BrokerAPIError) -> str:
    """What an API error means for the person at the terminal. Errors the broker raised
    carry their own sentence; those of the web server in front of it (code ``http_<n>``,
    or a body not from the broker) say what to check."""
    url = getattr(args, "broker_url", "") or "the broker"
    from_server = e.code in ("error", f"http_{e.status}")
    if e.status == 599:
        return _unreachable(url, e.message)
    if from_server and e.status in (401, 403):
        if "/services/" in url:  # the hub's service: a hub token, never a kernel's
            return (
                f"the broker at {url} refused the token: pass --token or set "
                f"${HUB_TOKEN_ENV} to a hub API token of yours (the hub's Token page)"
            )
        return (
            f"the broker at {url} refused the token: check --token or ${JUPYTER_TOKEN_ENV}, or "
            "the Jupyter server's token (jupyter server list)"
        )
    if from_server and e.status == 404:
        return f"no GPU broker at {url}: check --url (it ends in /{API_PREFIX})"
    return e.message


class _Parser(argparse.ArgumentParser):
    """Reads ``-5GB`` as a (bad) size to explain, not as an unknown option."""

    def _parse_optional(self, arg_string: str) -> Any:
        if re.match(r"-\d", arg_string):
            return None
        return super()._parse_optional(arg_string)


def _seconds(text: str) -> float:
    """A ``--timeout``: a number of seconds above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, not {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="jupyter gpubroker",
        description="A notebook-centric GPU broker: queues, leases and shares GPUs and MIG slices.",
    )
    sub = parser.add_subparsers(metavar="COMMAND")
    status = sub.add_parser(
        "status",
        help="show the GPUs and MIG slices, their load, and who holds them",
        description="Show every GPU and MIG slice, its live load and the lease holding it: "
        "as the running Jupyter server's broker sees them (or the broker at --url), else as "
        "NVML (or --simulate) and the broker's state file (--state) say.",
    )
    _connection_args(status)
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
    status.set_defaults(func=cmd_status)
    _add_broker_commands(sub)
    add_replay_command(sub)
    add_usage_command(sub)
    return parser


def _connection_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        default=None,
        help=f"the broker API URL, ending in /{API_PREFIX} (default ${URL_ENV}, else that of "
        "the running Jupyter server)",
    )
    p.add_argument(
        "--token",
        default=None,
        help="a Jupyter or JupyterHub token (default: the server's; with --url or "
        "$GPUBROKER_URL, $GPUBROKER_JUPYTER_TOKEN else $JUPYTERHUB_API_TOKEN)",
    )
    p.add_argument(
        "--retry-for",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"how long to keep trying a broker that does not answer, e.g. a hub service "
        f"restarting (default ${RETRY_ENV}, else {RETRY_FOR_S:g})",
    )
    p.add_argument("--json", action="store_true", help="print JSON")


def _add_broker_commands(sub: Any) -> None:
    """Commands that talk to a running broker through its API."""

    def connected(name: str, **kw: Any) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, **kw)
        _connection_args(p)
        return p

    queue = connected(
        "queue",
        help="show the waiting requests, their positions and ETAs",
        description="List the requests waiting for a GPU, in the order the broker will "
        "grant them, with each one's size, class, submission time and estimated grant time.",
    )
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
    request.add_argument(
        "--timeout",
        type=_seconds,
        default=600.0,
        help="seconds to wait; then the request is withdrawn",
    )
    request.set_defaults(func=cmd_request)

    renew = connected(
        "renew",
        help="renew a lease or a waiting request (a heartbeat)",
        description="Renew a lease (l-...) or a queued request (r-..., e.g. one made with "
        "'request --no-wait') for another TTL. A lease or request nobody renews expires: the "
        "GPU goes to the next request, and a waiting request leaves the queue.",
    )
    renew.add_argument("id", help="a lease id (l-...) or request id (r-...)")
    renew.set_defaults(func=cmd_renew)

    release = connected(
        "release",
        help="release a lease or withdraw a request",
        description="Give a lease's GPU back (l-...) or withdraw a request (r-...), queued "
        "or granted; the next request in the queue is granted at once.",
    )
    release.add_argument("id", help="a lease id (l-...) or request id (r-...)")
    release.add_argument(
        "--reason", default=None, help="why (an admin withdrawing another user's request)"
    )
    release.set_defaults(func=cmd_release)

    run = connected(
        "run",
        help="run a command on a granted GPU, renewing the lease while it runs",
        description="Wait for a grant, run COMMAND with CUDA_VISIBLE_DEVICES set, renew the "
        "lease while it runs, release it when it ends. Exits with the command's status. If "
        "the lease is lost (ended by the broker, or not renewable within its TTL) the "
        "command is stopped (SIGTERM, then SIGKILL).",
    )
    sized(run)
    run.add_argument("--timeout", type=_seconds, default=600.0, help="seconds to wait for a grant")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    run.set_defaults(func=cmd_run)

    _add_admin_commands(connected)

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

    sub.add_parser(  # run by main() itself: listed here for --help
        "service",
        help="run the broker as a JupyterHub service (started by the hub: "
        "'jupyter gpubroker service --help-all' lists its options)",
    )


def cmd_status(args: argparse.Namespace) -> int:
    """The running broker's view when there is one (or --url names one), else the local
    hardware's and the state file's."""
    report = None
    if args.state is None and args.simulate is None:
        report = _broker_report(args)
    if report is None:
        try:
            report = _local_report(args)
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
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render_status(report))
    return 0


def _broker_report(args: argparse.Namespace) -> dict[str, Any] | None:
    """The devices as the broker at --url ($GPUBROKER_URL) sees them, or else that of the
    first running Jupyter server whose broker answers; None when no server runs one."""
    if args.url or os.environ.get(URL_ENV):
        client = _client(args)
        return {
            "source": f"broker at {args.broker_url}",
            **asyncio.run(client.call("GET", "devices")),
        }
    not_started: BrokerAPIError | None = None
    for client in _server_clients(args.token):
        try:
            gpus = asyncio.run(client.devices())
        except BrokerAPIError as e:  # no extension there (404), or its broker did not start
            if e.status == 503 and not_started is None:
                not_started, args.broker_url = e, client.url.rstrip("/")
            continue
        except OSError:  # a server that left its file behind
            continue
        url = client.url.rstrip("/")
        return {"source": f"broker of the Jupyter server at {url}", "gpus": gpus}
    if not_started is not None:  # a server runs, but its broker could not start: say why
        raise not_started
    return None


def _local_report(args: argparse.Namespace) -> dict[str, Any]:
    state = args.state or Path(os.environ.get(STATE_FILE_ENV) or default_state_path())
    if args.state is not None and not state.exists():
        raise InvalidRequest(
            f"{state}: no such state file; check --state (a broker creates it when it first starts)"
        )
    with open_backend(args.simulate, seed=seed_for(str(state))) as backend:
        inventory = backend.inventory()
        readings = backend.read_all(inventory)
        source = (
            f"simulated: {backend.simulator.topology.name}"
            if backend.simulator
            else f"NVIDIA driver {pynvml.nvmlSystemGetDriverVersion()}"
        )
    holders, drains, causes = _state_view(state)
    return {
        "source": source,
        "state": str(state) if state.exists() else None,
        "gpus": devices_json(inventory, readings, holders, drains=drains, causes=causes),
    }


def _state_view(
    state: Path,
) -> tuple[dict[str, Lease], dict[str, tuple[str, float]], dict[str, str]]:
    """Device uuid -> active lease, drained uuid -> (reason, since) and who drained it,
    from the state file (none when there is no file yet)."""
    if not state.exists():
        return {}, {}, {}
    store = Store(state)
    try:
        holders = {d: lease for lease, _ in store.active_leases() for d in lease.devices}
        return holders, store.drains(), store.drain_causes()
    finally:
        store.close()


def render_status(report: dict[str, Any]) -> str:
    rows = [("DEVICE", "MODEL / PROFILE", "MEMORY", "UTIL", "TEMP", "POWER", "HOLDER", "UUID")]
    for g in report["gpus"]:
        rows.append(
            (
                _gpu_label(g),
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
                    memory(d["memory_mib"]),
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
        f"({_read_from(report)}); utilization '-' = not supported there (MIG)"
    )
    engine = report.get("engine")
    if engine and not engine["reachable"]:
        lines.append(
            f"{engine['error']} since {engine['since']}: the broker keeps its queue and its "
            f"last view of the cluster"
        )
    return "\n".join(lines)


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


# ------------------------------------------------------------ broker commands


def _client(args: argparse.Namespace) -> BrokerClient:
    """A client for --url/--token, $GPUBROKER_URL (with $GPUBROKER_TOKEN inside a GPU
    kernel, else the user's own token: ``user_token_from_env``, the JupyterHub API token
    in a hub user's terminal), or else the first running Jupyter server."""
    url = args.url or os.environ.get(URL_ENV)
    found = (
        BrokerClient(
            url,
            token=args.token or user_token_from_env(),
            kernel_token=os.environ.get(TOKEN_ENV, ""),
            retry_for=getattr(args, "retry_for", None),
            on_retry=_retrying,
        )
        if url
        else next(_server_clients(args.token), None)
    )
    if found is None:
        raise BrokerAPIError(
            0,
            "no_server",
            f"no running Jupyter server found: start one, or pass --url / set {URL_ENV}",
        )
    args.broker_url = found.url.rstrip("/")
    return found


def _retrying(why: str) -> None:
    print(f"the GPU broker does not answer ({why}): trying again", file=sys.stderr)


def _server_clients(token: str | None) -> Iterator[BrokerClient]:
    """A client of the broker API of each running Jupyter server (as `jupyter server list`
    finds them; one that does not answer at once left its file behind)."""
    from jupyter_server.serverapp import list_running_servers

    for server in list_running_servers():
        yield BrokerClient(
            server["url"].rstrip("/") + "/" + API_PREFIX,
            token=token or server.get("token", ""),
            retry_for=0,
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
                eta_text(e),
            )
        )
    _print(args, queue, _table(rows) + f"\n{len(queue)} waiting")
    return 0


def _size_fields(text: str) -> dict[str, Any]:
    if text.strip().startswith("-"):
        digits = text.strip()[1:].isdigit()
        raise InvalidRequest(
            f"a GPU count must be positive, not {text}"
            if digits
            else f"sizes cannot be negative: {text} (give e.g. 1g.10gb, 2 or 20GB)"
        )
    return Size.parse(text).to_json()


async def _granted(client: BrokerClient, args: argparse.Namespace, owner: str) -> dict[str, Any]:
    """Submit the request and wait for its grant (unless --no-wait). A request whose
    wait ends (timeout, Ctrl-C, error) is withdrawn by ``wait_for_grant``: nothing is
    granted to a caller who left."""
    fields = _size_fields(args.size)
    r = await client.submit(**fields, job_class=args.job_class, owner=owner)
    if r["state"] != "queued" or getattr(args, "no_wait", False):
        return r
    print(f"queued at position {r['position']} (request {r['id']})", file=sys.stderr)
    try:
        return await client.wait_for_grant(r["id"], args.timeout)
    except BaseException:
        args.withdrawn = f": request {r['id']} withdrawn"
        raise


def _interruptible(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` where Ctrl-C cancels the command at its next ``await``, as
    Python 3.11 does: on 3.10 it raises wherever the loop happens to be (a resolver
    thread starting), before the wait can withdraw its request."""

    async def main() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        loop.add_signal_handler(signal.SIGINT, task.cancel)
        try:
            return await coro
        except asyncio.CancelledError:
            raise KeyboardInterrupt from None
        finally:
            loop.remove_signal_handler(signal.SIGINT)

    return asyncio.run(main())


def cmd_request(args: argparse.Namespace) -> int:
    client = _client(args)
    r = _interruptible(_granted(client, args, "cli"))
    if r["state"] != "granted":
        _print(
            args,
            r,
            f"request {r['id']} is {r['state']} at position {r['position']}\n"
            f"# renew within {r['ttl_s']:g} s or it leaves the queue: "
            f"jupyter gpubroker renew {r['id']}",
        )
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
    client = _client(args)
    if args.id.startswith("r-"):
        r = asyncio.run(client.renew_request(args.id))
        _print(args, r, f"request {r['id']} is {r['state']}; expires at {r['expires_at']}")
        return 0
    lease = asyncio.run(client.renew(args.id))
    _print(args, lease, f"lease {lease['id']} expires at {lease['expires_at']}")
    return 0


def cmd_release(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.id.startswith("r-"):
        done = asyncio.run(client.cancel(args.id, args.reason))
    else:
        done = asyncio.run(client.release(args.id))
    _print(args, done, f"{args.id}: {done['state']}")
    return 0


def _add_admin_commands(connected: Any) -> None:
    """Commands for the broker's admins (anyone else is refused by the broker)."""
    drain = connected(
        "drain",
        help="(admins) grant nothing more on a GPU or MIG slice",
        description="Drain a GPU (and its slices) or one slice: nothing new is granted on it "
        "until an admin undrains it, whatever its health; holders keep their leases and are "
        "told. Recorded in the audit log.",
    )
    drain.add_argument("uuid", help="a GPU or MIG UUID (GPU-..., MIG-...; see 'status')")
    drain.add_argument("--reason", required=True, help="why, shown to the holders")
    drain.set_defaults(func=cmd_drain)

    undrain = connected(
        "undrain",
        help="(admins) let a drained GPU or MIG slice take grants again",
        description="Lift an admin's drain. A GPU its health check drained is lifted by the "
        "health check once it recovers, never by hand; one still faulty stays drained by its "
        "health check. Recorded in the audit log.",
    )
    undrain.add_argument("uuid", help="a GPU or MIG UUID")
    undrain.add_argument("--reason", default=None, help="why, shown to the holders")
    undrain.set_defaults(func=cmd_undrain)

    reclass = connected(
        "reclass",
        help="(admins) move a waiting request to the other class",
        description="Make a waiting request interactive or batch; its place in the queue "
        "follows at once. Recorded in the audit log.",
    )
    reclass.add_argument("id", help="a waiting request's id (r-...)")
    reclass.add_argument("job_class", choices=["interactive", "batch"])
    reclass.add_argument("--reason", default=None, help="why, shown to its holder")
    reclass.set_defaults(func=cmd_reclass)

    audit = connected(
        "audit",
        help="(admins) show what admins did",
        description="The audit log, oldest first: who cancelled, reclassed, drained or "
        "undrained what, and who changed which quota, with their reasons.",
    )
    audit.add_argument("--since", default=None, help="from this time on (ISO 8601, UTC)")
    audit.add_argument("--actor", default=None, help="only this admin's actions")
    audit.set_defaults(func=cmd_audit)

    reclaims = connected(
        "reclaims",
        help="(admins) show the leases taken back, with cause and evidence",
        description="Every reclaimed lease, oldest first: whose, when, why (idle, stalled, "
        "preempted, lost, admin) and what the decision saw (idle time, utilization, the "
        "kernel's last activity); --json prints the whole evidence.",
    )
    reclaims.add_argument("--user", default=None, help="only this user's leases")
    reclaims.add_argument("--since", default=None, help="from this time on (ISO 8601, UTC)")
    reclaims.add_argument("--until", default=None, help="before this time (ISO 8601, UTC)")
    reclaims.set_defaults(func=cmd_reclaims)

    alerts = connected(
        "alerts",
        help="(admins) show the GPUs' health alerts",
        description="The active health alerts (over-temperature, power capping, ECC and "
        "Xid errors, a lost GPU, memory nearly full), oldest first, each with its device, "
        "severity and what to do; --history N adds the N most recently started ended ones.",
    )
    alerts.add_argument(
        "--history",
        type=int,
        default=0,
        metavar="N",
        help="also show the last N ended alerts (1 to 1000)",
    )
    alerts.set_defaults(func=cmd_alerts)


def cmd_drain(args: argparse.Namespace) -> int:
    state = asyncio.run(_client(args).drain(args.uuid, args.reason))
    _print(args, state, state["message"])
    return 0


def cmd_undrain(args: argparse.Namespace) -> int:
    state = asyncio.run(_client(args).undrain(args.uuid, args.reason))
    _print(args, state, state["message"])
    return 0


def cmd_reclass(args: argparse.Namespace) -> int:
    r = asyncio.run(_client(args).change_class(args.id, args.job_class, args.reason))
    _print(args, r, f"request {r['id']} is {r['job_class']}, at position {r['position']}")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    records = asyncio.run(_client(args).audit(since=args.since, actor=args.actor))
    rows = [("AT", "ACTOR", "ACTION", "TARGET", "REASON")]
    rows += [
        (a["at"][:19], a["actor"], a["action"], a["target"], a["detail"].get("reason", ""))
        for a in records
    ]
    _print(args, records, _table(rows) + f"\n{len(records)} record(s)")
    return 0


def cmd_alerts(args: argparse.Namespace) -> int:
    found = asyncio.run(_client(args).alerts(limit=args.history or None))
    history = found["history"] if args.history else []
    rows = [("SINCE", "ENDED", "SEVERITY", "DEVICE", "KIND", "MESSAGE")]
    rows += [
        (
            a["since"][:19],
            (a["ended"] or "-")[:19],
            a["severity"],
            a["label"],
            a["kind"],
            a["message"],
        )
        for a in [*found["active"], *history]
    ]
    summary = f"{len(found['active'])} active alert(s)"
    if args.history:
        summary += f", {len(history)} ended"
    _print(args, found if args.history else found["active"], _table(rows) + f"\n{summary}")
    return 0


def cmd_reclaims(args: argparse.Namespace) -> int:
    found = asyncio.run(_client(args).reclaims(user=args.user, since=args.since, until=args.until))
    rows = [("AT", "USER", "CAUSE", "LEASE", "REASON")]
    rows += [(x["at"][:19], x["user"], x["cause"], x["lease_id"], x["reason"]) for x in found]
    _print(args, found, _table(rows) + f"\n{len(found)} reclaim(s)")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("error: give the command to run after --", file=sys.stderr)
        return 2
    return _interruptible(_run(_client(args), args, command))


async def _run(client: BrokerClient, args: argparse.Namespace, command: list[str]) -> int:
    r = await _granted(client, args, "cli-run")
    try:
        lease = r["lease"]
        devices = ",".join(lease["devices"])
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": devices, "NVIDIA_VISIBLE_DEVICES": devices}
        try:
            proc = await asyncio.create_subprocess_exec(*command, env=env)
        except OSError as e:  # as a shell says it: 127 not found, 126 not runnable
            print(f"error: cannot run {command[0]}: {e.strerror}", file=sys.stderr)
            return 127 if isinstance(e, FileNotFoundError) else 126
        try:
            return await _hold(client, lease, proc)
        finally:
            if proc.returncode is None:  # lost lease, Ctrl-C: never leave it running
                await _stop(proc)
    finally:
        with contextlib.suppress(BrokerAPIError, OSError):
            await client.cancel(r["id"])


async def _hold(client: BrokerClient, lease: dict[str, Any], proc: Process) -> int:
    """Renew the lease while the command runs (``keep_alive``); its exit status, or 1
    once the lease is lost: ended by the broker, refused, or not renewed within its TTL."""
    renewing = asyncio.ensure_future(keep_alive(client.renew, lease))
    exiting = asyncio.ensure_future(proc.wait())
    try:
        await asyncio.wait({renewing, exiting}, return_when=asyncio.FIRST_COMPLETED)
        if exiting.done():
            return exiting.result()
        lost = renewing.result()
        why = lost.message if lost is not None else "no longer renewed"
        print(f"error: lost lease {lease['id']} ({why}): stopping the command", file=sys.stderr)
        return 1
    finally:
        renewing.cancel()
        exiting.cancel()


async def _stop(proc: Process) -> None:
    """SIGTERM, then SIGKILL if it has not exited after ``STOP_GRACE_S``."""
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
    except asyncio.TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


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
