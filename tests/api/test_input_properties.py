"""Property tests of every number the API takes: whatever JSON a caller puts in a
numeric field (integers too large for a float, 1e308, NaN, subnormals, text, lists,
objects), the answer is the broker's own: success, or a typed error (a 400 most often)
in a sentence a person reads. Never an uncaught exception (a 500), never a number of
400 digits read back (``bad_values``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from bad_values import JSON, reads_as_a_sentence
from hypothesis import HealthCheck, given, settings

from jupyter_gpubroker.api.identity import Identity
from jupyter_gpubroker.api.rules import BrokerAPI
from jupyter_gpubroker.wire.errors import BrokerError

SLICE = {"profile": "1g.10gb"}
Call = Callable[[BrokerAPI, Identity, str, Any], Any]
FIELDS: dict[str, Call] = {
    "gpus": lambda api, me, lease, v: api.submit(me, {"gpus": v}),
    "min_memory_gb": lambda api, me, lease, v: api.submit(me, {"min_memory_gb": v}),
    "expected_duration_s": lambda api, me, lease, v: api.submit(
        me, {**SLICE, "expected_duration_s": v}
    ),
    "limit_s": lambda api, me, lease, v: api.submit(me, {**SLICE, "limit_s": v}),
    "seconds": lambda api, me, lease, v: api.extend(me, lease, {"seconds": v}),
    "holder_pid": lambda api, me, lease, v: api.renew(me, lease, {"holder_pid": v}),
    "share": lambda api, me, lease, v: api.set_quota(me, "user", "ann", {"share": v}),
    "max_gpus": lambda api, me, lease, v: api.set_quota(me, "user", "ann", {"max_gpus": v}),
    "gpu_hours": lambda api, me, lease, v: api.set_quota(
        me, "group", "lab", {"gpu_hours": v, "period_s": 3600}
    ),
    "period_s": lambda api, me, lease, v: api.set_quota(
        me, "group", "lab", {"gpu_hours": 1, "period_s": v}
    ),
    "default_s": lambda api, me, lease, v: api.set_limits(me, "group", "lab", {"default_s": v}),
    "max_s": lambda api, me, lease, v: api.set_limits(me, "group", "lab", {"max_s": v}),
    "required": lambda api, me, lease, v: api.set_limits(me, "group", "lab", {"required": v}),
    "audit after": lambda api, me, lease, v: api.audit(me, after=str(v)),
    "alerts before": lambda api, me, lease, v: api.alerts(me, before=str(v)),
    "usage since": lambda api, me, lease, v: api.usage(me, since=str(v)),
}
"""Each numeric field (and query argument) of the API, called with a value."""


@pytest.mark.parametrize("field", FIELDS)
def test_no_value_of_a_numeric_field_is_a_server_error_or_unreadable(
    start: Callable[..., BrokerAPI], field: str
) -> None:
    api = start(max_time_limit={"interactive": "4h"})
    me = api.user_identity(None)
    lease = api.submit(me, {**SLICE, "holder": "held", "limit_s": 3600})["lease"]["id"]

    @settings(
        max_examples=150,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(value=JSON)
    def answered(value: Any) -> None:
        try:
            FIELDS[field](api, me, lease, value)
        except BrokerError as e:  # typed: its status, never a 500
            assert e.status < 500, (value, e.message)
            if field != "holder_pid":  # its check is another change's
                assert reads_as_a_sentence(e.message), (value, e.message)

    answered()
