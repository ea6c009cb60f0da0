"""The tour the demo opens (package data), executed top to bottom against the test server."""

from __future__ import annotations

import ast

import nbformat

from jupyter_gpubroker.demo import TOUR
from jupyter_gpubroker.kernelspec import spec_for

WIDGET = "application/vnd.jupyter.widget-view+json"


async def test_the_tour_runs_without_errors_and_shows_the_widgets(kernel, notebook, api):
    nb = nbformat.read(TOUR, as_version=4)
    assert nb.metadata.kernelspec.name == spec_for(None)[0]  # the demo's on-demand kernel
    executed = await notebook(await kernel(), nb=nb, allow_errors=False)

    shown = {
        c.source.splitlines()[0]: o["data"]
        for c in executed.nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o["output_type"] in ("display_data", "execute_result")
    }
    assert shown["%gpu status"] == {"text/plain": shown["%gpu status"]["text/plain"]}
    assert "holds no GPU" in shown["%gpu status"]["text/plain"]  # before the request
    for cell in ("%gpu request 1g.10gb", "%gpu queue", "%gpu usage"):
        assert WIDGET in shown[cell], cell
    assert shown["%gpu request 1g.10gb"]["text/plain"].startswith("Holding 1g.10gb")
    lease = ast.literal_eval(shown["lease = %gpu status"]["text/plain"])
    assert set(lease) == {"devices", "profile", "expires_at"} and lease["profile"] == "1g.10gb"
    assert shown["%gpu release"]["text/plain"].startswith("Released MIG-")
    assert executed.stdout(len(executed.nb.cells) - 1).startswith("usage: %gpu")  # --help
    _, leases = await api("GET", "leases")
    assert leases["leases"] == []
