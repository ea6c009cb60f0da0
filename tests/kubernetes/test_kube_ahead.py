"""GPUs kept warm on Kubernetes ahead of the forecast (``c.GPUBroker.kube_ahead``), on the
real control plane ``.ci/kube-up`` starts: kube-apiserver with RBAC, kube-scheduler, the
controller manager and KWOK. The history is seeded through the real core on a virtual
clock: three days on which ann holds gpu-h100's four GPUs 09:00-11:00 while bob's one GPU
waits, so the forecast's p90 of Thursday 09:00-10:00 is five GPUs.

At 08:00 the broker makes five placeholder pods: the scheduler binds four to gpu-h100 and
leaves the fifth unschedulable, which is what cluster-autoscaler adds a node for. No
autoscaler runs here: one test plays its part and adds the node itself. A grant's pod
preempts placeholders and runs; the trough deletes the rest; the day's cap of GPU-hours
stops them, also across a restart; a class GPU servers could not preempt, and RBAC that
lacks any one rule the docs give, are each said in one sentence."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from traitlets.config import Config

pytest.importorskip("kubernetes_asyncio", reason="the kubernetes extra")

from kube_broker import drains, lease_of, make_broker, poll  # noqa: E402
from kube_cluster import (  # noqa: E402
    KUBECONFIG,
    NAMESPACE,
    get,
    kubectl,
    node_manifest,
    pod_manifest,
    running,
    until,
)
from kube_rbac import DOCS, documented_rules, service_account  # noqa: E402

from jupyter_gpubroker.broker.clock import VirtualClock  # noqa: E402
from jupyter_gpubroker.broker.store import Store  # noqa: E402
from jupyter_gpubroker.engines.kubernetes import (  # noqa: E402
    BROKER_LABEL,
    LEASE_LABEL,
    PLACEHOLDER_LABEL,
    parse_device_uuid,
)
from jupyter_gpubroker.runtime import GPUBroker, kube_ahead  # noqa: E402
from jupyter_gpubroker.wire.sizes import Size  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("kube")]

HOUR, DAY = 3600.0, 86400.0
MONDAY_9 = 1_764_579_600.0  # Monday 2025-12-01 09:00 UTC
CLASS = "gpubroker-test-placeholder"
HEAD = "GPUs kept warm on Kubernetes ahead of the forecast: "
PLACEHOLDERS = {
    "placeholder_namespace": NAMESPACE,
    "placeholder_priority_class": CLASS,
    "placeholder_node_selector": {"kubernetes.io/hostname": "gpu-h100"},
}
THURSDAY_PEAK = (
    "forecast: at most 5.0 GPUs asked Thu 08:00-09:00 and Thu 09:00-10:00 (p90); "
    "none held or waited for now, so five GPUs kept warm"
)


@pytest.fixture(autouse=True)
def no_class() -> Iterator[None]:
    """The placeholders' PriorityClass missing before and after, so the broker makes it."""
    kubectl("delete", "priorityclass", CLASS, "--ignore-not-found")
    yield
    kubectl("delete", "priorityclass", CLASS, "--ignore-not-found")


def ahead_broker(state: Path, kubeconfig: Path | None = None, **traits: Any) -> GPUBroker:
    """A started broker that keeps GPUs warm on gpu-h100, its core on a virtual clock."""
    more = {"kubeconfig": kubeconfig} if kubeconfig else {}
    broker = make_broker(state, inventory=PLACEHOLDERS, kube_ahead=True, **more, **traits)
    broker.start()
    return broker


def seeded(broker: GPUBroker) -> VirtualClock:
    """The three days of history; the clock then at Thursday 08:00."""
    clock = VirtualClock(MONDAY_9)
    core = broker.core
    core.clock.now = clock.now  # type: ignore[method-assign]
    for day in range(3):
        held, waits = core.submit("ann", Size(gpus=4)), core.submit("bob", Size(gpus=1))
        assert held.lease_id and waits.lease_id is None
        clock.advance(2 * HOUR)
        core.cancel(waits.id)
        core.release(held.lease_id)
        clock.advance((22 if day < 2 else 21) * HOUR)
    return clock


