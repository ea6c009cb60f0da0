"""A pytest plugin loaded into a host's own test suite by ``.ci/host-suite``.

It records each test's outcome by node id (``$HOST_SUITE_OUTCOMES``, JSON lines), which is
what the two runs are compared on. With ``$HOST_SUITE_GPUBROKER=1`` a test during which a
traceback through jupyter_gpubroker's code is logged counts as an error, though the host's
test passed (a traceback that buries the real error is what a user sees). It also makes every
server the tests start in process load jupyter_gpubroker as installing the package does:
pytest-jupyter gives each test its own empty config paths, so the package's installed
``jupyter_server_config.d`` file is put into the test's system config path, the one a
system-wide install writes to (the env path is left alone: the host's tests look into it).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import traceback
from pathlib import Path
from typing import Any

import pytest

CONFIG_D = "jupyter_server_config.d"
SHIPPED = Path(sys.prefix, "etc", "jupyter", CONFIG_D, "jupyter_gpubroker.json")
OURS = f"{os.sep}jupyter_gpubroker{os.sep}"


class OurTracebacks:
    """Every logged traceback that passes through jupyter_gpubroker's code, seen as its
    record is made: a logger's handlers are the host's (traitlets' dictConfig resets them)."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.make = logging.getLogRecordFactory()

    def __call__(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record = self.make(*args, **kwargs)
        tb = record.exc_info[2] if record.exc_info else None
        if tb is not None and any(OURS in f.filename for f in traceback.extract_tb(tb)):
            error = record.exc_info[1] if record.exc_info else None
            self.seen.append(f"{record.getMessage()}: {error!r} (a traceback through our code)")
        return record


TRACEBACKS = OurTracebacks()


@pytest.fixture(autouse=True)
def _gpubroker_installed(request: pytest.FixtureRequest) -> None:
    if os.environ.get("HOST_SUITE_GPUBROKER") != "1":
        return
    if "jp_system_config_path" not in request.fixturenames:  # no server of pytest-jupyter's
        return
    config_d = Path(request.getfixturevalue("jp_system_config_path"), CONFIG_D)
    config_d.mkdir(parents=True, exist_ok=True)
    shutil.copy(SHIPPED, config_d)


CONTROLLER = False
"""This process hands the tests to pytest-xdist's workers and runs none itself."""


def pytest_configure(config: pytest.Config) -> None:
    global CONTROLLER
    CONTROLLER = bool(getattr(config.option, "numprocesses", None)) and not hasattr(
        config, "workerinput"
    )
    if os.environ.get("HOST_SUITE_GPUBROKER") == "1":
        if not SHIPPED.exists():
            raise pytest.UsageError(f"{SHIPPED} is missing: jupyter-gpubroker is not installed")
        logging.setLogRecordFactory(TRACEBACKS)
        if kind := os.environ.get("HOST_SUITE_BREAK"):
            break_the_extension(kind)
        watch_the_stop()


def watch_the_stop() -> None:
    """Count a failure of the extension's stop against the test whose server it stopped:
    pytest-jupyter prints and ignores every error of a server's cleanup ("ignoring cleanup
    error"), where a user's server would end its shutdown with a traceback."""
    from jupyter_gpubroker.server import app

    stop = app.GPUBrokerExtension.stop_extension

    async def watched(self: Any) -> None:
        try:
            await stop(self)
        except Exception as e:
            TRACEBACKS.seen.append(f"the extension's stop failed: {e!r}")
            raise

    app.GPUBrokerExtension.stop_extension = watched  # type: ignore[method-assign]


BREAKS = ("load", "kernelspecs", "routes", "stop")
"""Ways to break the extension on purpose (``$HOST_SUITE_BREAK``), each at a point where it
meets the host: its start, its hiding of kernelspecs, its routes, its stop. The subset of the
host's tests ``.ci/host-suite`` runs is honest only if each one fails some test of it."""


def break_the_extension(kind: str) -> None:
    """Break the extension in the servers the tests start in this process, as ``kind`` says."""
    from jupyter_gpubroker.server import app

    ext = app.GPUBrokerExtension

    def fail(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the extension broken on purpose (.ci/host-suite --check-subset)")

    if kind == "load":  # the broker it makes cannot be made
        app.GPUBroker = fail  # type: ignore[assignment,misc]
    elif kind == "kernelspecs":  # hides every kernelspec, not only those that wait for a GPU

        def hide_all(self: Any, specs: Any) -> None:
            specs.allowed_kernelspecs = {"no-such-kernel"}

        ext._hide_gpu_kernelspecs = hide_all  # type: ignore[method-assign]
    elif kind == "routes":  # the API mounted at the server's own /api: its 404 answers there
        from jupyter_gpubroker.server.handlers import handlers
        from jupyter_gpubroker.server.host import JupyterHost

        def everywhere(self: Any) -> None:
            self.handlers.extend(handlers(JupyterHost, root="/api"))

        ext.initialize_handlers = everywhere  # type: ignore[method-assign]
    elif kind == "stop":  # its stop fails

        async def stop(self: Any) -> None:
            fail()

        ext.stop_extension = stop  # type: ignore[method-assign]
    else:
        raise pytest.UsageError(f"no way to break the extension called {kind!r}: {BREAKS}")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """One line per test: its worst phase (an error in setup or teardown counts). Under
    pytest-xdist each worker records its own tests (the tracebacks are seen there), the
    controller, which is told of them again, nothing."""
    path = os.environ.get("HOST_SUITE_OUTCOMES")
    if not path or CONTROLLER:
        return
    if report.when == "call" or report.outcome != "passed":
        outcome = report.outcome
        if report.when != "call" and report.outcome == "failed":
            outcome = "error"
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.outcome == "skipped" else "xpassed"
        line: dict[str, Any] = {"id": report.nodeid, "when": report.when, "outcome": outcome}
        if report.outcome == "failed":
            line["why"] = report.longreprtext.strip().splitlines()[-1:] or [""]
        record(path, line)
    if report.when == "teardown" and TRACEBACKS.seen:
        record(path, {"id": report.nodeid, "outcome": "error", "why": TRACEBACKS.seen[:1]})
        TRACEBACKS.seen.clear()


def record(path: str, line: dict[str, Any]) -> None:
    with open(path, "a") as out:
        out.write(json.dumps(line) + "\n")
