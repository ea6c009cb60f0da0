"""The Slurm reader's parsing, on output captured from the test cluster of .ci/slurm-up
(Slurm 22.05.8, Debian 12): gpu-a with gpu:h100:4, gpu-b with gpu:1g.10gb:7 and
gpu:3g.40gb:2. In the busy capture the broker's leases L1 (2 x h100, running), L2
(1 x 3g.40gb, running) and L3 (4 x h100, pending) ran beside jobs started outside
the broker (3 x 1g.10gb, 1 x h100), and gpu-b was drained with a reason."""

from __future__ import annotations

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
