"""Schemathesis over ``api/openapi.yaml`` against a real ``jupyter server``.

Every documented operation (but the endless event stream, tested in test_openapi.py) is
called with inputs generated from the document, valid and invalid, a fixed number per
operation and the same ones on every run. No answer may be a server error, and every
answer must be one the document lists, with a body of its schema. Afterwards the server
still answers and a restart on the same state file loads it.
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from live_server import LiveServer
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

try:
    from schemathesis.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )
except ImportError:  # schemathesis < 4.2 exports them from its OpenAPI module only
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

EXAMPLES = 30
"""Generated calls per operation and generation mode (valid, invalid)."""
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]

DOCUMENT = resources.files("jupyter_gpubroker.api").joinpath("openapi.yaml")
schema = schemathesis.openapi.from_path(str(DOCUMENT)).exclude(path="/events")
schema.config.generation.update(
    modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
    max_examples=EXAMPLES,
    with_security_parameters=False,  # every call carries the Jupyter token: get past auth
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    home = tmp_path_factory.mktemp("schemathesis")
    live = LiveServer(home, home / "state.sqlite", lease_ttl=3600, user_groups="{'root': ['lab']}")
    live.start()
    try:
        yield live
    finally:
        live.stop()


@pytest.mark.slow
@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_generated_call_is_a_server_error(case: schemathesis.Case, server: LiveServer) -> None:
    response = case.call(base_url=server.base, headers=server.headers, timeout=30)
    case.validate_response(response, checks=CHECKS)


READ_TIME_FIELDS = ("expires_at", "eta", "eta_range")
"""What a request says that depends on when it is read: a start gives each queued request
a fresh TTL (its holder may not have reached the broker while it was down), and the ETA
is reckoned from now."""


def kept(request: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in request.items() if k not in READ_TIME_FIELDS}


@pytest.mark.slow
def test_the_fuzzed_state_file_still_loads(server: LiveServer) -> None:
    """Nothing the generated calls did left the file half-written."""
    status, before = server.call("GET", "requests")
    assert status == 200
    server.stop()
    server.start()
    status, after = server.call("GET", "requests")
    assert status == 200
    assert [kept(r) for r in after["requests"]] == [kept(r) for r in before["requests"]]
    # a start renews a TTL, never cuts one
    for was, now in zip(before["requests"], after["requests"], strict=True):
        assert was["expires_at"] is None or now["expires_at"] >= was["expires_at"]
    assert server.call("GET", "quotas")[0] == 200
    assert Path(server.state_file).exists()


@pytest.fixture(autouse=True)
def _listening() -> None:
    """No in-process server (tests/server/conftest.py's): these call a real one."""
