"""Health alerts from the sampling pass, on the simulated NVML driven into each condition:
each alert appears with its sentence, lasts while its condition does, ends once the
condition stayed clear for the debounce interval (and not before), and is kept in the
state file across a restart."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sim_machine import INTERVAL, Machine

from jupyter_gpubroker.broker.alerts import AlertConfig, AlertJudge
from jupyter_gpubroker.broker.clock import VirtualClock
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.nvml.simulated import SimulatedNvml

CLEAR = 30.0
CONFIG = AlertConfig(clear_after_s=CLEAR)


def overheat(c: int) -> Callable[[SimulatedNvml, str], None]:
    return lambda sim, uuid: sim.inject_overheat(uuid, c)


def fill_memory(sim: SimulatedNvml, uuid: str) -> None:
    sim.set_load(uuid, memory_used_mib=int(81559 * 0.97))


CONDITIONS = {
    "slowdown": (
        overheat(90),
        "temperature",
        "warning",
        "GPU 0 is at 90 C, at or above its slowdown temperature of 89 C: it runs slower to "
        "cool down; check its cooling.",
    ),
    "shutdown": (
        overheat(95),
        "temperature",
        "critical",
        "GPU 0 is at 95 C, at or above its shutdown temperature of 92 C: it may switch itself "
        "off; check its cooling now.",
    ),
    "power cap": (
        SimulatedNvml.inject_power_cap,
        "power_cap",
        "warning",
        "GPU 0 is held at its power limit of 700 W, so its clocks are slowed down.",
    ),
    "ecc": (
        SimulatedNvml.inject_ecc_error,
        "ecc",
        "critical",
        "GPU 0 had an uncorrectable (double-bit) ECC error: data in its memory may be corrupt; "
        "drain it and reset the GPU.",
    ),
    "xid": (
        lambda sim, uuid: sim.inject_xid(uuid, 79),
        "xid",
        "critical",
        "GPU 0 raised Xid 79 (the GPU fell off the bus): see NVIDIA's Xid catalog for what to "
        "do; it usually needs a GPU reset.",
    ),
    "lost": (
        SimulatedNvml.inject_gpu_lost,
        "lost",
        "critical",
        "GPU 0 is lost: it fell off the bus, its work is gone and it needs a reset or a reboot.",
    ),
    "memory": (
        fill_memory,
        "memory",
        "warning",
        "GPU 0 has 82.9 of 85.5 GB of memory in use (97%, alert at 95%): its next allocation "
        "may fail.",
    ),
}


def clear(sim: SimulatedNvml, uuid: str) -> None:
    sim.clear_faults(uuid)
    sim.set_load(uuid, memory_used_mib=0)


@pytest.mark.parametrize("condition", CONDITIONS, ids=list(CONDITIONS))
def test_each_condition_raises_its_alert_which_ends_once_clear_for_the_debounce(
    condition: str,
) -> None:
    inject, kind, severity, message = CONDITIONS[condition]
    m = Machine("dgx-h100:2", alerts=CONFIG)
    try:
        gpu = m.broker.inventory.gpus[0].uuid
        m.run(INTERVAL)
        assert m.changes == []  # a healthy machine raises nothing
        inject(m.sim, gpu)
        m.run(INTERVAL)
        (started,) = m.changes
        alert = started.alert
        assert started.state == "started"
        assert (alert.uuid, alert.label, alert.kind) == (gpu, "GPU 0", kind)
        assert (alert.severity, alert.message) == (severity, message)
        assert alert.since == m.clock.now() and alert.ended is None
        (row,) = m.store.active_alerts()
        assert (row["id"], row["message"]) == (alert.id, message)
        last_seen = m.clock.now()
        if kind not in ("ecc", "xid"):  # point events: gone with the pass that saw them
            m.run(3 * INTERVAL)
            assert len(m.changes) == 1  # still on: one alert, not one per pass
            last_seen = m.clock.now()
        clear(m.sim, gpu)
        m.run(CLEAR - INTERVAL)
        assert len(m.changes) == 1 and m.sampler.alerts.active() == [alert]  # type: ignore[union-attr]
        m.run(INTERVAL)
        ended = m.changes[-1]
        assert (ended.state, ended.alert.id) == ("ended", alert.id)
        assert ended.alert.ended == last_seen + CLEAR
        assert m.store.active_alerts() == []
        (past,) = m.store.alert_history()
        assert (past["id"], past["ended"], past["kind"]) == (alert.id, last_seen + CLEAR, kind)
    finally:
        m.close()


def test_without_nvml_thresholds_the_configured_temperatures_apply() -> None:
    m = Machine("dgx-h100:1", alerts=AlertConfig(temperature_warning_c=80.0))
    try:
        m.sim.hide_symbol("nvmlDeviceGetTemperatureThreshold")  # an older driver
        gpu = m.broker.inventory.gpus[0].uuid
        m.sim.inject_overheat(gpu, 82)
        m.run(INTERVAL)
        (warning,) = m.changes
        assert warning.alert.message.startswith(
            "GPU 0 is at 82 C, at or above the alert temperature of 80 C:"
        )
        m.sim.inject_overheat(gpu, 90)
        m.run(INTERVAL)
        assert "at or above the critical alert temperature of 90 C" in m.changes[-1].alert.message
    finally:
        m.close()


def test_a_program_fault_xid_raises_no_alert_and_a_slice_is_named_by_its_label() -> None:
    m = Machine("dgx-h100-mig:1", alerts=CONFIG)
    try:
        slice_ = m.broker.inventory.devices[2]
        m.sim.inject_xid(slice_.uuid, 43)  # the program's own fault
        m.run(INTERVAL)
        assert m.changes == []
        m.sim.inject_ecc_error(slice_.uuid)
        m.sim.set_load(slice_.uuid, memory_used_mib=slice_.memory_mib)
        m.run(INTERVAL)
        assert {(c.alert.uuid, c.alert.kind) for c in m.changes} == {
            (slice_.uuid, "ecc"),
            (slice_.uuid, "memory"),
        }
        assert all(c.alert.label == slice_.label for c in m.changes)
        assert all(c.alert.message.startswith(f"{slice_.label} ") for c in m.changes)
    finally:
        m.close()


def test_a_temperature_hovering_at_its_threshold_does_not_flap_and_escalates_once() -> None:
    m = Machine("dgx-h100:1", alerts=CONFIG)
    try:
        gpu = m.broker.inventory.gpus[0].uuid
        for _ in range(12):  # a minute: over, under, over, ...
            m.sim.inject_overheat(gpu, 90)
            m.run(INTERVAL)
            m.sim.clear_faults(gpu)
            m.run(INTERVAL)
        assert [c.state for c in m.changes] == ["started"]
        m.sim.inject_overheat(gpu, 93)
        m.run(INTERVAL)
        first, escalated = m.changes
        assert escalated.state == "escalated" and escalated.alert.id == first.alert.id
        assert escalated.alert.severity == "critical" and "93 C" in escalated.alert.message
        assert escalated.alert.since == first.alert.since
        m.sim.inject_overheat(gpu, 90)
        m.run(INTERVAL)
        assert len(m.changes) == 2  # not back to a warning while it lasts
        (row,) = m.store.active_alerts()
        assert row["severity"] == "critical"
    finally:
        m.close()


def test_alerts_outlive_a_restart_and_the_history_is_bounded(tmp_path) -> None:
    path = tmp_path / "state.sqlite"
    first = Machine("dgx-h100:1", alerts=CONFIG, store=Store(path))
    gpu = first.broker.inventory.gpus[0].uuid
    first.run(INTERVAL)  # the first pass registers for NVML's events
    first.sim.inject_power_cap(gpu)
    first.sim.inject_xid(gpu, 48)
    first.run(INTERVAL)
    first.run(CLEAR)  # the Xid's alert has ended, the power cap's goes on
    assert [(c.state, c.alert.kind) for c in first.changes] == [
        ("started", "power_cap"),
        ("started", "xid"),
        ("ended", "xid"),
    ]
    active = first.sampler.alerts.active()  # type: ignore[union-attr]
    now = first.clock.now()
    first.close()
    first.store.close()

    later = now + 3600
    again = Machine("dgx-h100:1", alerts=CONFIG, store=Store(path), clock=VirtualClock(later))
    assert again.sampler.alerts.active() == active  # type: ignore[union-attr]  # its start kept
    (xid,) = again.store.alert_history()
    assert xid["kind"] == "xid"
    again.run(CLEAR)  # the restarted machine is not capped: it ends after the debounce
    assert [(c.state, c.alert.id) for c in again.changes] == [("ended", active[0].id)]
    assert again.store.active_alerts() == []
    assert [h["kind"] for h in again.store.alert_history()] == ["xid", "power_cap"]  # by start

    kept = AlertConfig(clear_after_s=CLEAR, history_kept_s=1800)
    AlertJudge(again.store, later + 1800 + CLEAR, kept)  # a start forgets what is too old
    assert [h["kind"] for h in again.store.alert_history()] == ["power_cap"]
    again.close()
    again.store.close()


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature_warning_c": 95.0, "temperature_critical_c": 90.0},
        {"memory_full_percent": 0.0},
        {"memory_full_percent": 101.0},
        {"clear_after_s": -1.0},
        {"history_kept_s": 0.0},
    ],
)
def test_a_bad_configuration_is_refused(fields: dict[str, float]) -> None:
    with pytest.raises(Exception, match="must|percent"):
        AlertConfig(**fields)  # type: ignore[arg-type]
