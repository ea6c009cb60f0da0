"""Slurm's power saving as the broker reads and uses it, after Slurm 22.05's slurm.conf(5)
and scontrol(1) (Debian 12's slurm-wlm 22.05.8, checked on the test cluster):

- A node's power state is a flag of its ``State``: ``POWERED_DOWN`` (asleep),
  ``POWER_DOWN`` (to be put to sleep once it runs nothing) and ``POWERING_DOWN`` (its
  ``SuspendProgram`` ran; asleep after ``SuspendTimeout``), ``POWER_UP`` (asked to wake)
  and ``POWERING_UP`` (its ``ResumeProgram`` runs; awake once its slurmd registers, within
  ``ResumeTimeout``). A job sent to a sleeping node wakes it too.
- A node may sleep when Slurm has a ``SuspendProgram`` and a ``ResumeProgram``, when its
  ``SuspendTime`` (the highest its partitions set, else the cluster's) is not
  ``INFINITE``, and when neither ``SuspendExcNodes`` nor ``SuspendExcParts`` names it.
  Slurm puts such a node to sleep itself after ``SuspendTime`` idle.
- ``scontrol update NodeName=X State=POWER_UP`` wakes a node and ``State=POWER_DOWN`` puts
  it to sleep once it runs nothing. ``POWER_DOWN`` does not honour ``SuspendExcNodes``, so
  the broker checks it first. With ``SuspendTime=INFINITE`` everywhere Slurm refuses both
  ("Invalid node state specified"). Version 22.05 has no ``scontrol power`` subcommand
  (23.02 added it). Both need Slurm's Admin level: root or ``SlurmUser`` where no
  accounting database grants it.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from ..broker.node_power import ASLEEP, AWAKE, FALLING, WAKING

NEVER = ("INFINITE", "NONE", "UNLIMITED", "-1")
"""How ``SuspendTime`` says that nodes never sleep."""
_COUNT = re.compile(r":\d+(?=,|$)")

Exec = Callable[..., Awaitable[tuple[int, str, str]]]
"""Runs a command: its exit status, stdout and stderr."""


def power_state(flags: Iterable[str]) -> str:
    """A node's power state from the flags of its ``State`` (``IDLE+POWERED_DOWN``)."""
    found = set(flags)
    if found & {"POWER_UP", "POWERING_UP"}:
        return WAKING
    if found & {"POWER_DOWN", "POWERING_DOWN"}:
        return FALLING
    return ASLEEP if "POWERED_DOWN" in found else AWAKE


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config``'s ``Key = value`` lines."""
    found = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            found[key.strip()] = value.strip()
    return found


def sleeps(value: str) -> bool:
    """Whether a ``SuspendTime`` lets nodes sleep (``3600 sec``, not ``INFINITE``)."""
    return value.split(" ")[0].upper() not in NEVER


@dataclass(frozen=True)
class SleepConfig:
    """Which nodes Slurm's power saving lets sleep (see the module's docstring)."""

    off: str | None
    """Why it puts no node to sleep here, or None."""
    suspend_time: str = "INFINITE"
    partition_times: Mapping[str, str] = field(default_factory=dict)
    """Partition -> the ``SuspendTime`` it sets (the others take the cluster's)."""
    exc_nodes: frozenset[str] = frozenset()
    exc_parts: frozenset[str] = frozenset()

    def may_sleep(self, node: str, partitions: Iterable[str]) -> bool:
        partitions = set(partitions)
        if self.off is not None or node in self.exc_nodes or partitions & self.exc_parts:
            return False
        times = [self.partition_times[p] for p in partitions if p in self.partition_times]
        return all(sleeps(t) for t in times) if times else sleeps(self.suspend_time)


def partition_times(text: str) -> dict[str, str]:
    """Partition -> its own ``SuspendTime``, from ``scontrol show partition -o`` (a
    partition that sets none prints none, or ``GLOBAL``)."""
    found = {}
    for line in text.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        value = fields.get("SuspendTime", "GLOBAL")
        if "PartitionName" in fields and value != "GLOBAL":
            found[fields["PartitionName"]] = value
    return found


def sleep_config(config: Mapping[str, str], times: Mapping[str, str]) -> SleepConfig:
    """What ``scontrol show config`` and the partitions' own ``SuspendTime`` say; the
    excluded nodes still as Slurm's hostlist (see :func:`read_sleep_config`)."""
    unset = ("", "(null)")
    programs = [k for k in ("ResumeProgram", "SuspendProgram") if config.get(k, "") in unset]
    if programs:
        return SleepConfig(f"Slurm's power saving is off here (no {' and no '.join(programs)})")
    suspend_time = config.get("SuspendTime", "INFINITE")
    if not sleeps(suspend_time) and not any(sleeps(t) for t in times.values()):
        return SleepConfig("Slurm's power saving is off here (its SuspendTime is INFINITE)")
    parts = config.get("SuspendExcParts", "(null)")
    return SleepConfig(
        None,
        suspend_time,
        dict(times),
        exc_parts=frozenset() if parts == "(null)" else frozenset(parts.split(",")),
    )


async def read_sleep_config(run: Callable[..., Awaitable[str]], scontrol: str) -> SleepConfig:
    """Slurm's power saving, read from slurmctld. A ``SuspendExcNodes`` entry with a count
    (``nid[10-20]:4``: four of them stay awake) counts as all of its nodes: the broker
    puts none of them to sleep."""
    config = parse_config(await run(scontrol, "show", "config"))
    found = sleep_config(config, partition_times(await run(scontrol, "show", "partition", "-o")))
    excluded = _COUNT.sub("", config.get("SuspendExcNodes", "(null)"))
    if found.off is not None or excluded in ("", "(null)"):
        return found
    names = await run(scontrol, "show", "hostnames", excluded)
    return replace(found, exc_nodes=frozenset(names.split()))


class PowerRefused(RuntimeError):
    """Slurm did not take a power change; the message says it in a sentence."""


async def set_power(exec_: Exec, scontrol: str, node: str, up: bool) -> None:
    """Wake ``node`` (``State=POWER_UP``) or put it to sleep once it runs nothing
    (``State=POWER_DOWN``); :class:`PowerRefused` when Slurm says no."""
    state = "POWER_UP" if up else "POWER_DOWN"
    status, _, err = await exec_(scontrol, "update", f"NodeName={node}", f"State={state}")
    if status != 0:
        why = (err.strip().splitlines() or [f"exit status {status}"])[-1]
        why = why.removeprefix("slurm_update error: ")
        raise PowerRefused(
            f"Slurm refused to {'wake' if up else 'put to sleep'} {node} "
            f"(scontrol update NodeName={node} State={state}: {why})"
        )
