"""Pid namespaces as ``pidns`` reads them: a process's own, another's made by ``unshare``
(root only), and when a broker can match the processes NVML lists to its kernels."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jupyter_gpubroker import pidns
from jupyter_gpubroker.wire.text import BROKER_PID_NAMESPACE

OWN = "from jupyter_gpubroker import pidns; print(pidns.own())"


def test_a_process_names_its_pid_namespace_as_the_kernel_does() -> None:
    assert pidns.own() == os.readlink("/proc/self/ns/pid")
    assert pidns.FORMAT.fullmatch(pidns.own())
    child = subprocess.run([sys.executable, "-c", OWN], capture_output=True, text=True)
    assert child.stdout.strip() == pidns.own()  # a child shares it


@pytest.mark.skipif(os.geteuid() != 0, reason="unshare --pid needs root")
def test_a_process_in_a_pid_namespace_of_its_own_names_another() -> None:
    unshared = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", OWN]
    theirs = subprocess.run(unshared, capture_output=True, text=True, check=True).stdout.strip()
    assert pidns.FORMAT.fullmatch(theirs) and theirs != pidns.own()


def test_only_a_broker_in_the_hosts_namespace_or_on_simulated_gpus_matches_nvml() -> None:
    container = "pid:[4026532175]"
    assert pidns.nvml_unseen(pidns.HOST, simulated=False) is None
    assert pidns.nvml_unseen(container, simulated=True) is None  # it lists the broker's pids
    assert pidns.nvml_unseen(container, simulated=False) == BROKER_PID_NAMESPACE
    assert pidns.nvml_unseen("", simulated=False) == BROKER_PID_NAMESPACE  # no /proc: unknown
