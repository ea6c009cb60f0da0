"""``%gpu``: this kernel's GPU from the broker, in the notebook.

Each subcommand returns the API's JSON as a ``GpuResult`` (a dict) that IPython
displays as a live widget, so ``lease = %gpu status`` is usable in code and
``%gpu status`` alone shows the widget. Bad input and broker errors end the cell
with one readable line (``GpuError``), never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import shlex
import time
from collections.abc import Callable
from typing import Any, NoReturn

from IPython.core.getipython import get_ipython
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.display import display
from traitlets import observe
from traitlets.log import get_logger

from ..client import BrokerAPIError, NoReply
from ..wire.errors import BrokerError, UnknownProfile
from ..wire.sizes import RESOLUTION, Size, extension, memory_option, time_limit
from ..wire.text import duration, limit_extended, sentence, size_text
from ..wire.traits import Seconds
from . import GpuError
from .cuda import cuda_initialised
from .feed import why
from .resume import Resume
from .session import Activity, Session, Tracker
from .tables import QueueTable, UsageChart, queue_text, usage_text
from .widgets import (
    GpuWidget,
    RequestPanel,
    SuspendedPanel,
    held_devices,
    request_text,
    suspended_text,
    when,
)

EXAMPLES = """\
examples:
  %gpu                            this kernel's GPU: device, live utilization, time held
  %gpu request 1g.10gb            ask for a MIG slice and wait in the queue (also: 2,
                                  --gpus 2, --min-memory 20GB, --class batch)
  %gpu request --share 8GB        8 GB of a GPU shared with others (--compute 50: at
                                  most half its compute); --min-memory 8GB is a whole
                                  device of at least 8 GB
  %gpu request 1g.10gb --for 2h   ask for it for two hours (a time limit you can extend)
  %gpu request 1g.10gb --no-wait  return at once; the widget keeps updating and
                                  CUDA_VISIBLE_DEVICES is set when the grant comes
  %gpu extend 1h                  an hour more on the time limit, where nobody waits
  %gpu release                    give the GPU back (or withdraw the waiting request)
  %gpu queue                      the whole queue, live
  %gpu usage                      my GPU-hours per day, last 7 days
  lease = %gpu status             each command returns the API's JSON as a dict

Interrupting the kernel while %gpu request waits withdraws the request."""

LABELS = {"quota_exceeded": "quota exceeded", "unsatisfiable": "refused", "forbidden": "refused"}
"""How a broker error code reads before its message (others speak for themselves)."""


class _HelpShown(Exception):
    """``--help`` printed the usage: nothing else to do."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad input as one ``GpuError`` line instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise GpuError(f"{self.prog}: {message} (see {self.prog} --help)")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise _HelpShown


def build_parser() -> _Parser:
    parser = _Parser(
        prog="%gpu",
        description="This kernel's GPU from the broker: its lease, the queue and your usage.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.add_parser("status", help="this kernel's GPU and its live readings (the default)")
    request = commands.add_parser("request", help="ask for a GPU or a MIG slice")
    request.add_argument(
        "size", nargs="?", help="a MIG profile (1g.10gb), a number of GPUs (2) or memory (20GB)"
    )
    request.add_argument("--gpus", type=int, metavar="N", help="N whole GPUs")
    request.add_argument(
        "--min-memory",
        type=memory_option,
        metavar="GB",
        help="any GPU or slice with at least this memory, in GB as NVIDIA names them (a "
        "3g.20gb slice has 20 GB)",
    )
    request.add_argument(
        "--share", type=memory_option, metavar="GB", help="this much of a GPU shared with others"
    )
    request.add_argument(
        "--compute",
        type=int,
        metavar="PERCENT",
        help="with --share: the most of the GPU's compute it may use",
    )
    request.add_argument(
        "--class",
        dest="job_class",
        choices=("interactive", "batch"),
        default="interactive",
        help="job class (default interactive)",
    )
    request.add_argument(
        "--for",
        dest="limit_s",
        type=time_limit,
        metavar="TIME",
        help="the time limit, e.g. 2h or 1h30m: warned before it ends, the GPU is taken "
        "back after it (default: the broker's for the class, if any)",
    )
    request.add_argument(
        "--wait",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="block the cell until the grant (default); --no-wait returns at once",
    )
    request.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="withdraw the request if it is not granted by then (with --wait)",
    )
    extend = commands.add_parser(
        "extend",
        help="more time on this kernel's time limit (granted where no waiting request needs "
        "the GPU sooner)",
    )
    extend.add_argument("time", type=extension, metavar="TIME", help="how much more, e.g. 1h")
    commands.add_parser("release", help="give the GPU back, or withdraw the waiting request")
    commands.add_parser("queue", help="the whole queue, live")
    usage = commands.add_parser("usage", help="my GPU-hours per day")
    usage.add_argument("--days", type=int, default=7, help="how many days back (default 7)")
    return parser


