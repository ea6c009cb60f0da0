"""Idle and stalled reclaim, and over-share preemption, on a simulated NVML machine sampled
every 5 s of a virtual clock, with kernels the tests start and stop by hand."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import pytest
from sim_machine import Machine

from jupyter_gpubroker.broker.budgets import Quota
from jupyter_gpubroker.broker.reclaim import ReclaimConfig
from jupyter_gpubroker.nvml import backend
from jupyter_gpubroker.wire.errors import InvalidRequest
from jupyter_gpubroker.wire.sizes import Size

CONFIG = ReclaimConfig(idle_timeout_s=600, grace_s=120, stalled_timeout_s=900)
ONE_GPU = Size(gpus=1)

MachineFactory = Callable[..., Machine]


@pytest.fixture
def make_machine(monkeypatch: pytest.MonkeyPatch) -> Iterator[MachineFactory]:
    monkeypatch.setattr(backend, "GPM_MIN_INTERVAL_S", 0.0)  # virtual time: sample each pass
    made: list[Machine] = []

    def make(topology: str = "dgx-h100:1", **kw: object) -> Machine:
        kw.setdefault("reclaim", CONFIG)
        m = Machine(topology, **kw)  # type: ignore[arg-type]
        made.append(m)
        return m

    yield make
    for m in made:
        m.close()


def test_an_idle_kernel_is_warned_then_reclaimed_and_the_waiting_request_gets_its_slice(
    make_machine: MachineFactory,
) -> None:
    m = make_machine()
    lease = m.submit("1", "k1")
    assert lease is not None
    m.kernels.run("k1")
    m.sim.set_load(lease.devices[0], utilization=80)
    m.run(60)
    m.kernels.finish("k1")
    m.sim.set_load(lease.devices[0], utilization=0)
    waiting = m.broker.submit("bob", ONE_GPU, holder="k2")
    assert waiting.state.value == "queued"
    assert m.run(595) == []
    (warn,) = m.run(10)
    assert (warn.action, warn.cause, warn.holder) == ("warn", "idle", "k1")
    assert warn.reason.startswith("idle for 10 min: the kernel ran nothing, the GPU under 5%")
    (event,) = [e for e in m.events if e.kind == "warning"]
    assert m.broker.lease(lease.id).reclaim_at == warn.deadline == event.at + 120
    assert (event.lease_id, event.request_id, event.user) == (lease.id, lease.request_id, "ann")
    assert event.detail == {"cause": "idle", "reason": warn.reason, "deadline": warn.deadline}
    assert m.run(110) == []
    (reclaim,) = m.run(5)
    assert (reclaim.action, reclaim.lease_id) == ("reclaim", lease.id)
    ended = m.broker.lease(lease.id)
    assert ended.state.value == "reclaimed" and ended.reason == reclaim.reason
    assert reclaim.reason.startswith("idle for 12 min")  # 10 idle, then the 2 of grace
    assert m.broker.request(waiting.id).state.value == "granted"
    (record,) = m.store.reclaims()
    assert (record["lease_id"], record["kind"]) == (lease.id, "idle")
    evidence = record["evidence"]
    assert evidence["kernel_state"] == "idle" and evidence["utilization"] == 0
    assert evidence["idle_s"] >= 600 and evidence["deadline"] == warn.deadline
    assert [e.detail.get("cause") for e in m.events if e.kind == "reclaimed"] == ["idle"]


def test_a_busy_kernel_with_gpu_load_is_never_reclaimed(make_machine: MachineFactory) -> None:
    m = make_machine("dgx-h100:2")
    computing, background = m.submit("1", "k1"), m.submit("1", "k2")
    assert computing is not None and background is not None
    m.kernels.run("k1")
    m.kernels.finish("k2")  # idle kernel, but a thread it started keeps the GPU busy
    for lease in (computing, background):
        m.sim.set_load(lease.devices[0], utilization=60)
    m.run(6 * 3600)
    assert m.decisions == [] and len(m.broker.leases()) == 2


def test_a_stalled_kernel_is_warned_and_reclaimed(make_machine: MachineFactory) -> None:
    m = make_machine()
    lease = m.submit("1", "k1")
    assert lease is not None
    m.kernels.run("k1")  # a cell that waits forever, the GPU idle
    assert m.run(895) == []
    (warn,) = m.run(5)
    assert warn.cause == "stalled" and warn.reason.startswith("stalled: kernel busy for 15 min")
    (reclaim,) = m.run(120)
    assert reclaim.action == "reclaim" and m.store.reclaims()[0]["kind"] == "stalled"


def test_using_the_gpu_again_withdraws_the_warning(make_machine: MachineFactory) -> None:
    m = make_machine()
    lease = m.submit("1", "k1")
    assert lease is not None
    m.kernels.finish("k1")
    (warn,) = m.run(605)
    assert warn.action == "warn"
    m.kernels.run("k1")
    m.sim.set_load(lease.devices[0], utilization=90)
    (clear,) = m.run(5)
    assert (clear.action, clear.cause) == ("clear", "idle")
    assert m.broker.lease(lease.id).reclaim_at is None
    assert m.kinds(lease.id)[-2:] == ["warning", "warning_cleared"]
    assert m.run(3600) == [] and m.broker.lease(lease.id).state.value == "active"


def test_mig_without_gpm_judges_by_the_kernel_and_the_processes(
    make_machine: MachineFactory,
) -> None:
    m = make_machine("dgx-h100-mig:1")
    busy, idle = m.submit("1g.10gb", "k1"), m.submit("1g.10gb", "k2")
    assert busy is not None and idle is not None
    m.kernels.run("k1")  # busy, utilization unknown: could be computing, never reclaimed
    m.kernels.finish("k2")
    m.sim.add_process(idle.devices[0], 4242, 1000)
    for i in range(12):  # its memory keeps changing: the GPU is in use
        m.sim.add_process(idle.devices[0], 4242, 1000 + 100 * i)
        assert m.run(60) == []
    (warn,) = m.run(600)  # then nothing moves for 10 minutes
    assert warn.lease_id == idle.id and warn.reason.endswith("no change on the GPU")
    assert warn.evidence["utilization"] is None and warn.evidence["processes"] == 1
    (reclaim,) = m.run(120)
    assert reclaim.lease_id == idle.id
    assert m.run(3600) == [] and m.broker.lease(busy.id).state.value == "active"


def test_mig_with_gpm_detects_a_stalled_slice(make_machine: MachineFactory) -> None:
    m = make_machine("dgx-h100-mig:1", gpm=True)
    stalled, computing = m.submit("1g.10gb", "k1"), m.submit("1g.10gb", "k2")
    assert stalled is not None and computing is not None
    m.kernels.run("k1")
    m.kernels.run("k2")
    m.sim.set_load(computing.devices[0], utilization=75)
    (warn,) = m.run(905)
    assert warn.lease_id == stalled.id and warn.cause == "stalled"
    assert m.sampler.latest[computing.devices[0]].utilization_gpu == pytest.approx(75, abs=0.5)


def test_a_lease_without_a_kernel_is_never_reclaimed(make_machine: MachineFactory) -> None:
    m = make_machine()
    assert m.submit("1", "cli-run") is not None  # no kernel of this server
    m.run(3 * 3600)
    assert m.decisions == []


def test_exempt_users_and_groups_and_timeouts_per_class_and_profile(
    make_machine: MachineFactory,
) -> None:
    config = ReclaimConfig(
        idle_timeout_s=600,
        idle_timeout_by_class={"batch": 1800},
        idle_timeout_by_profile={"gpu": 300},
        grace_s=60,
        exempt_users=frozenset({"vip"}),
        exempt_groups=frozenset({"oncall"}),
    )
    m = make_machine("dgx-h100:4", reclaim=config)
    leases = {
        "k-vip": m.submit("1", "k-vip", user="vip"),
        "k-oncall": m.submit("1", "k-oncall", user="ann", groups=["oncall"]),
        "k-batch": m.submit("1", "k-batch", user="bob", job_class="batch"),
        "k-plain": m.submit("1", "k-plain", user="cy"),
    }
    for kernel in leases:
        m.kernels.finish(kernel)
    warned = m.run(305)
    # The profile's timeout (whole GPUs: 300 s) wins over the class's and the default.
    assert sorted(d.holder for d in warned) == ["k-batch", "k-plain"]
    m.run(3 * 3600)
    reclaimed = sorted(d.holder for d in m.decisions if d.action == "reclaim")
    assert reclaimed == ["k-batch", "k-plain"]
    assert ReclaimConfig(idle_timeout_by_class={"batch": 60}).idle_timeout("gpu", "batch") == 60
    with pytest.raises(InvalidRequest):
        ReclaimConfig(idle_timeout_by_class={"urgent": 60})
    with pytest.raises(InvalidRequest):
        ReclaimConfig(grace_s=-1)


def test_preemption_is_off_by_default(make_machine: MachineFactory) -> None:
    m = make_machine("dgx-h100:2", reclaim=ReclaimConfig(idle_timeout_s=0, stalled_timeout_s=0))
    for i in range(2):
        m.submit("1", f"a{i}", user="ann")
        m.kernels.run(f"a{i}")
    m.submit("1", "b0", user="bob")
    m.run(3600)
    assert m.decisions == []


def test_an_over_share_borrower_is_warned_and_preempted_for_an_under_share_user(
    make_machine: MachineFactory,
) -> None:
    config = ReclaimConfig(idle_timeout_s=0, grace_s=300, preemption=True)
    m = make_machine("dgx-h100:4", reclaim=config)
    ann = []
    for i in range(3):
        ann.append(m.submit("1", f"a{i}", user="ann"))
        m.kernels.run(f"a{i}")
        m.run(5)
    cy = m.submit("1", "c0", user="cy")
    m.kernels.run("c0")
    assert m.run(60) == []  # the machine is full, but nobody waits
    bob = m.broker.submit("bob", ONE_GPU, holder="b0")
    # Equal shares among ann, cy and bob: a third each. ann has had three of the four GPUs,
    # over theirs; cy one, under theirs; bob none. ann's newest lease is preempted.
    (warn,) = m.run(5)
    assert (warn.action, warn.cause, warn.lease_id) == ("warn", "preempted", ann[2].id)  # type: ignore[union-attr]
    assert "ann has used 75% of the recent GPU time for a 33% share" in warn.reason
    assert m.run(290) == []
    (reclaim,) = m.run(10)
    assert reclaim.lease_id == ann[2].id  # type: ignore[union-attr]
    assert m.broker.request(bob.id).state.value == "granted"
    assert cy is not None and m.broker.lease(cy.id).state.value == "active"
    assert m.store.reclaims()[0]["evidence"]["waiting_user"] == "bob"
    # A user over their share waiting takes nothing from anyone.
    m.broker.set_quota("user", "ann", Quota(share=0.1))
    m.broker.submit("ann", ONE_GPU, holder="a3")
    assert m.run(600) == []


def test_preemption_takes_from_the_user_the_queue_ranks_heaviest_not_the_newest_grant(
    make_machine: MachineFactory,
) -> None:
    config = ReclaimConfig(idle_timeout_s=0, stalled_timeout_s=0, grace_s=300, preemption=True)
    m = make_machine("dgx-h100:6", reclaim=config)
    ann = [m.submit("1", f"a{i}", user="ann") for i in range(3)]
    m.run(3600)  # ann has used three GPUs for an hour
    dan = [m.submit("1", f"d{i}", user="dan") for i in range(3)]
    m.run(60)  # dan took the other three a minute ago
    bob = m.broker.submit("bob", ONE_GPU, holder="b0")
    # The queue ranks ann below dan on fair share (the order a freed GPU would go in) ...
    assert m.broker.fairshare("ann", "") < m.broker.fairshare("dan", "")
    # ... and preemption agrees: ann's newest lease is taken for bob, not dan's.
    (warn,) = m.run(5)
    assert (warn.action, warn.lease_id) == ("warn", ann[2].id)  # type: ignore[union-attr]
    assert re.match(  # most of the recent GPU time (how much depends on the half-life)
        r"preempted: ann has used [89]\d% of the recent GPU time for a 33% share, "
        r"while bob \(0% for 33%\) waits",
        warn.reason,
    )
    (reclaim,) = m.run(300)
    assert reclaim.lease_id == ann[2].id  # type: ignore[union-attr]
    assert m.broker.request(bob.id).state.value == "granted"
    assert all(m.broker.lease(x.id).state.value == "active" for x in dan if x)


def test_a_preemption_warning_is_withdrawn_when_the_waiter_leaves(
    make_machine: MachineFactory,
) -> None:
    config = ReclaimConfig(idle_timeout_s=0, grace_s=300, preemption=True)
    m = make_machine("dgx-h100:2", reclaim=config)
    ann = [m.submit("1", "a0", user="ann")]
    m.run(5)
    ann.append(m.submit("1", "a1", user="ann"))
    waiting = m.broker.submit("bob", ONE_GPU, holder="b0")
    (warn,) = m.run(5)
    assert warn.lease_id == ann[1].id  # type: ignore[union-attr]
    m.broker.cancel(waiting.id)
    (clear,) = m.run(5)
    assert (clear.action, clear.reason) == ("clear", "no longer needed")


def test_keep_it_withdraws_the_warning_and_counts_as_activity(
    make_machine: MachineFactory,
) -> None:
    """The Lab panel's "keep it" on a reclaim warning: the lease is no longer due, and its
    idle time starts again from the click, as if the kernel had just run a cell."""
    m = make_machine()
    lease = m.submit("1", "k1")
    assert lease is not None
    m.kernels.finish("k1")
    reclaimer = m.sampler.reclaimer
    (warn,) = m.run(605)
    assert warn.action == "warn" and m.broker.lease(lease.id).reclaim_at is not None
    assert (reclaimer.idle_s(lease.id) or 0) >= 600  # what the Lab panel shows as idle
    reclaimer.keep(lease.id)
    assert m.broker.lease(lease.id).reclaim_at is None and reclaimer.idle_s(lease.id) == 0
    assert [e.detail for e in m.events if e.kind == "warning_cleared"] == [
        {"reason": "kept by its holder"}
    ]
    assert m.run(590) == []  # under idle_timeout since the click: no new warning
    (again,) = m.run(15)
    assert again.action == "warn" and m.broker.lease(lease.id).state.value == "active"


def test_idle_time_is_unknown_without_a_kernel_and_zero_while_computing(
    make_machine: MachineFactory,
) -> None:
    m = make_machine("dgx-h100:2")
    computing, orphan = m.submit("1", "k1"), m.submit("1", "cli-job")
    assert computing is not None and orphan is not None
    m.kernels.run("k1")
    m.run(30)
    assert m.sampler.reclaimer.idle_s(computing.id) == 0
    assert m.sampler.reclaimer.idle_s(orphan.id) is None


def test_a_gpu_servers_reservation_is_judged_by_the_server_timeout_of_its_size(
    make_machine: MachineFactory,
) -> None:
    """A GPU server's lease (owner ``server:...``) idles as a kernel's does, with the
    timeouts for servers; a kernel's lease of the same size keeps the kernels'."""
    config = ReclaimConfig(
        idle_timeout_s=600,
        grace_s=120,
        server_idle_timeout_s=3600,
        server_idle_timeout_by_profile={"gpu:1": 300},
    )
    m = make_machine("dgx-h100:2", reclaim=config)
    server, kernel = m.submit("1", "server:ann"), m.submit("1", "k1")
    assert server is not None and kernel is not None
    m.kernels.finish("server:ann")  # as the server reports all its kernels: idle
    m.kernels.finish("k1")
    (warn,) = m.run(305)
    assert (warn.action, warn.lease_id, warn.holder) == ("warn", server.id, "server:ann")
    assert warn.evidence["timeout_s"] == 300
    # the server's is reclaimed after the grace; the kernel's is warned at its own 600 s
    assert [(d.action, d.lease_id) for d in m.run(300)] == [
        ("reclaim", server.id),
        ("warn", kernel.id),
    ]