def keep_warm(broker: GPUBroker) -> None:
    """One pass, as the broker runs one every 30 seconds."""
    asyncio.run(broker.keep_warm(broker.core, broker.log))


def placeholders() -> list[dict[str, Any]]:
    found = get("pods", "-n", NAMESPACE, "-l", PLACEHOLDER_LABEL)["items"]
    return [p for p in found if not p["metadata"].get("deletionTimestamp")]


def unschedulable(pod: dict[str, Any]) -> bool:
    conditions = pod["status"].get("conditions") or []
    return any(
        c["type"] == "PodScheduled" and c["status"] == "False" and c["reason"] == "Unschedulable"
        for c in conditions
    )


def four_run_one_waits() -> list[dict[str, Any]] | None:
    pods = placeholders()
    phases = sorted(p["status"].get("phase") for p in pods)
    waiting = [p for p in pods if unschedulable(p)]
    return pods if phases == ["Pending"] + ["Running"] * 4 and len(waiting) == 1 else None


def audited(broker: GPUBroker, action: str) -> list[dict[str, Any]]:
    found = broker.core.store.audit(actor="forecast", limit=1000)
    return [a for a in found if a["action"] == action]


def kube_state(broker: GPUBroker) -> dict[str, Any]:
    (state,) = [a for a in broker.acting_ahead() if a["kind"] == "kube_ahead"]
    return state


def test_placeholders_keep_the_peak_warm_a_grant_preempts_them_and_the_trough_ends_them(
    tmp_path: Path,
) -> None:
    broker = ahead_broker(tmp_path / "state.sqlite")
    try:
        clock = seeded(broker)
        core = broker.core
        keep_warm(broker)
        pods = until("four placeholders to run and one to wait", four_run_one_waits)
        assert {p["spec"]["priorityClassName"] for p in pods} == {CLASS}
        assert {p["spec"]["priority"] for p in pods} == {-10}
        assert {p["spec"].get("nodeName") for p in pods} == {"gpu-h100", None}
        (waiting,) = [p for p in pods if unschedulable(p)]
        said = next(c for c in waiting["status"]["conditions"] if c["type"] == "PodScheduled")
        assert "Insufficient nvidia.com/gpu" in said["message"]
        made = get("priorityclass", CLASS)
        assert (made["value"], made["preemptionPolicy"]) == (-10, "Never")
        assert not made.get("globalDefault")  # false, which the API server leaves out
        created = audited(broker, "kube_placeholder_create")
        assert [a["detail"]["reason"] for a in created] == [THURSDAY_PEAK] * 5
        assert kube_state(broker) == {
            "kind": "kube_ahead",
            "on": True,
            "acting": True,
            "text": HEAD + "on, five GPUs kept warm now, 0.0 of 24 GPU-hours today",
        }
        # their GPUs are the broker's to grant: neither outside use nor a lease's
        poll(broker)
        assert "gpu-h100" not in drains(broker)

        clock.advance(HOUR)  # 09:00: ann's grant; her pod preempts two placeholders and runs
        granted = core.submit("ann", Size(gpus=2))
        lease = lease_of(broker, granted.id)
        pod = pod_manifest(
            "ann", "gpu-h100", {"nvidia.com/gpu": "2"}, **{BROKER_LABEL: "gpubroker"}
        )
        pod["metadata"]["labels"][LEASE_LABEL] = lease.id
        uid = json.loads(kubectl("create", "-o", "json", "-f", "-", input=pod))["metadata"]["uid"]
        assert running("ann")["spec"]["nodeName"] == "gpu-h100"
        events = get("events", "-n", NAMESPACE, "--field-selector", "reason=Preempted")["items"]
        # by ann's pod (events outlive their pods); one event or two per victim
        said = {e["message"] for e in events if uid in e["message"]}
        assert said == {f"Preempted by pod {uid} on node gpu-h100"}
        victims = {e["involvedObject"]["name"] for e in events if uid in e["message"]}
        assert len(victims) >= 2 and victims <= {p["metadata"]["name"] for p in pods}
        keep_warm(broker)  # 5 - 2 held: three kept, what the forecast still asks
        gone = audited(broker, "kube_placeholder_gone")
        assert {a["target"] for a in gone} == {f"{NAMESPACE}/{v}" for v in victims}
        assert {a["detail"]["reason"] for a in gone} == {
            "it is gone: the scheduler preempted it for a pod of higher priority, or it was deleted"
        }
        made = audited(broker, "kube_placeholder_create")
        assert len(made) == 5 + len(victims) - 2  # more only where the scheduler took more
        assert len(placeholders()) == 3
        poll(broker)
        assert core.lease(lease.id).state.value == "active"
        assert "gpu-h100" not in drains(broker)

        clock.advance(3 * HOUR)  # 12:00, the trough: all go, the waiting one first
        keep_warm(broker)
        until("the placeholders to go", lambda: placeholders() == [])
        deleted = audited(broker, "kube_placeholder_delete")
        assert [a["detail"]["node"] for a in deleted] == [None, "gpu-h100", "gpu-h100"]
        assert {a["detail"]["reason"] for a in deleted} == {
            "forecast: no GPU asked Thu 12:00-13:00 and Thu 13:00-14:00 (p90); 2.0 GPUs held "
            "or waited for now, so no GPUs kept warm"
        }
        assert running("ann")["metadata"]["uid"] == uid  # a holder is never touched
    finally:
        broker.stop()