PARSER = build_parser()


def requested_size(args: argparse.Namespace) -> dict[str, Any]:
    """The one size given (positional, ``--gpus``, ``--min-memory`` or ``--share``) in the
    API's terms."""
    given = [x for x in (args.size, args.gpus, args.min_memory, args.share) if x is not None]
    try:
        if args.share is not None and args.size is not None:
            profile = Size.parse(args.size).profile
            if profile is not None:
                Size(profile=profile, share_gb=args.share)  # refused: a slice is never shared
        if len(given) != 1:
            raise GpuError(
                "name one size: a MIG profile (1g.10gb), --gpus N, --min-memory 20GB (a "
                "device of at least 20 GB) or --share 8GB (8 GB of a shared GPU)"
            )
        if args.share is not None:
            size = Size(share_gb=args.share, compute_percent=args.compute)
        elif args.compute is not None:
            size = Size(compute_percent=args.compute)  # refused: a cap of a share only
        elif args.size is not None:
            size = Size.parse(args.size)
        elif args.gpus is not None:
            size = Size(gpus=args.gpus)
        else:
            size = Size(min_memory_gb=args.min_memory)
    except UnknownProfile:
        raise  # the magic names this machine's profiles
    except BrokerError as e:
        raise GpuError(e.message) from None
    return size.to_json()


def _in_kernel() -> bool:
    """Can widgets show here (a Jupyter kernel, not terminal IPython)?"""
    return getattr(get_ipython(), "kernel", None) is not None


def _cell() -> int:
    return int(getattr(get_ipython(), "execution_count", 0))


class GpuResult(dict[str, Any]):
    """What ``%gpu`` returns: the API's JSON (a lease, a request, the queue, my usage),
    displayed as its live widget, or as text where there are no widgets."""

    def __init__(
        self,
        data: dict[str, Any],
        text: Callable[[], str],
        view: Callable[[], GpuWidget] | None = None,
    ) -> None:
        super().__init__(data)
        self._text, self._view = text, view
        self._widget: GpuWidget | None = None
        self._shown_in: int | None = None

    @property
    def widget(self) -> GpuWidget | None:
        """The live widget showing this result, made on first use (``None`` for results
        shown as text only, and outside a kernel)."""
        if self._widget is None and self._view is not None and _in_kernel():
            self._widget = self._view()
        return self._widget

    def show(self) -> None:
        """Display it now. A live widget keeps itself current, so the cell's own result
        does not display it a second time."""
        widget = self.widget
        if widget is None:
            display({"text/plain": self._text()}, raw=True)
            return
        display(widget)
        self._shown_in = _cell()

    def _ipython_display_(self) -> None:
        if self._shown_in != _cell():
            self.show()


