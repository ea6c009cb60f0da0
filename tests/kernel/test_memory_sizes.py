"""``%gpu`` sizes as NVIDIA names them, on a simulated A100 40GB workstation (a 3g.20gb, a
2g.10gb and two 1g.5gb slices, and a whole A100 40GB): a request for 20 GB takes the
3g.20gb slice (19.5 GiB) that NVIDIA sells as 20 GB; an unknown profile is answered with
this machine's profiles, not NVIDIA's whole catalogue."""

from __future__ import annotations

from typing import Any

import pytest
from kernel_cells import one_line_error


@pytest.fixture
def broker_config(broker_config: dict[str, Any]) -> dict[str, Any]:
    return {**broker_config, "simulate": "workstation-a100"}


async def test_a_request_for_20_gb_takes_the_3g_20gb_slice(kernel, notebook, api):  # type: ignore[no-untyped-def]
    """It was read as 20 GiB, which the 3g.20gb slice lacks: the request took the whole
    A100 (or, with it busy, waited for it with "ETA unknown")."""
    kid = await kernel()
    nb = await notebook(kid, "%gpu request --min-memory 20GB")
    _, leases = await api("GET", "leases")
    (lease,) = leases["leases"]
    assert lease["profile"] == "3g.20gb"
    shown = nb.text(0).splitlines()
    assert shown[0] == "Holding at least 20 GB (interactive)"
    assert shown[1].startswith("GPU 0 / 3g.20gb@") and ", 20.9 GB (MIG-" in shown[1]


async def test_an_unknown_profile_lists_this_machines_profiles(kernel, notebook):  # type: ignore[no-untyped-def]
    kid = await kernel()
    nb = await notebook(kid, "%gpu request 1g.10g")
    assert one_line_error(nb, 0) == (
        "%gpu request: unknown MIG profile '1g.10g': this machine offers 1g.5gb, 2g.10gb, "
        "3g.20gb; or ask for --gpus N, or --min-memory 20GB"
    )
