"""Which free device a request gets, and how an idle MIG GPU would be re-cut."""

from __future__ import annotations

from dataclasses import replace

import pytest
from broker_helpers import make_inventory, mig_inventory, mig_uuid, whole_inventory

from jupyter_gpubroker.broker.models import Inventory
from jupyter_gpubroker.broker.placement import Placer
from jupyter_gpubroker.wire.errors import Unsatisfiable
from jupyter_gpubroker.wire.sizes import Size

ONE_G = Size(profile="1g.10gb")
MIXED = make_inventory([None, ("3g.40gb", "2g.20gb", "1g.10gb"), ("1g.20gb",) * 4])
"""GPU 0 whole; GPU 1: 3g.40gb@0 + 2g.20gb@4 + 1g.10gb@6; GPU 2: four 1g.20gb."""


def only(devices):
    assert devices is not None and len(devices) == 1
    return devices[0]


# ---------------------------------------------------------------- best fit / first fit


def test_best_fit_packs_mig_requests_onto_the_busiest_gpu():
    placer = Placer(mig_inventory(gpus=3))
    placer.hold([mig_uuid(2, "1g.10gb", 3)])  # GPU 2 is the busiest
    placer.hold([mig_uuid(1, "1g.10gb", 0)])
    placer.hold([mig_uuid(2, "1g.10gb", 5)])
    d = only(placer.find(ONE_G, "best_fit"))
    assert d.gpu_index == 2
    assert d.start == 0  # lowest free start on it


def test_first_fit_takes_inventory_order():
    placer = Placer(mig_inventory(gpus=3))
    placer.hold([mig_uuid(2, "1g.10gb", 3), mig_uuid(0, "1g.10gb", 0)])
    d = only(placer.find(ONE_G, "first_fit"))
    assert (d.gpu_index, d.start) == (0, 1)


def test_best_fit_through_the_broker_keeps_whole_gpus_of_slices_free(make_broker):
    broker = make_broker(mig_inventory(gpus=2))
    leases = [broker.lease(broker.submit(u, ONE_G).lease_id) for u in "abcdefg"]
    gpus = {broker.inventory.device(lease.devices[0]).gpu_index for lease in leases}
    assert gpus == {0}, "seven 1g requests fill one GPU before touching the next"
    eighth = broker.lease(broker.submit("h", ONE_G).lease_id)
    assert broker.inventory.device(eighth.devices[0]).gpu_index == 1


def test_memory_request_takes_the_smallest_adequate_device():
    placer = Placer(MIXED)
    assert only(placer.find(Size(min_memory_gb=5), "best_fit")).profile == "1g.10gb"
    assert only(placer.find(Size(min_memory_gb=15), "best_fit")).profile in (
        "1g.20gb",
        "2g.20gb",
    )
    assert only(placer.find(Size(min_memory_gb=30), "best_fit")).profile == "3g.40gb"
    big = only(placer.find(Size(min_memory_gb=50), "best_fit"))
    assert big.kind == "gpu" and big.gpu_index == 0
    assert placer.find(Size(min_memory_gb=90), "best_fit") is None


def test_memory_request_first_fit_takes_the_first_adequate_device():
    placer = Placer(MIXED)
    assert only(placer.find(Size(min_memory_gb=5), "first_fit")).kind == "gpu"


def test_memory_request_prefers_the_busier_gpu_among_equal_sizes():
    placer = Placer(mig_inventory(gpus=2, layout=("1g.20gb",) * 4))
    placer.hold([mig_uuid(1, "1g.20gb", 0)])
    assert only(placer.find(Size(min_memory_gb=15), "best_fit")).gpu_index == 1


def test_whole_gpu_requests_take_free_gpus_with_mig_off():
    inv = make_inventory([None, ("7g.80gb",), None, None])
    placer = Placer(inv)
    placer.hold([inv.devices[0].uuid])
    got = placer.find(Size(gpus=2), "best_fit")
    assert got is not None and [d.gpu_index for d in got] == [2, 3]
    assert all(d.kind == "gpu" for d in got)
    assert placer.find(Size(gpus=3), "best_fit") is None  # the MIG GPU does not count
    placer.release([inv.devices[0].uuid])
    got3 = placer.find(Size(gpus=3), "first_fit")
    assert got3 is not None and [d.gpu_index for d in got3] == [0, 2, 3]


