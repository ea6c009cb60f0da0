"""Device samples: raw for an hour, minute averages for a week, hour averages beyond, the
file bounded however long it runs, and reads served from the finest tier that covers them."""

from __future__ import annotations

from jupyter_gpubroker.broker.models import DeviceEvent, DeviceReading, Health
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.monitor.samples import SampleStore

T0 = 1_715_767_200.0  # a whole hour


def rows(store: Store, res: int) -> int:
    return int(store.conn.execute("SELECT COUNT(*) FROM samples WHERE res=?", (res,)).fetchone()[0])


def test_samples_are_rolled_up_and_pruned_by_tier() -> None:
    store = Store()
    samples = SampleStore(store, 5.0, minutes_kept_s=2 * 3600)
    t = T0
    for i in range(12 * 60 * 5):  # five hours, every 5 s
        util = 100.0 if i % 2 else 0.0
        samples.record(
            t,
            {
                "GPU-a": DeviceReading("GPU-a", utilization_gpu=util, clock_event_reasons=i % 3),
                "MIG-b": DeviceReading("MIG-b", memory_used_mib=1000),
            },
            [],
        )
        t += 5.0
    now = t - 5.0
    assert rows(store, 0) == 2 * 721  # the last hour (both ends), two devices
    assert rows(store, 60) == 2 * 119  # closed minutes of the last two hours (one open)
    assert rows(store, 3600) == 2 * 4  # every closed hour (the fifth is still open)
    res, raw = samples.series("GPU-a", now - 600, now)
    assert res == 5 and len(raw) == 121 and raw[-1]["t"] == now and raw[0]["n"] == 1
    res, minutes = samples.series("GPU-a", now - 3600 - 60, now)
    assert res == 60 and minutes[0]["n"] == 12
    assert {m["utilization_gpu"] for m in minutes} == {50.0}  # the average of 0 and 100
    assert {m["clock_event_reasons"] for m in minutes} == {3}  # reasons OR-ed: 0 | 1 | 2
    res, hours = samples.series("MIG-b", T0, now)
    assert res == 3600 and [h["n"] for h in hours] == [720] * 4
    assert hours[0]["utilization_gpu"] is None  # not reported there: stays null, not 0
    assert hours[0]["memory_used_mib"] == 1000


def test_a_restart_continues_the_roll_ups_where_they_stopped(tmp_path) -> None:
    path = tmp_path / "state.sqlite"
    first = Store(path)
    samples = SampleStore(first, 5.0)
    for i in range(24):  # two minutes
        samples.record(T0 + 5 * i, {"GPU-a": DeviceReading("GPU-a", temperature_c=40 + i)}, [])
    first.close()
    again = Store(path)
    samples = SampleStore(again, 5.0)
    samples.record(T0 + 180, {"GPU-a": DeviceReading("GPU-a", temperature_c=30)}, [])
    _, minutes = samples.series("GPU-a", T0 - 86400, T0 + 180)
    assert [(m["t"], m["n"]) for m in minutes] == [(T0, 12), (T0 + 60, 12)]
    again.close()


def test_unhealthy_samples_and_hardware_events_are_kept() -> None:
    store = Store()
    samples = SampleStore(store, 5.0)
    lost = DeviceReading("GPU-a", health=Health.LOST, error="GPU is lost")
    samples.record(T0, {"GPU-a": lost}, [DeviceEvent("GPU-a", "xid", 79)])
    samples.record(
        T0 + 5, {"GPU-a": DeviceReading("GPU-a")}, [DeviceEvent("GPU-a", "double_bit_ecc")]
    )
    _, raw = samples.series("GPU-a", T0, T0 + 5)
    assert [r["unhealthy"] for r in raw] == [1, 0]
    assert samples.events("GPU-a", T0) == [
        {"at": T0, "kind": "xid", "code": 79},
        {"at": T0 + 5, "kind": "double_bit_ecc", "code": None},
    ]
    assert samples.events("GPU-a", T0 + 1)[0]["kind"] == "double_bit_ecc"
