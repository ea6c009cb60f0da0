"""Screenshots of the %gpu widgets and of the Lab GPU panel, rendered by headless Chromium.

    python docs/screenshot.py           # docs/widgets.png and docs/widgets-queued.png
    python docs/screenshot.py --panel   # docs/panel-light.png and docs/panel-dark.png

Needs ``pip install playwright`` and a Chromium binary (Debian: ``apt-get install
chromium``); Playwright's own browsers are not needed, it drives the system Chromium
(``--chromium``, default /usr/bin/chromium).

Starts JupyterLab with the broker on a simulated one-GPU H100 cut in seven 1g.10gb
slices, all held by other users (a small server extension seeds them, puts a workload
on every held slice and frees one slice once the tour's request has waited a while),
opens jupyter_gpubroker/tour/gpu-broker-tour.ipynb in its on-demand GPU kernel, runs it down to
``%gpu usage`` and captures the queue widget while the request waits, then the
notebook once granted. With ``--panel``: three simulated H200s in mixed MIG slices, one
drained, other users' work on most slices and a queue; a GPU notebook holds a slice and a
second one waits; the panel and the status bar in the light theme, then the dark one.
Nothing is written outside a temporary directory but the images.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any

from playwright.sync_api import Page, sync_playwright

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "ui")]
from lab_server import BUILT, Lab, jupyter_dirs  # noqa: E402  (the UI tests' Lab)
from lab_server import TOKEN as LAB_TOKEN  # noqa: E402

TOKEN = "screenshot"
REQUEST_CELL = "%gpu request"
LAST_CELL = "%gpu usage"

SCENE = '''
"""Screenshot scene: other users hold every slice, each slice busy; the tour's request
gets a slice after it has waited WAIT_S seconds."""

import math
import time

from tornado.ioloop import PeriodicCallback

from jupyter_gpubroker.wire.sizes import Size
from jupyter_gpubroker.server import registry

WAIT_S = 6.0
HOLDERS = ["alice", "alice", "alice", "bob", "bob", "carol", "carol"]
WAITING = [("dave", "batch"), ("erin", "batch")]
state = {"leases": [], "freed": False}


def tick():
    broker = registry.current()
    if broker is None:
        return
    core, sim = broker.core, broker.backend.simulator
    if not state["leases"]:
        for user in HOLDERS:
            r = core.submit(user, Size(profile="1g.10gb"), holder="training")
            state["leases"].append(r.lease_id)
        for user, job_class in WAITING:
            core.submit(user, Size(profile="1g.10gb"), job_class=job_class, holder="sweep")
    now = time.time()
    for i, lease in enumerate(core.leases()):
        for uuid in lease.devices:
            wave = math.sin(now / 4 + i) + 0.4 * math.sin(now / 1.3 + 2 * i)
            sim.set_load(
                uuid,
                utilization=int(max(5, min(99, 60 + 28 * wave))),
                memory_used_mib=int(4600 + 1900 * wave),
            )
    waited = [e for e in core.queue() if e.request.job_class.value == "interactive"]
    if not state["freed"] and waited and now - waited[0].request.submitted_at > WAIT_S:
        core.release(state["leases"][0])
        state["freed"] = True


def _load_jupyter_server_extension(serverapp):
    PeriodicCallback(tick, 1000).start()
'''


PANEL_SCENE = '''
"""Panel screenshot scene: GPU 2 drained; other users on all but one slice of GPUs 0-1,
each slice busy; two requests waiting."""

import math
import time

from tornado.ioloop import PeriodicCallback

from jupyter_gpubroker.broker.models import JobClass, Size
from jupyter_gpubroker.server import registry

HOLDERS = [("alice", "3g.71gb"), ("bob", "3g.71gb"), ("carol", "2g.35gb"), ("bob", "2g.35gb"),
           ("alice", "1g.18gb"), ("carol", "1g.18gb"), ("bob", "1g.18gb")]
WAITING = [("dave", "3g.71gb", "batch"), ("erin", "2g.35gb", "interactive")]
state = {"set": False}


def tick():
    broker = registry.current()
    if broker is None:
        return
    core, sim = broker.core, broker.backend.simulator
    if not state["set"]:
        third = next(g.uuid for g in core.placer.gpus.values() if g.index == 2)
        core.drain(third, "Xid 48: double-bit ECC error", "health")
        for user, profile in HOLDERS:
            core.submit(user, Size(profile=profile), holder="training")
        for user, profile, job_class in WAITING:
            core.submit(user, Size(profile=profile), job_class=JobClass(job_class), holder="sweep")
        state["set"] = True
    now = time.time()
    for i, lease in enumerate(core.leases()):
        for uuid in lease.devices:
            wave = math.sin(now / 5 + i) + 0.4 * math.sin(now / 1.7 + 2 * i)
            sim.set_load(uuid, utilization=int(max(3, min(99, 55 + 35 * wave))),
                         memory_used_mib=int(6000 + 2500 * wave))


def _load_jupyter_server_extension(serverapp):
    PeriodicCallback(tick, 1000).start()
'''


PANEL_PROFILE = "1g.18gb"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_setup(tmp: Path) -> dict[str, str]:
    """Kernelspecs, server and kernel config, Lab settings and the scene, under ``tmp``;
    returns the environment that points Jupyter at them."""
    from jupyter_gpubroker import kernelspec
    from jupyter_gpubroker.wire.sizes import Size

    for size in (None, Size(profile="1g.10gb")):
        kernelspec.install(size, prefix=str(tmp))
    config = tmp / "config"
    config.mkdir()
    (config / "jupyter_server_config.json").write_text(
        json.dumps(
            {
                "ServerApp": {"jpserver_extensions": {"gpubroker_screenshot_scene": True}},
                "GPUBroker": {
                    "owner": "ada",
                    "lease_ttl": 3600,
                    "typical_hold": {"interactive": "2h"},
                },
            }
        )
    )
    profile = tmp / "ipython" / "profile_default"
    profile.mkdir(parents=True)
    (profile / "ipython_kernel_config.py").write_text("c.GPUMagics.refresh_interval = 1.0\n")
    settings = tmp / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    (tmp / "gpubroker_screenshot_scene.py").write_text(textwrap.dedent(SCENE))
    return {
        **os.environ,
        **jupyter_dirs(tmp, TOKEN),
        "IPYTHONDIR": str(tmp / "ipython"),
        "GPUBROKER_SIMULATE": "dgx-h100-mig:1",
        "GPUBROKER_STATE_FILE": str(tmp / "state.sqlite"),
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(tmp), str(ROOT), os.environ.get("PYTHONPATH")])
        ),
    }


def wait_for_server(base: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 90
    while True:
        try:
            request = urllib.request.Request(f"{base}/api/status?token={TOKEN}")
            with urllib.request.urlopen(request, timeout=5):
                return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("JupyterLab did not start") from None
            time.sleep(0.5)


def run_tour(page: Page, out: Path) -> None:
    """Run the tour's cells one by one down to ``LAST_CELL``: capture the request's queue
    widget while it waits (``<out>-queued.png``), then, once the widgets have filled,
    the notebook from the request down (``out``)."""
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000)
    page.keyboard.press("Control+b")  # more room: hide the file browser
    cells = page.locator(".jp-Notebook .jp-Cell")
    cells.first.click()
    page.keyboard.press("Escape")  # command mode
    first = last = None
    for i in range(cells.count()):
        source = "".join(cells.nth(i).locator(".cm-content").all_text_contents())
        page.keyboard.press("Shift+Enter")
        if source.startswith(REQUEST_CELL):
            first = cells.nth(i)
            waiting = first.locator(".jp-OutputArea-output").get_by_text("Waiting for")
            waiting.wait_for(timeout=60_000)
            time.sleep(1.5)  # the requests ahead and the ETA
            first.locator(".jp-OutputArea-output").screenshot(
                path=str(out.with_name(f"{out.stem}-queued{out.suffix}"))
            )
        if source.startswith(LAST_CELL):
            last = cells.nth(i)
            break
    assert first is not None and last is not None, "the tour has no request or usage cell"
    last.get_by_text("My GPU-hours").wait_for(timeout=60_000)
    time.sleep(25)  # a sparkline's worth of readings
    top, bottom = first.bounding_box(), last.bounding_box()
    assert top is not None and bottom is not None
    page.screenshot(
        path=str(out),
        clip={
            "x": top["x"],
            "y": top["y"] - 8,
            "width": top["width"],
            "height": bottom["y"] + bottom["height"] - top["y"] + 16,
        },
    )


def capture_panel(page: Page, lab: Any, out_dir: Path) -> None:
    """Open a GPU notebook (it gets the last free slice) and a second one (it waits), show
    the panel, and capture it with the status bar in each theme."""
    from jupyter_gpubroker import kernelspec
    from jupyter_gpubroker.wire.sizes import Size

    kernel = kernelspec.spec_for(Size(profile=PANEL_PROFILE))[0]
    page.locator(".jp-SideBar [data-id='jp-gpubroker-panel']").click()
    handle = page.locator("#jp-main-split-panel > .lm-SplitPanel-handle").first.bounding_box()
    assert handle is not None  # widen the sidebar to 420 px
    page.mouse.move(handle["x"] + 1, handle["y"] + 300)
    page.mouse.down()
    page.mouse.move(420, handle["y"] + 300, steps=5)
    page.mouse.up()
    panel = page.locator("#jp-gpubroker-panel")
    panel.get_by_text("GPU 2 · H200-141GB").wait_for(timeout=60_000)
    for name in ("train.ipynb", "eval.ipynb"):
        lab.notebook(name, kernel)
        page.evaluate(f"jupyterapp.commands.execute('docmanager:open', {{path: '{name}'}})")
        time.sleep(4)
    panel.locator(".jp-GpuBroker-lease", has_text="train.ipynb").wait_for(timeout=60_000)
    panel.locator("tr.jp-GpuBroker-mine").wait_for(timeout=60_000)
    time.sleep(25)  # a sparkline's worth of readings (a readings event every 5 s)
    for theme, name in (("JupyterLab Light", "light"), ("JupyterLab Dark", "dark")):
        page.evaluate(f"jupyterapp.commands.execute('apputils:change-theme', {{theme: '{theme}'}})")
        time.sleep(3)
        viewport = page.viewport_size
        assert viewport is not None
        page.screenshot(
            path=str(out_dir / f"panel-{name}.png"),
            clip={"x": 0, "y": 0, "width": 900, "height": viewport["height"]},
        )
    page.locator("tr.jp-GpuBroker-mine button").click()  # withdraw the wait: a quick stop
    page.locator("tr.jp-GpuBroker-mine").wait_for(state="detached")


def launch(p: Any, chromium: str) -> Any:
    """Debian's Chromium, headless (Playwright downloads no browser of its own)."""
    return p.chromium.launch(
        executable_path=chromium,
        args=[
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ],
    )


