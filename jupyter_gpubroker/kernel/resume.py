"""Resuming a suspended kernel before its next cell runs.

The broker beside the kernels suspended it (``suspend/host.py``): its GPU memory is on the
host and its lease ended, shown with ``suspended`` set. Before a cell runs, this asks for
the same number of GPUs of the same model (CUDA restores onto the same chip only) and
waits in the queue like any request, the ``%gpu`` panel showing its position and ETA; on
the grant the broker restores the kernel onto the granted
GPUs, and the cell runs with everything as it was (once the granted GPUs have the memory
free: until then the cell says why it waits). Interrupting the wait withdraws the
request and leaves the kernel suspended; a restore that fails releases the GPUs and says
so. Either way the cell does not run (an AST transformer empties it), so no CUDA call of
the cell waits on a suspended process. A kernel restarted without its provisioner (a new
process, whose environment still names the suspended lease) asks the same way; the broker
tells it apart, and its cell runs on the grant as a new kernel's does. A kernel moved off a
drained GPU (``suspend/move.py``) says so in one line before its next cell.
"""

from __future__ import annotations

import ast
import os
import time
from typing import TYPE_CHECKING, Any

from IPython.display import display

from ..client import BrokerAPIError
from ..wire.text import ENDED_RESTARTED, SUSPENDED_TEXT, count
from .session import LEASE_ENV, Tracker

if TYPE_CHECKING:
    from .magic import GPUMagics

RESTORE_WAIT_S = 600.0
"""The longest a granted resume waits for the broker to restore the kernel."""


class Resume(ast.NodeTransformer):
    """A pre-run-cell hook that resumes a suspended kernel, and the AST transformer that
    skips the cell when it could not."""

    def __init__(self, magics: GPUMagics) -> None:
        self.magics = magics
        self.lease_id = os.environ.get(LEASE_ENV, "")
        """The lease this kernel holds or last held (the provisioner's, then a resume's)."""
        self.skip = False
        self.told_move: str | None = None
        """When the last move said was (each is said once)."""

    def register(self, shell: Any) -> None:
        if not self.lease_id:
            return  # not a GPU kernel: nothing to suspend, no call per cell
        shell.events.register("pre_run_cell", self.before_cell)
        shell.ast_transformers.append(self)

    def visit_Module(self, node: ast.Module) -> ast.Module:
        if not self.skip:
            return node
        self.skip = False
        return ast.Module(body=[], type_ignores=[])

    def lease(self) -> dict[str, Any] | None:
        """This kernel's lease, or its last one (None: none, or the broker cannot say)."""
        if not self.lease_id:
            return None
        session = self.magics.session
        try:
            return session.call(session.client.lease(self.lease_id))
        except (BrokerAPIError, OSError):
            return None  # the broker is away: the cell runs as it would have

    def suspended(self) -> dict[str, Any] | None:
        """This kernel's last lease while the kernel is suspended (None: it is not, or the
        broker cannot say)."""
        lease = self.lease()
        return lease if lease is not None and lease.get("suspended") else None

    def before_cell(self, info: Any = None) -> None:
        if getattr(info, "raw_cell", "").lstrip().startswith("%gpu"):
            return  # %gpu status says so; it does not resume the kernel
        lease = self.lease()
        if lease is None:
            return
        self._moved(lease)
        if not lease.get("suspended"):
            return
        self.skip = True
        try:
            self._resume(lease)
        except KeyboardInterrupt:
            _say(f"interrupted: the kernel stays {SUSPENDED_TEXT}; run a cell to resume it")
        except (BrokerAPIError, OSError) as e:
            _say(f"the kernel stays {SUSPENDED_TEXT}: {getattr(e, 'message', e)}")

    def _resume(self, old: dict[str, Any]) -> None:
        session, n = self.magics.session, len(old["devices"])
        model = old["suspended"].get("model")  # restored only onto the same chip
        gpus = count(n, f"{model} GPU" if model else "GPU")
        _say(f"This kernel is {SUSPENDED_TEXT}: waiting for {gpus} to resume it.")
        request = session.call(
            session.client.submit(
                gpus=n, model=model, job_class="interactive", holder=session.kernel_id
            )
        )
        tracker = Tracker(session, request)
        session.tracker = tracker
        session.changed(tracker)
        try:
            if tracker.state == "queued":
                self.magics._panel(tracker, request, cancellable=False).show()
            tracker.settled.result()
        except KeyboardInterrupt:
            session.withdraw(tracker)
            raise
        new = tracker.lease
        if tracker.state != "granted" or new is None:
            reason = tracker.request.get("reason") or "no reason given"
            _say(f"the kernel stays {SUSPENDED_TEXT}: its request ended ({reason})")
            return
        self.lease_id = new["id"]
        deadline = time.monotonic() + RESTORE_WAIT_S
        told = None
        while time.monotonic() < deadline:
            # the old lease first: once it is suspended no more, the new one's state is
            # final (a restore that failed released it at the same time)
            was = session.call(session.client.lease(old["id"]))
            now = session.call(session.client.lease(new["id"]))
            if now["state"] != "active":
                _say(f"the kernel could not be resumed: {now['reason']}")
                if session.call(session.client.lease(old["id"])).get("suspended"):
                    self.lease_id = old["id"]  # still on the host: the next cell tries again
                return
            if not was.get("suspended"):
                self.skip = False
                _say(_resumed(was["reason"], new["devices"]))
                return
            waits = was["suspended"].get("waiting")
            if waits and waits != told:  # the GPU granted lacks the memory: said once
                told = waits
                _say(f"This kernel is granted {', '.join(new['devices'])}; {waits}.")
            time.sleep(0.2)
        _say("the kernel was not resumed in time; run the cell again")

    def _moved(self, lease: dict[str, Any]) -> None:
        """Say once that the kernel moved off a drained GPU (or why it did not), and name
        its new GPUs to what the kernel starts from now on (a data loader's workers)."""
        moved = lease.get("moved")
        if moved is None or moved["at"] == self.told_move:
            return
        self.told_move = moved["at"]
        if moved["to"] and lease["state"] == "active":
            devices = ",".join(lease["devices"])
            os.environ.update(CUDA_VISIBLE_DEVICES=devices, NVIDIA_VISIBLE_DEVICES=devices)
        _say(f"{moved['text'][:1].upper()}{moved['text'][1:]}.")


def _resumed(reason: str, devices: list[str]) -> str:
    """What a granted resume says once the old lease is suspended no more: resumed, or,
    where the broker found this a new process of the kernel (restarted), that the cell
    runs as a new kernel's does, without the old process's memory."""
    gpus = ", ".join(devices)
    if reason.endswith(ENDED_RESTARTED):
        return f"Not resumed: {ENDED_RESTARTED}. This cell runs on {gpus} as a new kernel's would."
    return f"Resumed on {gpus}."


def _say(text: str) -> None:
    display({"text/plain": text}, raw=True)
