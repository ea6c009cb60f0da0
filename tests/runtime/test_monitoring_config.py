"""c.GPUBroker's monitoring, health and reclaim traits: passed to the core, bad values refused."""

from __future__ import annotations

import pytest
from runtime_helpers import make
from traitlets import TraitError

from jupyter_gpubroker.api.rules import BrokerAPI
from jupyter_gpubroker.broker.health import SW_POWER_CAP
from jupyter_gpubroker.wire.errors import ConfigError


def test_traits_reach_the_reclaimer_and_the_health_judge(tmp_path) -> None:
    rt = make(
        tmp_path,
        idle_timeout=900.0,
        idle_timeout_by_class={"batch": 7200},
        idle_timeout_by_profile={"1g.5gb": 600},
        grace=60.0,
        stalled_timeout=0.0,
        idle_utilization_threshold=2.5,
        reclaim_exempt_users={"vip"},
        reclaim_exempt_groups={"oncall"},
        preemption=True,
        healthy_for=30.0,
        max_temperature=0.0,
        drain_on_power_cap=True,
        drain_xids=[79],
    )
    rt.start()
    try:
        assert rt.sampler is not None
        reclaim = rt.sampler.reclaimer.config
        assert reclaim.idle_timeout("1g.5gb", "batch") == 600
        assert reclaim.idle_timeout("gpu", "batch") == 7200
        assert reclaim.idle_timeout("gpu", "interactive") == 900
        assert (reclaim.grace_s, reclaim.stalled_timeout_s, reclaim.utilization_threshold) == (
            60,
            0,
            2.5,
        )
        assert reclaim.exempt_users == {"vip"} and reclaim.exempt_groups == {"oncall"}
        assert reclaim.preemption
        health = rt.sampler.health.config
        assert health.max_temperature_c is None and health.healthy_for_s == 30
        assert health.drain_clock_reasons & SW_POWER_CAP and health.drain_xids == {79}
    finally:
        rt.stop()


@pytest.mark.parametrize(
    "trait, value",
    [
        ("idle_timeout", -1.0),
        ("grace", -5.0),
        ("sample_interval", 0.0),
        ("idle_utilization_threshold", 120.0),
        ("idle_timeout_by_class", {"urgent": 60}),
        ("idle_timeout_by_class", {"batch": -60}),
        ("idle_timeout_by_profile", {"9g.99gb": 60}),
        ("idle_timeout_by_profile", {"gpu:0": 60}),
        ("server_idle_timeout", -1.0),
        ("server_idle_timeout", float("inf")),
        ("server_idle_timeout_by_profile", {"gpus": 60}),
        ("server_idle_timeout_by_profile", {"1g.10gb": -1}),
        ("reclaim_action", "kill"),
        ("alert_temperature", 0.0),
        ("alert_temperature_critical", -1.0),
        ("alert_memory_percent", 0.0),
        ("alert_memory_percent", 101.0),
        ("alert_clear_after", -1.0),
        ("alert_history_days", 0.0),
    ],
)
def test_bad_values_are_refused(tmp_path, trait: str, value: object) -> None:
    with pytest.raises(TraitError):
        make(tmp_path, **{trait: value}).start()


def test_alert_traits_reach_the_alert_judge_and_its_history_outlives_a_restart(tmp_path) -> None:
    traits = dict(
        alert_temperature=70.0,
        alert_temperature_critical=80.0,
        alert_memory_percent=90.0,
        alert_clear_after=0.0,
        alert_history_days=7.0,
        drain_xids=[79],
    )
    rt = make(tmp_path, **traits)
    rt.start()
    try:
        assert rt.sampler is not None and rt.sampler.alerts is not None
        config = rt.sampler.alerts.config
        assert (config.temperature_warning_c, config.temperature_critical_c) == (70, 80)
        assert (config.memory_full_percent, config.clear_after_s) == (90, 0)
        assert config.history_kept_s == 7 * 86400 and config.xids == {79}
        gpu = rt.core.inventory.gpus[0].uuid
        rt.backend.simulator.inject_overheat(gpu, 95)  # type: ignore[union-attr]
        rt.sampler.sample()
        rt.backend.simulator.clear_faults(gpu)  # type: ignore[union-attr]
        rt.sampler.sample()
        rt.backend.simulator.inject_power_cap(gpu)  # type: ignore[union-attr]
        rt.sampler.sample()
    finally:
        rt.stop()
    again = make(tmp_path, **traits)
    again.start()
    try:
        api = BrokerAPI(again)
        seen = api.alerts(api.identify(again.owner))
        assert [(a["kind"], a["ended"] is None) for a in seen["active"]] == [("power_cap", True)]
        assert [(a["kind"], a["severity"]) for a in seen["history"]] == [
            ("temperature", "critical")
        ]
    finally:
        again.stop()


def test_a_warning_temperature_at_or_above_the_critical_one_is_refused(tmp_path) -> None:
    rt = make(tmp_path, alert_temperature=90.0, alert_temperature_critical=90.0)
    with pytest.raises(ConfigError, match="below the critical one"):
        rt.start()


def test_gpu_servers_have_timeouts_of_their_own_per_profile_and_whole_gpu_count(
    tmp_path,
) -> None:
    rt = make(
        tmp_path,
        idle_timeout=900.0,
        idle_timeout_by_profile={"gpu:2": 300},
        server_idle_timeout=7200.0,
        server_idle_timeout_by_profile={"1g.10gb": 1800, "gpu:8": 600, "gpu": 3600},
    )
    rt.start()
    try:
        assert rt.sampler is not None
        reclaim = rt.sampler.reclaimer.config
        assert reclaim.idle_timeout("1g.10gb", "interactive", server=True) == 1800
        assert reclaim.idle_timeout("gpu", "interactive", 8, server=True) == 600
        assert reclaim.idle_timeout("gpu", "interactive", 2, server=True) == 3600
        assert reclaim.idle_timeout("2g.20gb", "batch", server=True) == 7200
        # a kernel's lease keeps the kernels' timeouts
        assert reclaim.idle_timeout("1g.10gb", "interactive") == 900
        assert reclaim.idle_timeout("gpu", "interactive", 2) == 300
    finally:
        rt.stop()


def test_a_servers_timeout_falls_back_to_a_kernels(tmp_path) -> None:
    rt = make(tmp_path, idle_timeout=900.0, idle_timeout_by_class={"batch": 60})
    rt.start()
    try:
        assert rt.sampler is not None
        reclaim = rt.sampler.reclaimer.config
        assert reclaim.idle_timeout("1g.10gb", "batch", server=True) == 60
        assert reclaim.idle_timeout("1g.10gb", "interactive", server=True) == 900
    finally:
        rt.stop()
