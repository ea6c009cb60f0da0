"""The Slurm reader's parsing, on output captured from the test cluster of .ci/slurm-up
(Slurm 22.05.8, Debian 12): gpu-a with gpu:h100:4, gpu-b with gpu:1g.10gb:7 and
gpu:3g.40gb:2. In the busy capture the broker's leases L1 (2 x h100, running), L2
(1 x 3g.40gb, running) and L3 (4 x h100, pending) ran beside jobs started outside
the broker (3 x 1g.10gb, 1 x h100), and gpu-b was drained with a reason. The power
captures add gpu-c (gpu:h100:2, under Slurm's power saving): asleep beside the others,
through a wake and a sleep, and Slurm's power-saving settings and partitions."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from jupyter_gpubroker.engines.slurm import (
    cluster_view,
    gres_request,
    mig_profile,
    parse_fields,
    parse_gres,
    parse_jobs,
    parse_nodes,
)
from jupyter_gpubroker.engines.slurm_power import (
    parse_config,
    partition_times,
    power_state,
    sleep_config,
)

DATA = Path(__file__).parent / "data"


def captured(name: str) -> str:
    return (DATA / name).read_text()


def test_an_idle_cluster_is_whole_gpus_on_one_node_and_mig_slices_on_the_other() -> None:
    view = cluster_view(parse_nodes(captured("scontrol-nodes-idle.txt")), [])
    inv = view.inventory
    a = [d for d in inv.devices if d.node == "gpu-a"]
    b = [d for d in inv.devices if d.node == "gpu-b"]
    assert [(d.kind, d.memory_mib) for d in a] == [("gpu", 81559)] * 4  # the H100-80GB's
    assert sorted(d.profile or "" for d in b) == ["1g.10gb"] * 7 + ["3g.40gb"] * 2
    # seven 1g.10gb fill one GPU's compute slices; the two 3g.40gb go on a second
    mig_gpus = {d.gpu_uuid for d in b}
    assert len(mig_gpus) == 2
    assert [d.start for d in b if d.profile == "3g.40gb"] == [0, 4]
    assert view.outside == {} and view.down == {} and view.holders == {}
    assert {g.node for g in inv.gpus} == {"gpu-a", "gpu-b"}
    assert next(d.label for d in a) == "gpu-a GPU 0"
    assert {g.model for g in inv.gpus if g.node == "gpu-a"} == {"H100-80GB"}
    # a site's own size for a type (an H100 NVL's 94 GB): no longer the catalog's model
    sized = cluster_view(parse_nodes(captured("scontrol-nodes-idle.txt")), [], {"h100": 94})
    assert {(g.memory_mib, g.model) for g in sized.inventory.gpus if g.node == "gpu-a"} == {
        (89645, None)  # 94 GB of 10^9 bytes, in NVML's MiB
    }


def test_work_outside_the_broker_is_what_slurm_uses_minus_the_brokers_jobs() -> None:
    nodes = parse_nodes(captured("scontrol-nodes-busy-drained.txt"))
    jobs = parse_jobs(captured("squeue-busy.txt"))
    view = cluster_view(nodes, jobs)
    # gpu-a: 3 h100 in use, 2 of them by lease L1; gpu-b: 3 1g.10gb outside, L2's 3g.40gb ours
    assert view.outside == {("gpu-a", "gpu"): 1, ("gpu-b", "1g.10gb"): 3}
    assert view.holders == {"L1": "10", "L2": "13", "L3": "14"}  # L3 pending is still held


def test_a_drained_node_is_down_with_slurms_reason() -> None:
    view = cluster_view(parse_nodes(captured("scontrol-nodes-busy-drained.txt")), [])
    assert view.down == {
        "gpu-b": "Slurm: MIXED+DRAIN, fan swap, back at 14:00 [root@2026-12-01T12:26:57]"
    }


def test_fields_with_spaces_and_gres_lists_with_indexes() -> None:
    line = "NodeName=n1 OS=Linux 6.1 #1 SMP  State=IDLE Reason=a b [root@x]"
    assert parse_fields(line) == {
        "NodeName": "n1",
        "OS": "Linux 6.1 #1 SMP",
        "State": "IDLE",
        "Reason": "a b [root@x]",
    }
    assert parse_gres("gpu:h100:2(IDX:0,2),gpu:a100:1(S:0-1),mps:100,gpu:3(IDX:0-2)") == {
        "h100": 2,
        "a100": 1,
        "": 3,
    }
    assert parse_gres("gres:gpu:3g.40gb:2") == {"3g.40gb": 2}
    assert mig_profile("nvidia_h100_80gb_hbm3_1g.10gb") == "1g.10gb"
    assert mig_profile("h100") is None and mig_profile("9g.99gb") is None


def test_a_lease_of_one_nodes_devices_becomes_its_gres_and_node() -> None:
    view = cluster_view(parse_nodes(captured("scontrol-nodes-idle.txt")), [])
    h100 = [d.uuid for d in view.inventory.devices if d.node == "gpu-a"][:2]
    mig = [d.uuid for d in view.inventory.devices if d.profile == "1g.10gb"][:1]
    assert gres_request(h100) == ("gpu-a", "gpu:h100:2")
    assert gres_request(mig) == ("gpu-b", "gpu:1g.10gb:1")
    with pytest.raises(ValueError, match="not one Slurm node"):
        gres_request(h100 + mig)


def test_a_sleeping_node_is_asleep_not_down_and_each_power_state_is_read() -> None:
    """gpu-c under Slurm's power saving, captured asleep and then through a wake and a
    sleep (``scontrol update NodeName=gpu-c State=POWER_UP``, then ``POWER_DOWN``)."""
    view = cluster_view(parse_nodes(captured("scontrol-nodes-asleep.txt")), [])
    assert view.down == {}
    assert view.asleep == {"gpu-c": "Slurm: IDLE+POWERED_DOWN, asleep (power saving)"}
    assert sorted(d.uuid for d in view.inventory.devices if d.node == "gpu-c") == [
        "slurm__gpu-c__h100__0",
        "slurm__gpu-c__h100__1",
    ]
    nodes = {n.name: n for n in parse_nodes(captured("scontrol-nodes-asleep.txt"))}
    assert [nodes[n].partitions for n in ("gpu-a", "gpu-b", "gpu-c")] == [
        ("gpu", "powersave"),
        ("gpu",),
        ("powersave",),
    ]
    cycle = parse_nodes(captured("scontrol-node-power-cycle.txt"))
    assert [(n.state, n.power, n.down) for n in cycle] == [
        ("IDLE+POWER_UP+POWERED_DOWN", "waking up", None),
        ("IDLE", "awake", None),
        ("IDLE+POWER_DOWN", "going to sleep", None),
        ("IDLE+POWERING_DOWN", "going to sleep", None),
        ("IDLE+POWERED_DOWN", "asleep", None),
    ]
    assert power_state(["MIXED", "POWERING_UP"]) == "waking up"
    # a node both drained and asleep is down: an admin's drain is not the broker's to undo
    drained = parse_nodes("NodeName=gpu-c State=IDLE+DRAIN+POWERED_DOWN Reason=disk Gres=gpu:2")
    assert drained[0].down == "Slurm: IDLE+DRAIN+POWERED_DOWN, disk"
    assert drained[0].asleep is None


def test_which_nodes_slurms_power_saving_lets_sleep() -> None:
    config = parse_config(captured("scontrol-config-power.txt"))
    assert config["SuspendExcNodes"] == "gpu-a,gpu-b" and config["SuspendTime"] == "3600 sec"
    found = sleep_config(config, partition_times(captured("scontrol-partitions.txt")))
    assert found.off is None and found.partition_times == {}
    found = replace(found, exc_nodes=frozenset({"gpu-a", "gpu-b"}))  # scontrol show hostnames
    assert [found.may_sleep(n, ["powersave"]) for n in ("gpu-a", "gpu-c")] == [False, True]
    # a partition's own SuspendTime (as 22.05 prints it) wins; INFINITE keeps its nodes awake
    times = partition_times(
        "PartitionName=gpu ResumeTimeout=GLOBAL SuspendTimeout=GLOBAL SuspendTime=INFINITE\n"
        "PartitionName=powersave ResumeTimeout=90 SuspendTimeout=GLOBAL SuspendTime=7200\n"
        "PartitionName=debug SuspendTime=GLOBAL\n"
    )
    assert times == {"gpu": "INFINITE", "powersave": "7200"}
    found = sleep_config({**config, "SuspendExcNodes": "(null)"}, times)
    assert found.may_sleep("gpu-c", ["powersave"])
    assert not found.may_sleep("gpu-a", ["gpu", "powersave"])  # in an INFINITE partition
    assert found.may_sleep("gpu-d", ["debug"])  # the cluster's 3600 s
    assert not replace(found, exc_parts=frozenset({"debug"})).may_sleep("gpu-d", ["debug"])
    # power saving off: no program, or INFINITE everywhere
    assert sleep_config({**config, "ResumeProgram": "(null)"}, {}).off == (
        "Slurm's power saving is off here (no ResumeProgram)"
    )
    assert sleep_config({**config, "SuspendTime": "INFINITE"}, {}).off == (
        "Slurm's power saving is off here (its SuspendTime is INFINITE)"
    )
    assert sleep_config({**config, "SuspendTime": "INFINITE"}, {"powersave": "600"}).off is None
