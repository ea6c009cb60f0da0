"""Monitoring through a real server: the broker's Prometheus metrics at the server's own
/metrics (authenticated), a GPU's health and drain state in the API, its health alerts
(the API, the event stream, the metrics) and the shipped Prometheus rules and Grafana
dashboard, whose every metric name the live server exports."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from openapi_check import EventStream, validate
from prometheus_client.parser import text_string_to_metric_families
from shipped_monitoring import metric_names
from tornado.httpclient import HTTPClientError

from jupyter_gpubroker.api import API_PREFIX
from jupyter_gpubroker.nvml.backend import GPM_MIN_INTERVAL_S


@pytest.fixture
def broker_config(broker_config: dict[str, Any]) -> dict[str, Any]:
    return {**broker_config, "alert_clear_after": 0.0}  # an alert ends at once when clear


async def scrape(jp_fetch: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = await jp_fetch("metrics")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.body.decode())
        for s in family.samples
        if s.name.startswith("gpubroker_")
    }


async def test_metrics_endpoint_matches_the_api(jp_fetch: Any, jp_serverapp: Any, api: Any) -> None:
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    for _ in range(3):
        assert (await api("POST", "requests", {"profile": "1g.10gb"}))[0] == 201
    await runtime.sample()
    metrics = await scrape(jp_fetch)
    _, devices = await api("GET", "devices")
    (gpu,) = devices["gpus"]
    held = [d for d in gpu["devices"] if d["holder"]]
    assert metrics[("gpubroker_devices", (("profile", "1g.10gb"), ("state", "held")))] == 3
    assert metrics[("gpubroker_devices", (("profile", "1g.10gb"), ("state", "free")))] == 4
    for d in gpu["devices"]:
        labels = (("gpu", "0"), ("profile", "1g.10gb"), ("uuid", d["uuid"]))
        assert metrics[("gpubroker_device_allocated", labels)] == (d in held)
    gpu_labels = (("gpu", "0"), ("uuid", gpu["uuid"]))
    assert metrics[("gpubroker_gpu_healthy", gpu_labels)] == 1
    assert metrics[("gpubroker_gpu_temperature_celsius", gpu_labels)] == pytest.approx(
        gpu["temperature_c"], abs=2
    )
    assert metrics[("gpubroker_grants_total", ())] == 3
    assert metrics[("gpubroker_queue_length", (("job_class", "interactive"),))] == 0

    with pytest.raises(HTTPClientError) as refused:  # jupyter-server's own auth applies
        await jp_fetch("metrics", headers={"Authorization": ""})
    assert refused.value.code == 403


async def test_an_overheated_gpu_is_drained_in_the_api(
    jp_fetch: Any, jp_serverapp: Any, api: Any, jp_http_port: int, jp_base_url: str
) -> None:
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    _, held = await api("POST", "requests", {"profile": "1g.10gb", "holder": "k1"})
    _, devices = await api("GET", "devices")
    gpu = devices["gpus"][0]["uuid"]
    assert devices["gpus"][0]["drained"] is None
    token = jp_serverapp.identity_provider.token
    stream = await EventStream.open(
        jp_http_port, f"{jp_base_url}{API_PREFIX}/events", {"Authorization": f"token {token}"}
    )
    try:
        assert (await stream.next())["type"] == "hello"
        runtime.backend.simulator.inject_overheat(gpu, 95)
        await runtime.sample()
        drained = []
        while len(drained) < 2:  # the machine's, then the holder's
            event = await stream.next()
            validate(event, "#/components/schemas/Event", "event")
            if event["type"] == "drained":
                drained.append(event["data"])
    finally:
        stream.close()
    assert [(e["user"], e["lease_id"]) for e in drained] == [
        ("", None),
        (held["user"], held["lease_id"]),
    ]
    assert drained[0]["device"] == gpu
    status, devices = await api("GET", "devices")
    validate(devices, "#/components/schemas/Devices", "devices")
    (drained,) = devices["gpus"]
    assert "temperature 95 C" in drained["drained"]["reason"]
    assert all(d["drained"] == drained["drained"] for d in drained["devices"])
    status, r = await api("POST", "requests", {"profile": "1g.10gb"})
    assert (status, r["state"]) == (201, "queued")  # nothing is granted on it
    metrics = await scrape(jp_fetch)
    assert metrics[("gpubroker_gpu_healthy", (("gpu", "0"), ("uuid", gpu)))] == 0
    assert metrics[("gpubroker_devices", (("profile", "1g.10gb"), ("state", "drained")))] == 7
    assert (
        metrics[
            (
                "gpubroker_device_allocated",
                (("gpu", "0"), ("profile", "1g.10gb"), ("uuid", held["lease"]["devices"][0])),
            )
        ]
        == 1
    )


async def test_an_alert_starts_and_ends_in_the_api_the_stream_and_the_metrics(
    jp_fetch: Any, jp_serverapp: Any, api: Any, jp_http_port: int, jp_base_url: str
) -> None:
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    sim = runtime.backend.simulator
    (gpu,) = (await api("GET", "devices"))[1]["gpus"]
    slice_ = gpu["devices"][3]
    token = jp_serverapp.identity_provider.token
    stream = await EventStream.open(
        jp_http_port, f"{jp_base_url}{API_PREFIX}/events", {"Authorization": f"token {token}"}
    )
    try:
        assert (await stream.next())["type"] == "hello"
        sim.inject_power_cap(gpu["uuid"])
        sim.set_load(slice_["uuid"], memory_used_mib=slice_["memory_mib"])
        await runtime.sample()
        started = [await stream.next(), await stream.next()]
        metrics = await scrape(jp_fetch)
        sim.clear_faults(gpu["uuid"])
        sim.set_load(slice_["uuid"], memory_used_mib=0)
        await runtime.sample()
        ended = [await stream.next(), await stream.next()]
    finally:
        stream.close()
    for event in started + ended:
        validate(event, "#/components/schemas/Event", "an alert event")
    assert [(e["type"], e["data"]["state"]) for e in started + ended] == [
        ("alert", "started")
    ] * 2 + [("alert", "ended")] * 2
    alerts = {e["data"]["alert"]["kind"]: e["data"]["alert"] for e in started}
    assert alerts["power_cap"]["message"] == (
        "GPU 0 is held at its power limit of 700 W, so its clocks are slowed down."
    )
    assert (alerts["memory"]["uuid"], alerts["memory"]["label"]) == (
        slice_["uuid"],
        slice_["label"],
    )
    assert alerts["memory"]["message"].startswith(f"{slice_['label']} has 10.4 of 10.4 GB")
    gpu_labels = (("gpu", "0"), ("uuid", gpu["uuid"]))
    power_cap = (("gpu", "0"), ("reason", "power_cap"), ("uuid", gpu["uuid"]))
    assert metrics[("gpubroker_gpu_clocks_event_reason", power_cap)] == 1
    assert metrics[("gpubroker_gpu_temperature_slowdown_celsius", gpu_labels)] == 89
    alert_labels = (("kind", "power_cap"), ("severity", "warning"), ("uuid", gpu["uuid"]))
    assert metrics[("gpubroker_alert_active", alert_labels)] == 1

    status, listed = await api("GET", "alerts")
    validate(listed, "#/components/schemas/Alerts", "alerts")
    assert status == 200 and listed["active"] == []
    assert {a["kind"]: a["ended"] is not None for a in listed["history"]} == {
        "power_cap": True,
        "memory": True,
    }
    assert ("gpubroker_alert_active", alert_labels) not in await scrape(jp_fetch)


async def test_every_metric_the_rules_and_the_dashboard_use_is_exported(
    jp_fetch: Any, jp_serverapp: Any, api: Any
) -> None:
    """With an alert on, a hardware error counted, a lease reclaimed and the slices' GPM
    read twice, every name the shipped rules and dashboard query has samples in the
    live /metrics."""
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    _, granted = await api("POST", "requests", {"profile": "1g.10gb"})
    runtime.core.reclaim(granted["lease_id"], "a test", cause="admin")
    await runtime.sample()  # registers for NVML's events
    (gpu,) = (await api("GET", "devices"))[1]["gpus"]
    runtime.backend.simulator.inject_xid(gpu["uuid"], 79)
    await asyncio.sleep(GPM_MIN_INTERVAL_S)  # a MIG slice's utilization: GPM, between samples
    await runtime.sample()
    exported = {name for name, _ in await scrape(jp_fetch)}
    used = metric_names()
    assert len(used) > 15 and not used - exported, f"not exported: {sorted(used - exported)}"