def test_the_days_cap_stops_them_also_after_a_restart_until_the_next_day(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state.sqlite"
    broker = ahead_broker(state, kube_ahead_max_gpu_hours=2)
    try:
        clock = seeded(broker)
        keep_warm(broker)
        assert len(placeholders()) == 5
        clock.advance(20 * 60)  # five GPUs for 20 minutes: 1.7 GPU-hours
        keep_warm(broker)
        assert len(placeholders()) == 5
        clock.advance(5 * 60)  # 2.1: the cap is spent
        keep_warm(broker)
        until("the placeholders to go", lambda: placeholders() == [])
        deleted = audited(broker, "kube_placeholder_delete")
        assert [a["detail"]["reason"] for a in deleted] == [
            "today's 2 GPU-hours kept warm are spent"
        ] * 5
        assert kube_state(broker)["text"] == (
            HEAD + "on, but none is: today's 2 GPU-hours are spent (more from midnight UTC)"
        )
        assert kube_state(broker)["acting"] is False
    finally:
        broker.stop()
    again = ahead_broker(state, kube_ahead_max_gpu_hours=2)
    try:
        clock = VirtualClock(MONDAY_9 + 3 * DAY - HOUR / 2)  # Thursday 08:30
        again.core.clock.now = clock.now  # type: ignore[method-assign]
        keep_warm(again)  # the audit log says what was spent today
        assert placeholders() == []
        clock.advance(DAY - HOUR / 2)  # Friday 08:00
        keep_warm(again)
        assert len(placeholders()) == 5
    finally:
        again.stop()  # a stopping broker deletes its placeholders
    assert placeholders() == []
    store = Store(state)
    try:
        ended = [a for a in store.audit(limit=1000) if a["action"] == "kube_placeholder_delete"]
        assert [a["detail"]["reason"] for a in ended[5:]] == ["the broker stops"] * 5
    finally:
        store.close()


def test_off_nothing_is_made_and_a_class_gpu_servers_cannot_preempt_is_refused(
    tmp_path: Path,
) -> None:
    off = make_broker(tmp_path / "off.sqlite", inventory=PLACEHOLDERS)
    off.start()
    try:
        seeded(off)
        keep_warm(off)
        assert placeholders() == []
        assert kube_state(off) == {
            "kind": "kube_ahead",
            "on": False,
            "acting": False,
            "text": HEAD + "off",
        }
    finally:
        off.stop()
    high = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "value": 5}
    kubectl("create", "-f", "-", input={**high, "metadata": {"name": CLASS}})
    broker = ahead_broker(tmp_path / "high.sqlite")
    try:
        seeded(broker)
        keep_warm(broker)
        assert placeholders() == []
        assert kube_state(broker)["text"] == HEAD + (
            f"on, but none is: PriorityClass {CLASS} has priority 5, so GPU servers (priority "
            "0 unless set) would not preempt its placeholder pods: give them a class below 0 "
            "(cluster-autoscaler's recipe uses -10)"
        )
    finally:
        broker.stop()


