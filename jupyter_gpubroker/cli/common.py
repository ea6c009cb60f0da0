"""What the commands share: the connection options, finding the broker, printing."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any, TypeVar

from ..api import API_PREFIX
from ..client import (
    RETRY_ENV,
    RETRY_FOR_S,
    TOKEN_ENV,
    URL_ENV,
    BrokerAPIError,
    BrokerClient,
    user_token_from_env,
)

T = TypeVar("T")
BY_HAND_RETRY_S = 10.0
"""How long a call keeps trying a broker at an address typed with ``--url``: a typo there
is likelier than a hub service restarting."""


def seconds(text: str) -> float:
    """A ``--timeout``: a number of seconds above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, not {text}")
    return value


def connection_args(p: argparse.ArgumentParser, *, json_output: bool = True) -> None:
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
        f"restarting (default ${RETRY_ENV}, else {BY_HAND_RETRY_S:g} with --url and "
        f"{RETRY_FOR_S:g} without)",
    )
    if json_output:
        p.add_argument("--json", action="store_true", help="print JSON")


def client(args: argparse.Namespace) -> BrokerClient:
    """A client for --url/--token, $GPUBROKER_URL (with $GPUBROKER_TOKEN inside a GPU
    kernel, else the user's own token: ``user_token_from_env``, the JupyterHub API token
    in a hub user's terminal), or else the first running Jupyter server."""
    url = args.url or os.environ.get(URL_ENV)
    retry_for = getattr(args, "retry_for", None)
    if retry_for is None and args.url and not os.environ.get(RETRY_ENV):
        retry_for = BY_HAND_RETRY_S
    found = (
        BrokerClient(
            url,
            token=args.token or user_token_from_env(),
            kernel_token=os.environ.get(TOKEN_ENV, ""),
            retry_for=retry_for,
        )
        if url
        else next(server_clients(args.token), None)
    )
    if found is not None and found.retry_for:
        found.on_retry = _retrying(found.url.rstrip("/"), found.retry_for)
    if found is None:
        raise BrokerAPIError(
            0,
            "no_server",
            f"no running Jupyter server found: start one, or pass --url / set {URL_ENV}",
        )
    args.broker_url = found.url.rstrip("/")
    return found


def _retrying(url: str, retry_for: float) -> Callable[[str], None]:
    """What a call says when it first tries again: that it does, where, and how long."""

    def say(why: str) -> None:
        print(
            f"the GPU broker at {url} does not answer ({why}): trying again for up to "
            f"{retry_for:g} s (--retry-for)",
            file=sys.stderr,
        )

    return say


def server_clients(token: str | None) -> Iterator[BrokerClient]:
    """A client of the broker API of each running Jupyter server (as `jupyter server list`
    finds them; one that does not answer at once left its file behind)."""
    from jupyter_server.serverapp import list_running_servers

    for server in list_running_servers():
        yield BrokerClient(
            server["url"].rstrip("/") + "/" + API_PREFIX,
            token=token or server.get("token", ""),
            retry_for=0,
        )


def ask_broker(
    args: argparse.Namespace, ask: Callable[[BrokerClient], Coroutine[Any, Any, T]]
) -> tuple[T, str] | None:
    """``ask`` the broker at --url ($GPUBROKER_URL), else that of the first running
    Jupyter server whose broker answers: its answer and where it came from; None when no
    server runs one. A server whose broker could not start says why (its 503)."""
    if args.url or os.environ.get(URL_ENV):
        found = asyncio.run(ask(client(args)))
        return found, f"broker at {args.broker_url}"
    not_started: BrokerAPIError | None = None
    for server in server_clients(args.token):
        try:
            found = asyncio.run(ask(server))
        except BrokerAPIError as e:  # no extension there (404), or its broker did not start
            if e.status == 503 and not_started is None:
                not_started, args.broker_url = e, server.url.rstrip("/")
            continue
        except OSError:  # a server that left its file behind
            continue
        return found, f"broker of the Jupyter server at {server.url.rstrip('/')}"
    if not_started is not None:
        raise not_started
    return None


def print_result(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=2) if args.json else text)


def table(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def interruptible(coro: Coroutine[Any, Any, T]) -> T:
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
