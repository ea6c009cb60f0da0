"""The command line's entry point: parse, run one command, turn its refusal into a sentence.

Exit codes: 0 success, 1 the broker or the hardware refused (e.g. no driver), 2 bad usage.
Only the command being run has its module imported and its options built; the others
are listed by name and help, so ``--help`` reads as it always did.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from ..api import API_PREFIX
from ..client import (
    HUB_TOKEN_ENV,
    JUPYTER_TOKEN_ENV,
    URL_ENV,
    BrokerAPIError,
    GrantTimeout,
    NoReply,
)

COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("status", ".status", "show the GPUs and MIG slices, their load, and who holds them"),
    ("queue", ".leases", "show the waiting requests, their positions and ETAs"),
    ("request", ".leases", "ask for a GPU or MIG slice and print the grant"),
    ("renew", ".leases", "renew a lease or a waiting request (a heartbeat)"),
    ("release", ".leases", "release a lease or withdraw a request"),
    ("extend", ".leases", "give your lease's time limit more time, where nobody waits for it"),
    ("run", ".leases", "run a command on a granted GPU, renewing the lease while it runs"),
    ("drain", ".admin", "(admins) grant nothing more on a GPU or MIG slice"),
    ("undrain", ".admin", "(admins) let a drained GPU or MIG slice take grants again"),
    ("reclass", ".admin", "(admins) move a waiting request to the other class"),
    ("audit", ".admin", "(admins) show what admins did"),
    ("reclaims", ".admin", "(admins) show the leases taken back, with cause and evidence"),
    ("alerts", ".admin", "(admins) show the GPUs' health alerts"),
    ("forecast", ".forecast", "(admins) demand per hour of the week, from the broker's history"),
    ("whatif", "..replay.cli", "replay the broker's own history with other settings"),
    ("kernelspec", ".local", "install GPU kernelspecs"),
    (
        "demo",
        ".local",
        "start JupyterLab on a simulated GPU machine with the broker and GPU kernels",
    ),
    (
        "service",
        "",  # run by main() itself: listed for --help
        "run the broker as a JupyterHub service (started by the hub: "
        "'jupyter gpubroker service --help-all' lists its options)",
    ),
    ("replay", "..replay.cli", "replay a cluster trace through the broker on simulated GPUs"),
    (
        "usage",
        ".usage",
        "GPU-hours (and cost) per user, group, profile or day, from the broker or its state file",
    ),
)
"""Each command: its name, the module whose ``add_<name>(parser)`` builds it, its help."""


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
    parser = _parser(next((a for a in argv if not a.startswith("-")), None))
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
    except Exception as e:
        if isinstance(e, _refusals()):
            print(f"error: {getattr(e, 'message', None) or e}", file=sys.stderr)
            return 1
        if not isinstance(e, OSError):
            raise
        # the network (connection refused, unknown host) or a local file
        url = getattr(args, "broker_url", "")
        if url:
            print(f"error: {_unreachable(url, e.strerror or str(e))}", file=sys.stderr)
        else:
            print(f"error: {e}", file=sys.stderr)
        return 1


_REFUSALS = {
    "jupyter_gpubroker.wire.errors": "BrokerError",
    "jupyter_gpubroker.nvml.backend": "NvmlUnavailable",
    "jupyter_gpubroker.nvml.presets": "TopologyError",
}


def _refusals() -> tuple[type[BaseException], ...]:
    """The errors that carry their own sentence (the broker's, the hardware's): looked up
    among the modules the command loaded, since one it never imported raised none."""
    return tuple(
        getattr(sys.modules[module], name)
        for module, name in _REFUSALS.items()
        if module in sys.modules
    )


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
    if isinstance(e, NoReply):
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


def _parser(command: str | None) -> argparse.ArgumentParser:
    """Every command by name and help; ``command``'s options in full."""
    parser = _Parser(
        prog="jupyter gpubroker",
        description="A notebook-centric GPU broker: queues, leases and shares GPUs and MIG slices.",
    )
    sub = parser.add_subparsers(metavar="COMMAND")
    for name, module, text in COMMANDS:
        p = sub.add_parser(name, help=text)
        if name == command and module:
            getattr(importlib.import_module(module, __package__), f"add_{name}")(p)
    return parser
