"""A Lab whose GPU broker cannot run (a typo in its configuration), in Chromium: the GPU
panel says why in the broker's own sentence, as the API's 503 gives it, instead of
"Connecting to the GPU broker…" for ever."""

from __future__ import annotations

import json
import urllib.error
from pathlib import Path
from typing import Any

import pytest
from lab_server import TOKEN, Lab

pytestmark = pytest.mark.slow  # a real Lab and a browser

WAIT_MS = 60_000


class UnavailableLab(Lab):
    """A Lab whose API answers 503 with the reason (its body, returned as the answer)."""

    def api(self, method: str, path: str, body: Any = None) -> Any:
        try:
            return super().api(method, path, body)
        except urllib.error.HTTPError as e:
            if e.code != 503:
                raise
            return json.loads(e.read())


def test_the_panel_says_why_the_broker_cannot_run(
    tmp_path: Path, built_extension: Path, browser: Any
) -> None:
    lab = UnavailableLab(
        tmp_path,
        built_extension,
        {},
        simulate="dgx-h100-migg",
        ready=lambda answer: "message" in answer,
    )
    lab.start()
    try:
        why = lab.api("GET", "overview")["message"]
        assert "unknown simulated topology 'dgx-h100-migg'" in why
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{lab.url}/lab?token={TOKEN}&reset")
        page.locator(".jp-SideBar [data-id='jp-gpubroker-panel']").click()
        panel = page.locator("#jp-gpubroker-panel")
        panel.get_by_text("unknown simulated topology 'dgx-h100-migg'").wait_for(timeout=WAIT_MS)
        assert "Connecting to the GPU broker" not in panel.inner_text()
    finally:
        lab.stop()