@magics_class
class GPUMagics(Magics):
    """``%gpu``: this kernel's GPU from the broker (``%gpu --help``)."""

    refresh_interval = Seconds(
        3.0,
        RESOLUTION,
        3600.0,
        help="Seconds between redraws of an open %gpu status widget: its time held, idle "
        "time and recent-load line. The readings themselves come with the broker's event "
        "stream (every few seconds, as they change).",
    ).tag(config=True)

    _session: Session | None = None

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.activity = Activity()
        self.activity.register(shell)
        self.resume = Resume(self)

    @property
    def session(self) -> Session:
        """Made on first use, so that loading the extension never fails or waits."""
        if self._session is None:
            self._session = Session.from_env(get_logger(), self.refresh_interval)
            self._session.activity = self.activity
        return self._session

    @observe("refresh_interval")
    def _interval_changed(self, change: dict[str, Any]) -> None:
        if self._session is not None:
            self._session.clock.interval = change["new"]

    @line_magic
    def gpu(self, line: str) -> GpuResult | None:
        """This kernel's GPU from the broker: ``%gpu [status|request|extend|release|queue|usage]``;
        ``%gpu --help`` for the options."""
        try:
            args = PARSER.parse_args(shlex.split(line))
        except _HelpShown:
            return None
        except ValueError as e:  # unbalanced quotes
            raise GpuError(f"%gpu: {e}") from None
        command = args.command or "status"
        try:
            return getattr(self, f"_{command}")(args)  # type: ignore[no-any-return]
        except GpuError as e:
            message = str(e)
        except BrokerAPIError as e:
            label = LABELS.get(e.code)
            message = self._unreachable(e) if isinstance(e, NoReply) else e.message
            message = f"{label}: {message}" if label else message
        except (OSError, asyncio.TimeoutError) as e:
            message = self._unreachable(e)
        except KeyboardInterrupt:
            message = "interrupted"
        raise GpuError(f"%gpu {command}: {message}")

    def _unreachable(self, e: BaseException) -> str:
        return f"cannot reach the GPU broker at {self.session.client.url} ({why(e)})"

    # -- the subcommands

    def _status(self, _: argparse.Namespace) -> GpuResult:
        tracker = self.session.live()
        suspended = self.resume.suspended() if tracker is None else None
        if suspended is not None:
            return GpuResult(
                suspended,
                lambda: suspended_text(suspended, None),
                lambda: SuspendedPanel(self.session, suspended),
            )
        if tracker is None:
            return GpuResult(
                {},
                lambda: (
                    "This kernel holds no GPU: %gpu request 1g.10gb (or --gpus N, "
                    "--min-memory 20GB) asks for one."
                ),
            )
        lease = tracker.lease if tracker.state == "granted" else None
        return self._panel(tracker, lease or tracker.request, cancellable=True)

    def _request(self, args: argparse.Namespace) -> GpuResult:
        try:
            size = requested_size(args)
        except UnknownProfile:
            raise GpuError(self._unknown_profile(args.size.strip())) from None
        held = self.session.live()
        if held is not None and (lease := self.session.shared(held)):  # a second device: never
            r = held.request
            display(
                {
                    "text/plain": f"This server already holds {', '.join(lease['devices'])} "
                    f"({size_text(r)}); this kernel uses it (ask for a different GPU when "
                    "you start the server)."
                },
                raw=True,
            )
            return self._panel(held, held.lease or r, cancellable=False)
        withdrawn = f"interrupted: the request for {size_text(size)} was withdrawn"
        try:
            tracker = self.session.submit(size, args.job_class, args.limit_s)
        except KeyboardInterrupt:  # submit takes its request back itself
            raise GpuError(withdrawn) from None
        try:
            result = self._panel(tracker, tracker.request, cancellable=not args.wait)
            if tracker.state != "queued":
                return result  # granted at once: the cell's result shows it
            result.show()  # the queue, live, while the cell waits
            if args.wait:
                self._wait(tracker, args.timeout)
                result.update(tracker.request)
            return result
        except KeyboardInterrupt:  # the kernel was interrupted: leave nothing queued
            self.session.withdraw(tracker)
            raise GpuError(withdrawn) from None

    def _unknown_profile(self, name: str) -> str:
        """A profile no GPU has, with the profiles this machine offers (not NVIDIA's whole
        catalogue)."""
        session = self.session
        gpus = session.call(session.client.devices())
        here = sorted({d["profile"] for g in gpus for d in g["devices"] if d["kind"] == "mig"})
        offered = f"this machine offers {', '.join(here)}" if here else "no GPU here is in MIG mode"
        return (
            f"unknown MIG profile {name.removeprefix('profile=')!r}: {offered}; or ask for "
            "--gpus N, or --min-memory 20GB"
        )

    def _wait(self, tracker: Tracker, timeout: float | None) -> None:
        try:
            tracker.settled.result(timeout)
        except concurrent.futures.TimeoutError:
            position = tracker.request.get("position")
            self.session.withdraw(tracker)
            raise GpuError(
                f"not granted within {timeout:g} s (position {position} in the queue): "
                "the request was withdrawn"
            ) from None
        if tracker.state != "granted":
            reason = tracker.request.get("reason") or "no reason given"
            raise GpuError(f"the request ended without a grant ({tracker.state}: {reason})")

    def _extend(self, args: argparse.Namespace) -> GpuResult:
        tracker = self.session.live()
        if tracker is None:
            raise GpuError("this kernel holds no GPU to extend")
        lease = self.session.extend(tracker, args.time)
        text = limit_extended(when(lease["ends_at"]))
        return GpuResult(lease, lambda: sentence(text))

    def _release(self, _: argparse.Namespace) -> GpuResult:
        tracker = self.session.live()
        if tracker is None and (suspended := self.resume.suspended()) is not None:
            # its GPU went back when it was suspended; the memory stays in its process
            text = (
                f"This kernel holds no GPU: it is {suspended['suspended']['text']}. "
                "Restarting the kernel frees that memory."
            )
            return GpuResult(suspended, lambda: text)
        if tracker is None:
            return GpuResult({}, lambda: "This kernel holds no GPU and has no request waiting.")
        if lease := self.session.shared(tracker):
            raise GpuError(
                f"this kernel shares its server's {', '.join(lease['devices'])}: stop "
                "the server (the hub's home page) to give the GPU back"
            )
        granted = tracker.state == "granted"
        self.session.withdraw(tracker)
        r, lease = tracker.request, tracker.lease
        if not granted or lease is None:
            return GpuResult(r, lambda: f"Withdrew the request for {size_text(r)}.")
        held = time.time() - when(lease["granted_at"])
        text = f"Released {', '.join(lease['devices'])} ({size_text(r)}) after {duration(held)}."
        initialised_by = cuda_initialised()
        if initialised_by is not None:
            text += (
                f" CUDA was initialised in this kernel (by {initialised_by}): it keeps its "
                "context on the device until the kernel restarts."
            )
        return GpuResult(lease, lambda: text)

    def _queue(self, _: argparse.Namespace) -> GpuResult:
        session = self.session
        queue = session.call(session.client.queue())
        return GpuResult(
            {"queue": queue, "length": len(queue)},
            lambda: queue_text(queue),
            lambda: QueueTable(session, queue),
        )

    def _usage(self, args: argparse.Namespace) -> GpuResult:
        days = self.session.usage_by_day(args.days)
        total = sum(d["gpu_hours"] for d in days)
        return GpuResult(
            {"days": days, "total_gpu_hours": total},
            lambda: usage_text(days),
            lambda: UsageChart(days),
        )

    def _panel(self, tracker: Tracker, data: dict[str, Any], *, cancellable: bool) -> GpuResult:
        """``data`` shown as the live panel of this kernel's request."""
        session = self.session

        def devices() -> list[dict[str, Any]]:
            granted = tracker.state == "granted"
            return session.call(session.client.devices()) if granted else []

        return GpuResult(
            data,
            lambda: request_text(tracker, self.activity, held_devices(tracker, devices())),
            lambda: RequestPanel(tracker, self.activity, cancellable=cancellable, gpus=devices()),
        )


def load(shell: Any) -> None:
    """Register ``%gpu``, configurable with ``%config GPUMagics.refresh_interval = 1``."""
    magics = GPUMagics(shell)
    shell.register_magics(magics)
    shell.configurables.append(magics)
    magics.resume.register(shell)
