"""Pids of another pid namespace, as a running broker takes them: a renewal that names its
holder process in another namespace than the broker's renews its lease and is not read,
and the lease's kernel is then neither suspended nor moved, saying why; a broker on real
GPUs outside the host's namespace says at its start that it cannot match the processes
NVML lists, and every GPU's idle reclaim says so. (The end-to-end runs, with namespaces
made by ``unshare``, are ``tests/server/test_remote_pid_namespace.py`` and
``tests/suspend/test_suspend_pid_namespace_e2e.py``.)"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest
from runtime_helpers import make

from jupyter_gpubroker import pidns
from jupyter_gpubroker.api.rules import BrokerAPI
from jupyter_gpubroker.broker.reclaim import Decision
from jupyter_gpubroker.cli.status import idle_reclaim_lines
from jupyter_gpubroker.runtime import pid_view
from jupyter_gpubroker.wire.errors import InvalidRequest
from jupyter_gpubroker.wire.text import BROKER_PID_NAMESPACE, KERNEL_PID_NAMESPACE

ELSEWHERE = "pid:[4026532999]"
"""A pid namespace that is not this broker's."""


def test_a_renewal_that_names_its_process_in_another_pid_namespace_renews_unread(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rt = make(tmp_path, simulate="dgx-h100:2", reclaim_action="suspend")
    rt.start()
    try:
        api = BrokerAPI(rt)
        me = api.user_identity(None)
        lease = api.submit(me, {"gpus": 1, "holder": "kernel-1"})["lease"]["id"]
        with pytest.raises(InvalidRequest, match="from 2 to"):  # init: every process its own
            api.renew(me, lease, {"holder_pid": 1})
        api.renew(me, lease, {"holder_pid": os.getpid()})
        assert rt.holder_pid(lease) == os.getpid()
        with caplog.at_level(logging.WARNING):
            for _ in range(2):  # a container's kernel may be its init
                api.renew(me, lease, {"holder_pid": 1, "pid_namespace": ELSEWHERE})
        assert rt.holder_pid(lease) is None  # the pid of before no longer holds it
        said = [r.getMessage() for r in caplog.records if KERNEL_PID_NAMESPACE in r.getMessage()]
        assert said == [
            f"GPU broker: lease {lease} of {rt.owner}: {KERNEL_PID_NAMESPACE}, so it is not "
            "suspended or moved, and its processes on the GPUs are told from outside use by "
            "their owner alone"
        ]
        held = rt.core.lease(lease)
        assert rt.mover.why_not(held) == KERNEL_PID_NAMESPACE
        idle = Decision("suspend", lease, "kernel-1", "idle", "idle for 25 min", {})
        assert asyncio.run(rt.suspender.suspend(idle)) == "shutdown"
        reason = rt.core.lease(lease).reason
        assert reason == f"idle for 25 min; not suspended: {KERNEL_PID_NAMESPACE}"

        again = api.submit(me, {"gpus": 1, "holder": "kernel-2"})["lease"]["id"]
        api.renew(me, again, {"holder_pid": 1, "pid_namespace": ELSEWHERE})
        here = {"holder_pid": os.getpid(), "pid_namespace": pidns.own()}
        api.renew(me, again, here)
        assert rt.holder_pid(again) == os.getpid()  # read, as before
        assert rt.mover.why_not(rt.core.lease(again)) is None
    finally:
        rt.stop()


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"holder_pid": 4242, "pid_namespace": "4026532999"}, "'pid_namespace' must name"),
        ({"holder_pid": 4242, "pid_namespace": 4026532999}, "'pid_namespace' must name"),
        ({"holder_pid": 4242, "pid_namespace": "pid:[1]x"}, "'pid_namespace' must name"),
        ({"pid_namespace": ELSEWHERE}, "'pid_namespace' says where 'holder_pid' counts"),
        ({"holder_pid": 0, "pid_namespace": ELSEWHERE}, "'holder_pid' must be a process id"),
    ],
)
def test_a_renewal_with_a_bad_pid_namespace_is_refused_saying_why(
    tmp_path: Path, body: dict[str, object], words: str
) -> None:
    rt = make(tmp_path, simulate="dgx-h100:1")
    rt.start()
    try:
        api = BrokerAPI(rt)
        me = api.user_identity(None)
        lease = api.submit(me, {"gpus": 1, "holder": "kernel-1"})["lease"]["id"]
        expires = rt.core.lease(lease).expires_at
        with pytest.raises(InvalidRequest) as refused:
            api.renew(me, lease, body)
        assert refused.value.message.startswith(words)
        assert rt.core.lease(lease).expires_at == expires  # not renewed
    finally:
        rt.stop()


def test_a_broker_on_real_gpus_outside_the_hosts_pid_namespace_matches_no_process(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVIDIA's driver may list GPU processes by the host's pids: such a broker says so at
    its start, watches no outside use, and every GPU's idle reclaim shuts down, saying
    why. (No real GPU here: the namespace and the driver are what ``nvml_unseen`` is told.)"""
    rule = pidns.nvml_unseen
    monkeypatch.setattr(pid_view.pidns, "own", lambda: ELSEWHERE)
    monkeypatch.setattr(pid_view.pidns, "nvml_unseen", lambda ns, simulated: rule(ns, False))
    rt = make(tmp_path, simulate="dgx-h100:2", reclaim_action="auto")
    with caplog.at_level(logging.WARNING):
        rt.start()
    try:
        assert rt.sampler.outside is None
        said = [r.getMessage() for r in caplog.records if BROKER_PID_NAMESPACE in r.getMessage()]
        assert said == [
            f"GPU broker: {BROKER_PID_NAMESPACE}: it reports no outside use, and suspends "
            "and moves no kernel"
        ]
        shown = {"action": "shutdown", "reason": BROKER_PID_NAMESPACE}
        assert rt.idle_reclaim() == {d.uuid: shown for d in rt.core.inventory.devices}
        api = BrokerAPI(rt)
        assert idle_reclaim_lines(api.devices(api.user_identity(None))["gpus"]) == [  # status
            f"Idle kernels on GPU 0, GPU 1 are shut down: {BROKER_PID_NAMESPACE}."
        ]
        lease = api.submit(api.user_identity(None), {"gpus": 1, "holder": "k"})["lease"]["id"]
        assert rt.mover.why_not(rt.core.lease(lease)) == BROKER_PID_NAMESPACE
    finally:
        rt.stop()