def test_find_skips_excluded_devices():
    placer = Placer(whole_inventory(2))
    first = whole_inventory(2).devices[0].uuid
    assert only(placer.find(Size(gpus=1), "best_fit", exclude={first})).gpu_index == 1


def two_chips() -> Inventory:
    """GPUs 0 and 1: whole H100s; GPU 2: a whole A100."""
    h100s, a100 = make_inventory([None, None]), make_inventory([None], "A100-80GB")
    gpu = replace(a100.gpus[0], index=2, uuid="GPU-a100")
    device = replace(a100.devices[0], uuid="GPU-a100", gpu_index=2, gpu_uuid="GPU-a100")
    return Inventory((*h100s.gpus, gpu), (*h100s.devices, device))


def test_whole_gpus_of_a_model_are_only_gpus_of_that_model():
    inv = two_chips()
    h100 = Size(gpus=1, model="H100-80GB")
    placer = Placer(inv)
    placer.hold([inv.devices[0].uuid, inv.devices[1].uuid], until=600.0)
    assert only(placer.find(Size(gpus=1), "best_fit")).uuid == "GPU-a100"
    assert placer.find(h100, "best_fit") is None  # the A100 is free, but another chip
    assert not placer.has_free_for(h100) and placer.has_free_for(Size(gpus=1))
    assert placer.count_compatible(Size(gpus=2, model="H100-80GB")) == 2
    assert placer.count_compatible(Size(gpus=1, model="A100-80GB")) == 1
    assert placer.count_compatible(Size(gpus=1, model="B200")) == 0
    reserved = placer.reserve(h100, now=0.0)
    assert reserved is not None and reserved[1] == 600.0
    assert reserved[0] <= {inv.devices[0].uuid, inv.devices[1].uuid}  # an H100's
    placer.release([inv.devices[1].uuid])
    assert only(placer.find(h100, "first_fit")).uuid == inv.devices[1].uuid


def test_a_request_for_a_model_waits_for_a_gpu_of_it_through_the_broker(make_broker):
    broker = make_broker(two_chips())
    with pytest.raises(Unsatisfiable, match="1 whole B200 GPU.* has 0 B200 GPU"):
        broker.submit("ann", Size(gpus=1, model="B200"))
    first, second = (broker.submit(u, Size(gpus=1, model="H100-80GB")) for u in "ab")
    resume = broker.submit("c", Size(gpus=1, model="H100-80GB"))
    assert resume.state.value == "queued"  # though the A100 is free
    later = broker.submit("d", Size(gpus=1))
    assert broker.lease(later.lease_id).devices == ("GPU-a100",)  # backfilled
    broker.release(first.lease_id)
    assert broker.lease(resume.lease_id).devices == broker.lease(first.lease_id).devices


def test_held_devices_are_not_free_until_released():
    inv = mig_inventory(gpus=1, layout=("3g.40gb", "3g.40gb"))
    placer = Placer(inv)
    size = Size(profile="3g.40gb")
    placer.hold([d.uuid for d in inv.devices])
    assert not placer.has_free_for(size) and placer.find(size, "best_fit") is None
    assert len(placer.compatible(size)) == 2  # still could, once free
    placer.release([inv.devices[1].uuid])
    assert only(placer.find(size, "best_fit")).uuid == inv.devices[1].uuid
    assert placer.total_gpu_equivalents == 6 / 7


# ---------------------------------------------------------------- plan_mig


def test_plan_mig_cuts_the_cheapest_placement_of_idle_slices():
    placer = Placer(mig_inventory(gpus=1))
    plan = placer.plan_mig("3g.40gb")
    assert plan is not None
    assert plan.profile.name == "3g.40gb" and plan.start == 4  # 3 slices lost, not 4
    assert sorted(d.start for d in plan.destroy) == [4, 5, 6]


def test_plan_mig_only_destroys_idle_slices():
    placer = Placer(mig_inventory(gpus=1))
    placer.hold([mig_uuid(0, "1g.10gb", 5)])
    plan = placer.plan_mig("3g.40gb")
    assert plan is not None and plan.start == 0
    assert sorted(d.start for d in plan.destroy) == [0, 1, 2, 3]
    placer.hold([mig_uuid(0, "1g.10gb", 1)])
    assert placer.plan_mig("3g.40gb") is None  # both halves have a busy slice


