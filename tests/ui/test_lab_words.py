"""What a person reads in a real Lab (Chromium), on a simulated DGX H100 whose 56 slices
other users hold all but one of: a GPU notebook whose idle kernel a reclaim shut down says
so above its cells and in a notification, each with "Start the kernel again", which starts
it again and gets its GPU back through the queue; the status bar speaks of the notebook in
front ("queue 2 of 2"), not of my best place elsewhere; the queue table wraps its words
whole at the sidebar's default width; and, on a machine of whole GPUs, a whole GPU reads
"1 GPU" on the panel's card and in the status bar.

Screenshots go to ``$GPUBROKER_SCREENSHOTS`` (default: the test's temporary dir)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from lab_server import TOKEN, Lab
from test_lab_panel import WAIT_MS, open_notebook, open_panel

from jupyter_gpubroker import kernelspec
from jupyter_gpubroker.wire.sizes import Size

pytestmark = pytest.mark.slow  # a real Lab and a browser

ON_DEMAND = kernelspec.spec_for(None)[0]
WHOLE_GPU = kernelspec.spec_for(Size(gpus=1))[0]
NO_SCENE = """
def _load_jupyter_server_extension(serverapp):
    pass
"""
"""A Lab of no other users."""
SPLIT_WORDS = """table => {
  // the words of the table's cells that a line break cuts in two
  const cut = [];
  for (const td of table.querySelectorAll('td')) {
    const walker = document.createTreeWalker(td, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const re = /\\S+/g;
      for (let m = re.exec(node.data); m; m = re.exec(node.data)) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const lines = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
        if (lines.size > 1) cut.push(m[0]);
      }
    }
  }
  return cut;
}"""


@pytest.fixture
def lab_config() -> dict[str, Any]:
    # an idle notebook kernel is warned after 8 s and reclaimed 4 s later
    return {"sample_interval": 1.0, "idle_timeout": 8.0, "grace": 4.0}


def test_a_reclaimed_kernel_says_so_in_its_notebook_and_starts_again_from_a_button(
    lab: Lab, page: Any, shots: Path
) -> None:
    """It showed only "No Kernel", and a toast "GPU reclaimed: idle for 1 min: ..."."""
    panel = open_panel(page)
    open_notebook(page, lab, "train.ipynb")  # takes the free slice
    panel.locator(".jp-GpuBroker-lease", has_text="train.ipynb").wait_for(timeout=WAIT_MS)
    bar = page.locator(".jp-NotebookPanel .jp-GpuBroker-reclaimed")
    bar.wait_for(timeout=WAIT_MS)
    said = bar.inner_text()
    assert said.startswith("Its GPU was reclaimed (idle for ")
    assert (
        "and its kernel shut down: its variables are gone. Start the kernel again: it asks "
        "for its GPU again and waits in the queue like any request." in said
    )
    told = "train.ipynb: its GPU was reclaimed (idle for"
    toast = page.locator(".Toastify__toast", has_text=told)
    toast.wait_for(timeout=WAIT_MS)
    assert toast.get_by_role("button", name="Start the kernel again").count() == 1
    page.wait_for_timeout(1500)  # the toasts slide in
    page.screenshot(path=str(shots / "lab-reclaimed-kernel.png"))

    assert " and its kernel shut down; start it again to get a GPU back." in toast.inner_text()
    bar.get_by_role("button", name="Start the kernel again").click()
    bar.wait_for(state="detached", timeout=WAIT_MS)
    page.wait_for_timeout(1000)
    dialog = page.locator(".jp-Dialog")
    assert not dialog.count(), dialog.first.inner_text()  # no error, no "Select Kernel"
    # a cell run now waits for the new kernel and keeps it busy: not reclaimed again
    page.locator(".jp-Notebook .jp-Cell .cm-content").first.click()
    page.keyboard.type("import time; time.sleep(120)")
    page.keyboard.press("Shift+Enter")
    # a new kernel, which asked for its GPU again: the freed slice is its lease
    lease = panel.locator(".jp-GpuBroker-lease", has_text="train.ipynb")
    lease.wait_for(timeout=WAIT_MS)
    sessions = lab.call("GET", "api/sessions")
    assert [s["path"] for s in sessions if s["kernel"]] == ["train.ipynb"]
    page.screenshot(path=str(shots / "lab-reclaimed-kernel-started-again.png"))


def test_the_status_bar_speaks_of_the_notebook_in_front_and_the_queue_wraps_whole_words(
    tmp_path: Path, built_extension: Path, browser: Any, shots: Path
) -> None:
    """The bar showed my best place ("queue #1") in a notebook whose own request was 2 of
    2; the queue table broke "interactive", "unknown" and user names mid-word."""
    lab = Lab(tmp_path, built_extension, {"sample_interval": 1.0})
    lab.start()
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{lab.url}/lab?token={TOKEN}&reset")
        panel = open_panel(page)
        lab.api("POST", "requests", {"profile": "1g.10gb", "holder": "batch-job"})  # the free one
        for name in ("first.ipynb", "second.ipynb"):
            lab.notebook(name, ON_DEMAND)  # a kernel with no GPU; it asks below
            page.evaluate(
                f"window.jupyterapp.commands.execute('docmanager:open', {{path: '{name}'}})"
            )
        kernels = wait_for_kernels(lab, ["first.ipynb", "second.ipynb"])
        for name in ("first.ipynb", "second.ipynb"):  # as %gpu request would, in order
            lab.api("POST", "requests", {"profile": "1g.10gb", "holder": kernels[name]})
        table = panel.locator("table.jp-GpuBroker-queue")
        table.locator("tr.jp-GpuBroker-mine").nth(1).wait_for(timeout=WAIT_MS)
        assert table.evaluate(SPLIT_WORDS) == []  # at the sidebar's default width
        box, cancel = panel.bounding_box(), table.get_by_role("button", name="Cancel").first
        button = cancel.bounding_box()
        assert box is not None and button is not None
        assert button["x"] + button["width"] <= box["x"] + box["width"]  # still inside
        panel.screenshot(path=str(shots / "lab-panel-queue.png"))

        page.locator(".lm-TabBar-tab", has_text="second.ipynb").click()
        status = page.locator(".jp-GpuBroker-status")
        status.get_by_text("GPU queue 2 of 2, ETA").wait_for(timeout=WAIT_MS)
        page.locator(".lm-TabBar-tab", has_text="first.ipynb").click()
        status.get_by_text("GPU queue 1 of 2, ETA").wait_for(timeout=WAIT_MS)
        page.screenshot(path=str(shots / "lab-status-bar-queue.png"))
    finally:
        lab.stop()


def wait_for_kernels(lab: Lab, paths: list[str]) -> dict[str, str]:
    """The kernel id of each notebook, once each has one."""
    for _ in range(300):
        found = {
            s["path"]: s["kernel"]["id"] for s in lab.call("GET", "api/sessions") if s["kernel"]
        }
        if all(p in found for p in paths):
            return found
        time.sleep(0.2)
    raise AssertionError(f"no kernels for {paths}")


def test_a_whole_gpu_reads_one_gpu_on_its_card_and_in_the_status_bar(
    tmp_path: Path, built_extension: Path, browser: Any, shots: Path
) -> None:
    """The card said "gpu · GPU 1" and the status bar "GPU 1 GPU 0%"."""
    kernelspec.install(Size(gpus=1), prefix=str(tmp_path))
    lab = Lab(
        tmp_path,
        built_extension,
        {"sample_interval": 1.0},
        scene=NO_SCENE,
        ready=lambda o: True,
        simulate="dgx-h100",
    )
    lab.start()
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{lab.url}/lab?token={TOKEN}&reset")
        panel = open_panel(page)
        lab.notebook("whole.ipynb", WHOLE_GPU)
        page.evaluate(
            "window.jupyterapp.commands.execute('docmanager:open', {path: 'whole.ipynb'})"
        )
        card = panel.locator(".jp-GpuBroker-lease", has_text="whole.ipynb")
        card.wait_for(timeout=WAIT_MS)
        assert card.locator(".jp-GpuBroker-leaseDevice").inner_text().startswith("1 GPU · GPU ")
        page.locator(".jp-GpuBroker-status").get_by_text("1 GPU ").wait_for(timeout=WAIT_MS)
        assert not page.locator(".jp-GpuBroker-status").inner_text().startswith("GPU 1 GPU")
        page.screenshot(path=str(shots / "lab-whole-gpu.png"))
    finally:
        lab.stop()
