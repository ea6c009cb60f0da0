"""A share no GPU here could take, asked for through the HTTP API of a real jupyter-server
with the embedded broker: each refused in one sentence that says why, and nothing queued
or held for it (issue 46's bad input)."""

from __future__ import annotations

from typing import Any

import pytest

SHARED_L40S = {"simulate": "l40s-4:1", "sharing": "shared"}
WHOLE_L40S = {"simulate": "l40s-4:1", "sharing": "whole"}
SHARED_MIG = {"simulate": "dgx-h100-mig:1", "sharing": "shared"}  # each GPU cut into slices


@pytest.fixture
def machine(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The broker's simulated GPUs and how they are lent (the test's parameter)."""
    return dict(request.param)


@pytest.fixture
def jp_server_config(jp_server_config: dict[str, Any], machine: dict[str, Any]) -> dict[str, Any]:
    return {**jp_server_config, "GPUBroker": {**jp_server_config["GPUBroker"], **machine}}


@pytest.mark.parametrize(
    ("machine", "body", "status", "error", "sentence"),
    [
        pytest.param(
            SHARED_L40S,
            {"share_gb": 60},
            422,
            "unsatisfiable",
            "no GPU shared here has 60 GB; the largest has 48.3 GB",
            id="larger-than-any-gpu",
        ),
        pytest.param(
            WHOLE_L40S,
            {"share_gb": 8},
            422,
            "unsatisfiable",
            "no GPU here is shared: the admin lends them whole only; ask for a whole GPU, or "
            "for a GPU of at least 8 GB, instead",
            id="whole-only-machine",
        ),
        pytest.param(
            SHARED_L40S,
            {"share_gb": 8, "compute_percent": 150},
            400,
            "invalid_request",
            "the compute share must be a whole percent from 1 to 100, not 150",
            id="compute-over-100",
        ),
        pytest.param(
            SHARED_MIG,
            {"profile": "1g.10gb", "share_gb": 4},
            400,
            "invalid_request",
            "a MIG slice is never shared: ask for the slice itself, or for part of a GPU "
            "without MIG",
            id="share-of-a-slice",
        ),
        pytest.param(
            SHARED_MIG,
            {"share_gb": 4},
            422,
            "unsatisfiable",
            "no GPU here is shared: each is cut into MIG slices, and a slice is never shared; "
            "ask for a slice (1g.10gb) instead",
            id="share-on-a-mig-machine",
        ),
    ],
    indirect=["machine"],
)
async def test_a_share_no_gpu_could_take_is_refused_in_a_sentence(
    jp_serverapp, api, machine, body, status, error, sentence
):
    code, reply = await api("POST", "requests", body)
    assert (code, reply.get("error"), reply.get("message")) == (status, error, sentence)
    code, queue = await api("GET", "queue")
    assert code == 200 and queue["queue"] == []
    code, leases = await api("GET", "leases")
    assert code == 200 and leases["leases"] == []