def panel(chromium: str, out_dir: Path) -> None:
    """The panel's screenshots, on the UI tests' Lab (tests/ui/lab_server.py) with the
    panel scene and the checkout's build of the extension."""
    with tempfile.TemporaryDirectory(prefix="gpubroker-shot-") as tmp:
        lab = Lab(
            Path(tmp),
            BUILT,
            {"owner": "ada", "typical_hold": {"interactive": "2h", "batch": "8h"}},
            scene=PANEL_SCENE,
            ready=lambda overview: len(overview["leases"]) >= 7,
            simulate="h200-mig-balanced:3",
            profile=PANEL_PROFILE,
        )
        lab.start()
        try:
            with sync_playwright() as p:
                browser = launch(p, chromium)
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(f"{lab.url}/lab?token={LAB_TOKEN}&reset")
                capture_panel(page, lab, out_dir)
                browser.close()
        finally:
            lab.stop()
    print(f"wrote {out_dir / 'panel-light.png'} and {out_dir / 'panel-dark.png'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "docs" / "widgets.png",
        help="the image (default docs/widgets.png; the queue widget goes next to it, "
        "as widgets-queued.png)",
    )
    parser.add_argument(
        "--panel",
        action="store_true",
        help="the Lab GPU panel and status bar instead, light and dark "
        "(docs/panel-light.png, docs/panel-dark.png)",
    )
    args = parser.parse_args()
    if args.panel:
        panel(args.chromium, args.out.parent)
        return
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="gpubroker-shot-") as tmp:
        env = write_setup(Path(tmp))
        from jupyter_gpubroker.demo import TOUR  # the checkout's, on sys.path by write_setup

        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}"]
        notebooks = Path(tmp) / "notebooks"  # running the cells must not rewrite the tour
        notebooks.mkdir()
        shutil.copy(TOUR, notebooks)
        cmd += [f"--ServerApp.root_dir={notebooks}", "--ServerApp.ip=127.0.0.1"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-root")
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            wait_for_server(base, proc)
            with sync_playwright() as p:
                browser = launch(p, args.chromium)
                page = browser.new_page(viewport={"width": 960, "height": 2400})
                page.goto(f"{base}/lab/tree/{TOUR.name}?token={TOKEN}&reset")
                run_tour(page, args.out)
                browser.close()
        finally:
            proc.terminate()
            proc.wait(30)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