def test_plan_mig_never_destroys_excluded_slices():
    placer = Placer(mig_inventory(gpus=1))
    plan = placer.plan_mig("3g.40gb", exclude={mig_uuid(0, "1g.10gb", 6)})
    assert plan is not None and plan.start == 0


def test_plan_mig_respects_the_profiles_placements():
    placer = Placer(mig_inventory(gpus=1))
    plan = placer.plan_mig("4g.40gb")
    assert plan is not None and plan.start == 0 and len(plan.destroy) == 4
    plan = placer.plan_mig("7g.80gb")
    assert plan is not None and plan.start == 0 and len(plan.destroy) == 7
    placer.hold([mig_uuid(0, "1g.10gb", 0)])
    assert placer.plan_mig("4g.40gb") is None  # 4g may only start at 0
    plan = placer.plan_mig("2g.20gb")
    assert plan is not None and plan.start in (2, 4) and plan.start % 2 == 0


def test_plan_mig_uses_empty_memory_slices_first():
    placer = Placer(mig_inventory(gpus=1, layout=[("3g.40gb", 0)]))
    plan = placer.plan_mig("3g.40gb")
    assert plan is not None and plan.start == 4 and plan.destroy == ()


def test_plan_mig_respects_max_counts():
    # One 1g.10gb+me exists (busy); the media engines cannot be given out twice.
    inv = mig_inventory(gpus=1, layout=[("1g.10gb+me", 0), ("1g.10gb", 1), ("1g.10gb", 2)])
    placer = Placer(inv)
    placer.hold([mig_uuid(0, "1g.10gb+me", 0)])
    assert placer.plan_mig("1g.10gb+me") is None
    placer.release([mig_uuid(0, "1g.10gb+me", 0)])
    plan = placer.plan_mig("1g.10gb+me")  # replacing the idle one itself would be allowed
    assert plan is not None and plan.destroy
    assert mig_uuid(0, "1g.10gb+me", 0) in {d.uuid for d in plan.destroy}


def test_plan_mig_prefers_the_busier_gpu():
    placer = Placer(mig_inventory(gpus=2))
    placer.hold([mig_uuid(1, "1g.10gb", 0)])
    plan = placer.plan_mig("2g.20gb")
    assert plan is not None and plan.gpu.index == 1


def test_plan_mig_ignores_gpus_with_mig_off_or_unknown_profiles():
    placer = Placer(make_inventory([None, None]))
    assert placer.plan_mig("1g.10gb") is None
    placer = Placer(mig_inventory(gpus=1))
    assert placer.plan_mig("1g.18gb") is None  # an H200 profile on an H100


def test_plan_mig_follows_drains_and_recuts_of_the_gpu():
    """Each GPU's cut is kept between passes: a drain, a slice held, removed or added
    on that GPU must change what the next plan says."""
    placer = Placer(mig_inventory(gpus=2, layout=()))  # two GPUs in MIG mode, no slice yet
    plan = placer.plan_mig("7g.80gb")
    assert plan is not None and plan.destroy == ()
    placer.drain(plan.gpu.uuid)  # a GPU with no slice: no device of it to refresh
    other = placer.plan_mig("7g.80gb")
    assert other is not None and other.gpu.uuid != plan.gpu.uuid
    placer.drain(other.gpu.uuid)
    assert placer.plan_mig("7g.80gb") is None
    placer.undrain(plan.gpu.uuid)
    again = placer.plan_mig("7g.80gb")
    assert again is not None and again.gpu.uuid == plan.gpu.uuid

    small = mig_inventory(gpus=1, layout=("1g.10gb",)).devices[0]
    placer.add(replace(small, gpu_uuid=plan.gpu.uuid))  # a slice cut at 0: 7g still fits
    assert {d.uuid for d in placer.plan_mig("7g.80gb").destroy} == {small.uuid}
    placer.hold([small.uuid])
    assert placer.plan_mig("7g.80gb") is None  # the only undrained GPU has a held slice
    placer.release([small.uuid])
    placer.remove(small.uuid)
    assert placer.plan_mig("7g.80gb").destroy == ()
