"""Power limits that follow the forecast, on the simulated NVML (root unless a test says
otherwise) under a real core and state file: three days of ann on one of two H100s from
09:00 to 11:00 UTC; in the night's trough both idle GPUs are lowered, one is restored an
hour before the 09:00 peak, a lease that lands on a lowered GPU or a request that waits
restores the rest, and each change is audited with its reason. A broker that is not root
changes nothing and says so."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pynvml
import pytest
from runtime_helpers import make

from jupyter_gpubroker.broker.clock import VirtualClock
from jupyter_gpubroker.broker.core import Broker
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.nvml import NvmlBackend, open_backend
from jupyter_gpubroker.nvml.simulated import PRIVILEGE_ENV
from jupyter_gpubroker.runtime.power_saving import PowerSaving
from jupyter_gpubroker.wire.profiles import CATALOG
from jupyter_gpubroker.wire.sizes import Size

HOUR, DAY = 3600.0, 86400.0
H100_W = CATALOG["H100-80GB"].power_limit_mw / 1000
LOG = logging.getLogger("test-power-saving")


def limit_w(backend: NvmlBackend, uuid: str) -> float:
    return pynvml.nvmlDeviceGetEnforcedPowerLimit(backend.handle(uuid)) / 1000


def history(broker: Broker, clock: VirtualClock, days: int) -> None:
    """``days`` days of ann holding one GPU 09:00-11:00; ends at 11:00 of the last."""
    for day in range(days):
        ann = broker.submit("ann", Size(gpus=1))
        clock.advance(2 * HOUR)
        broker.release(ann.lease_id)  # type: ignore[arg-type]
        if day < days - 1:
            clock.advance(DAY - 2 * HOUR)


@pytest.fixture
def machine(tmp_path) -> Iterator[tuple[Broker, VirtualClock, NvmlBackend]]:  # type: ignore[no-untyped-def]
    with open_backend("dgx-h100:2", privilege="root") as backend:
        clock = VirtualClock(1_764_579_600.0)  # Monday 2025-12-01 09:00 UTC
        broker = Broker(Store(tmp_path / "state.sqlite"), backend.inventory(), clock=clock)
        history(broker, clock, 3)
        yield broker, clock, backend
        broker.store.close()


def audit(broker: Broker) -> list[tuple[str, str, str]]:
    return [(a["action"], a["target"], a["detail"]["reason"]) for a in broker.store.audit()]


def test_a_trough_lowers_idle_gpus_and_the_peak_and_a_lease_restore_them(
    machine: tuple[Broker, VirtualClock, NvmlBackend],
) -> None:
    broker, clock, backend = machine
    gpus = [g.uuid for g in broker.inventory.gpus]
    saver = PowerSaving(power_saving=True)
    clock.advance(15 * HOUR)  # Thursday 02:00: nobody asked for a GPU at night
    saver.save_power(broker, backend, LOG)
    assert [limit_w(backend, u) for u in gpus] == [H100_W / 2] * 2
    trough = "forecast: no GPU asked Thu 02:00-03:00 and Thu 03:00-04:00 (p90)"
    lowered = f"{trough}; power limit 700 W to 350 W"
    assert audit(broker) == [("power_limit_lower", u, lowered) for u in gpus]

    clock.advance(6 * HOUR)  # 08:00: the next hour's p90 asks one GPU
    saver.save_power(broker, backend, LOG)
    assert sorted(limit_w(backend, u) for u in gpus) == [H100_W / 2, H100_W]
    restored = audit(broker)[-1]
    assert restored[0] == "power_limit_restore"
    assert restored[2].startswith("forecast: at most 1.0 GPU asked Thu 08:00-09:00")
    assert saver.held_back_wh == pytest.approx(350 * 6)  # 350 W off for six hours

    # bob takes both GPUs: the one still lowered is restored before anything else
    for _ in range(2):
        broker.submit("bob", Size(gpus=1))
    saver.save_power(broker, backend, LOG)
    assert [limit_w(backend, u) for u in gpus] == [H100_W] * 2
    assert audit(broker)[-1][0] == "power_limit_restore"
    assert audit(broker)[-1][2] == "a lease holds it now; power limit 350 W to 700 W"
    assert saver.lowered == {}


def test_nothing_is_lowered_while_a_request_waits_or_with_power_saving_off(
    machine: tuple[Broker, VirtualClock, NvmlBackend],
) -> None:
    broker, clock, backend = machine
    gpus = [g.uuid for g in broker.inventory.gpus]
    clock.advance(15 * HOUR)
    PowerSaving().save_power(broker, backend, LOG)  # off by default
    for _ in range(3):  # two held, one waiting
        broker.submit("bob", Size(gpus=1))
    PowerSaving(power_saving=True).save_power(broker, backend, LOG)
    assert [limit_w(backend, u) for u in gpus] == [H100_W] * 2
    assert audit(broker) == []


def test_a_broker_that_is_not_root_changes_nothing_and_says_so(
    tmp_path, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    with open_backend("dgx-h100:2", privilege="none") as backend:
        clock = VirtualClock(1_764_579_600.0)
        broker = Broker(Store(tmp_path / "state.sqlite"), backend.inventory(), clock=clock)
        history(broker, clock, 3)
        clock.advance(15 * HOUR)
        saver = PowerSaving(power_saving=True)
        with caplog.at_level(logging.WARNING):
            saver.save_power(broker, backend, LOG)
            saver.save_power(broker, backend, LOG)
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 1 and "only root may change the power limit of GPU" in said[0]
        assert [limit_w(backend, g.uuid) for g in broker.inventory.gpus] == [H100_W] * 2
        assert audit(broker) == [] and saver.lowered == {}
        broker.store.close()


def test_the_fraction_is_validated() -> None:
    with pytest.raises(Exception, match="power_saving_fraction"):
        PowerSaving(power_saving_fraction=1.5)


def test_the_brokers_tick_lowers_in_a_trough_and_its_stop_restores(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(PRIVILEGE_ENV, "root")
    runtime = make(tmp_path, simulate="dgx-h100:2", power_saving=True)
    runtime.start()
    try:
        clock = VirtualClock(1_764_579_600.0)
        runtime.core.clock.now = clock.now  # the clock the core shares with its book
        history(runtime.core, clock, 3)
        clock.advance(15 * HOUR)
        runtime._tick()
        backend = runtime.backend
        assert backend is not None
        gpus = [g.uuid for g in runtime.core.inventory.gpus]
        assert [limit_w(backend, u) for u in gpus] == [H100_W / 2] * 2
        clock.advance(HOUR)
        runtime.stop()  # the limits back to their defaults, audited, before NVML closes
        store = Store(tmp_path / "state.sqlite")
        try:
            actions = [(a["action"], a["detail"]["reason"]) for a in store.audit()]
        finally:
            store.close()
        assert (
            actions[-2:]
            == [("power_limit_restore", "the broker stops; power limit 350 W to 700 W")] * 2
        )
    finally:
        runtime.stop()