PODS = (
    "pods in namespace gpubroker-test: grant the broker's service account create and delete "
    "on pods in namespace gpubroker-test (the Role gpubroker-placeholders in docs/kubernetes.md)"
)
CLASSES = (
    f"PriorityClass {CLASS} (403 Forbidden): grant the broker's service account get and "
    "create on priorityclasses in scheduling.k8s.io (the ClusterRole gpubroker-placeholders "
    "in docs/kubernetes.md)"
)
REFUSED = {
    ("pods", "create"): f"RBAC does not let the broker create {PODS}",
    ("pods", "delete"): f"RBAC does not let the broker delete {PODS}",
    ("priorityclasses", "get"): f"the Kubernetes API server refused to get {CLASSES}",
    ("priorityclasses", "create"): f"the Kubernetes API server refused to create {CLASSES}",
}
"""What the broker says when its roles lack each verb the docs give for placeholders: asked
before any placeholder is made, so none is made that it could not delete."""


def test_the_documented_rbac_is_all_placeholders_need_and_each_verb_is_needed(
    tmp_path: Path, accounts: list[str]
) -> None:
    base = documented_rules()
    cluster = documented_rules("ClusterRole", "gpubroker-placeholders")
    namespaced = documented_rules("Role", "gpubroker-placeholders")

    def trial(name: str, cluster: list[dict[str, Any]], namespaced: list[dict[str, Any]]) -> str:
        """Placeholders made at 08:00 and deleted at 12:00 by a broker with these roles:
        what it says of them then ("" where it said nothing)."""
        kubectl("delete", "priorityclass", CLASS, "--ignore-not-found")
        accounts.append(name)
        kubeconfig = service_account(tmp_path, name, base + cluster, namespaced)
        broker = ahead_broker(tmp_path / f"{name}.sqlite", kubeconfig)
        try:
            clock = seeded(broker)
            keep_warm(broker)
            made = len(placeholders())
            clock.advance(4 * HOUR)  # the trough, past the retry of a refusal
            keep_warm(broker)
            text = kube_state(broker)["text"].removeprefix(HEAD)
            assert made in (0, 5) and placeholders() == [], text
            return "" if made == 5 else text
        finally:
            broker.stop()
            kubectl("delete", "pods", "-n", NAMESPACE, "-l", PLACEHOLDER_LABEL, "--wait=true")

    assert trial("gpubroker-ahead-docs", cluster, namespaced) == ""
    rules = [("cluster", i, r) for i, r in enumerate(cluster)]
    rules += [("namespaced", i, r) for i, r in enumerate(namespaced)]
    verbs = [(w, i, r, v) for w, i, rule in rules for r in rule["resources"] for v in rule["verbs"]]
    assert sorted((r, v) for _, _, r, v in verbs) == sorted(REFUSED)
    for where, i, resource, verb in verbs:
        fewer = {"cluster": [dict(r) for r in cluster], "namespaced": [dict(r) for r in namespaced]}
        rule = fewer[where][i]
        fewer[where][i] = dict(rule, resources=[x for x in rule["resources"] if x != resource])
        less = [v for v in rule["verbs"] if v != verb]
        fewer[where].append(dict(rule, resources=[resource], verbs=less))
        kept = {k: [r for r in v if r["resources"] and r["verbs"]] for k, v in fewer.items()}
        said = trial(f"gpubroker-ahead-no-{verb}-{resource}", kept["cluster"], kept["namespaced"])
        assert said == "on, but none is: " + REFUSED[(resource, verb)], (verb, resource)


async def test_a_running_broker_keeps_them_on_its_own_and_deletes_them_as_it_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The passes a started broker runs itself (every 30 seconds; here every 0.2)."""
    monkeypatch.setattr(kube_ahead, "EVERY_S", 0.2)
    broker = ahead_broker(tmp_path / "state.sqlite")
    try:
        seeded(broker)
        broker.start_ticking()
        await asyncio.to_thread(until, "five placeholders", lambda: len(placeholders()) == 5)
    finally:
        broker.stop()
    assert placeholders() == []


def test_a_node_that_joins_takes_the_waiting_placeholder_and_its_gpus_are_free_to_grants(
    tmp_path: Path,
) -> None:
    """No autoscaler runs here, so the test plays its part: it adds a node like gpu-h100,
    as cluster-autoscaler would for the placeholder it found unschedulable."""
    h100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}  # gpu-h100's node group
    inventory = PLACEHOLDERS | {"placeholder_node_selector": h100}
    broker = make_broker(tmp_path / "state.sqlite", inventory=inventory, kube_ahead=True)
    broker.start()
    added = node_manifest("gpu-h100")
    added["metadata"]["name"] = "gpu-h100-added"
    added["metadata"]["labels"]["kubernetes.io/hostname"] = "gpu-h100-added"
    try:
        seeded(broker)
        keep_warm(broker)
        until("four placeholders to run and one to wait", four_run_one_waits)
        kubectl("create", "-f", "-", input=added)

        def all_run() -> bool:
            return sorted(p["status"].get("phase") for p in placeholders()) == ["Running"] * 5

        until("the waiting placeholder to run on the node that joined", all_run, timeout_s=90)
        assert sorted(p["spec"]["nodeName"] for p in placeholders()) == [
            "gpu-h100",
        ] * 4 + ["gpu-h100-added"]
        poll(broker)
        joined = [d for d in broker.core.inventory.devices if d.node == "gpu-h100-added"]
        assert len(joined) == 4
        assert "gpu-h100-added" not in drains(broker)  # the placeholder's GPU is free to grants
        core = broker.core  # four GPUs on each node, all free to grants
        granted = [lease_of(broker, core.submit(u, Size(gpus=4)).id) for u in ("ann", "bob")]
        nodes = {parse_device_uuid(u)[0] for x in granted for u in x.devices}
        assert nodes == {"gpu-h100", "gpu-h100-added"}
    finally:
        broker.stop()
        kubectl("delete", "node", "gpu-h100-added", "--ignore-not-found")


def test_the_documented_settings_are_a_broker_that_keeps_gpus_warm(tmp_path: Path) -> None:
    """docs/kubernetes.md's settings, as a config file holds them (its kubeconfig aside)."""
    page = DOCS.read_text().split("### GPUs kept warm ahead of the forecast\n", 1)[1]
    block = page.split("```python\n", 1)[1].split("```", 1)[0]
    config = Config()
    exec(block, {"c": config})
    config.KubernetesInventory.kubeconfig = str(KUBECONFIG)
    config.GPUBroker.state_file = str(tmp_path / "state.sqlite")
    broker = GPUBroker(inventory_source="kubernetes", config=config)
    broker.start()
    try:
        assert broker.kube_ahead is True and broker.kube_ahead_max_gpu_hours == 24
        keep_warm(broker)  # no history yet: nothing to keep warm, but it may
        assert kube_state(broker)["text"] == (
            HEAD + "on, no GPUs kept warm now, 0.0 of 24 GPU-hours today"
        )
        made = get("priorityclass", "gpubroker-placeholder")
        assert made["value"] == -10
    finally:
        broker.stop()
        kubectl("delete", "priorityclass", "gpubroker-placeholder", "--ignore-not-found")
