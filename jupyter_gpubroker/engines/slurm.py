"""Slurm as the broker's inventory: the nodes' GPU gres, read from ``slurmctld`` every tick.

``SlurmInventory`` (``c.GPUBroker.inventory_source = "slurm"``, configured as
``c.SlurmInventory.*``) runs ``scontrol show node -o -d`` and ``squeue`` as asyncio
subprocesses and turns them into a :class:`ClusterView`:

- every node with GPU gres is a node of the inventory. A gres type that names a MIG
  profile (``gpu:1g.10gb:7``, or a site's ``gpu:nvidia_h100_1g.10gb:7``) is a MIG slice
  of that profile; any other type (``gpu:h100:4``) is a whole GPU. Slurm does not say
  which physical GPU a slice is on, so a node's slices are packed into GPUs of seven
  compute slices in the order Slurm lists them (for the picture and accounting only:
  Slurm picks the device, the broker only the node, the type and the count);
- ``GresUsed`` minus what the broker's own jobs use is work started outside the hub;
  the broker's jobs are the ones whose comment is ``gpubroker-lease=<lease id>``, which
  the Slurm spawner sets at submission;
- a node Slurm has drained, lost or marked down is down, with Slurm's reason; one that
  sleeps under Slurm's power saving, wakes up or goes to sleep is held back the same way,
  as asleep (``ClusterView.asleep``); :mod:`.slurm_power` says which may sleep and wakes a
  node or puts it to sleep (``c.GPUBroker.slurm_ahead``);
- with ``partitions`` set, only the nodes of those partitions are the broker's;
- the broker's jobs Slurm still has (pending or running), by lease, so a lease whose
  job ended is released, and the gres each running one holds, so a job still running
  after its lease ended (a reclaim's ``scancel`` not through yet) holds them back.

A device's UUID is ``slurm__<node>__<gres type>__<n>``: the spawner reads the node and
the gres type to submit from the lease's devices (:func:`gres_request`).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from traitlets import Dict, List, TraitError, Unicode, validate

from ..broker.models import Device, Gpu, Inventory
from ..broker.node_power import AWAKE
from ..wire.errors import InvalidRequest
from ..wire.profiles import ALL_PROFILE_NAMES, CATALOG, COMPUTE_SLICES, MEMORY_SLICES, GpuModel
from ..wire.sizes import MAX_MEMORY_GB, RESOLUTION, gb_to_mib, number
from ..wire.traits import Seconds
from . import ClusterView, EngineUnavailable, InventorySource
from .slurm_power import SleepConfig, power_state, read_sleep_config, set_power

if TYPE_CHECKING:
    from ..inventory import OpenInventory
    from ..runtime.settings import BrokerSettings

COMMENT_PREFIX = "gpubroker-lease="
"""The comment of a job the broker granted: ``gpubroker-lease=<lease id>``."""
SEP = "__"
"""Between the parts of a device UUID (node names and gres types have no double underscore)."""
SQUEUE_FORMAT = "%i|%T|%N|%b|%k"
"""Job id, state, nodes, gres per node, comment (last: a comment may hold anything)."""
DOWN_FLAGS = frozenset(
    {
        "DOWN",
        "DRAIN",
        "FAIL",
        "FUTURE",
        "INVALID",
        "INVALID_REG",
        "NOT_RESPONDING",
        "UNKNOWN",
    }
)
"""Node states (base or flag, as ``scontrol`` prints them) in which a node takes no job.
A node of Slurm's power saving that sleeps is not down: ``slurm_power``."""
_FIELD = re.compile(r"(?:^|\s)([A-Z][A-Za-z0-9_/:]*)=")
_GRES_ITEM = re.compile(r"([^,()]+)(?:\([^)]*\))?")
_MIG_TYPE = re.compile(r"(\d+g\.\d+gb(?:\+me)?)$")
_PARTITION = re.compile(r"[A-Za-z0-9_.-]+")
SLEEP_CONFIG_S = 300.0
"""How long a reading of Slurm's power-saving settings stands (``sleep_config``)."""


@dataclass(frozen=True)
class SlurmNode:
    """One node as ``scontrol show node -o -d`` prints it."""

    name: str
    state: str
    """``IDLE``, ``MIXED+DRAIN``, ``DOWN+NOT_RESPONDING``, ..."""
    reason: str = ""
    gres: dict[str, int] = field(default_factory=dict)
    """GPU gres type (``""``: untyped) -> count."""
    used: dict[str, int] = field(default_factory=dict)
    partitions: tuple[str, ...] = ()

    @property
    def down(self) -> str | None:
        """Why the node takes no job (Slurm's reason, else its state), or ``None``."""
        if not DOWN_FLAGS & set(self.state.split("+")):
            return None
        return f"Slurm: {self.state}" + (f", {self.reason}" if self.reason else "")

    @property
    def power(self) -> str:
        """Awake, asleep, waking up or going to sleep (``slurm_power``)."""
        return power_state(self.state.split("+"))

    @property
    def asleep(self) -> str | None:
        """Why a node that is not down takes no job: it sleeps, wakes up or goes to sleep
        under Slurm's power saving; ``None`` when it is awake (or down)."""
        if self.down is not None or self.power == AWAKE:
            return None
        return f"Slurm: {self.state}, {self.power} (power saving)"


@dataclass(frozen=True)
class SlurmJob:
    """One job as ``squeue -o SQUEUE_FORMAT`` prints it."""

    id: str
    state: str
    node: str
    gres: dict[str, int]
    comment: str

    @property
    def lease_id(self) -> str | None:
        """The broker's lease this job carries out, when the broker granted it."""
        if not self.comment.startswith(COMMENT_PREFIX):
            return None
        return self.comment.removeprefix(COMMENT_PREFIX).strip() or None


def parse_fields(line: str) -> dict[str, str]:
    """``Key=value`` pairs of one ``scontrol -o`` line; a value may hold spaces
    (``OS=Linux 6.1 #1 SMP``, ``Reason=fan swap [root@...]``)."""
    marks = list(_FIELD.finditer(line))
    fields = {}
    for m, after in zip(marks, [*marks[1:], None], strict=True):
        end = after.start() if after is not None else len(line)
        fields[m.group(1)] = line[m.end() : end].strip()
    return fields


def parse_gres(value: str) -> dict[str, int]:
    """GPU gres of a ``Gres=``, ``GresUsed=`` or squeue ``%b`` value, by type:
    ``gpu:1g.10gb:3(IDX:0-2),gpu:3g.40gb:0(IDX:N/A)`` -> ``{"1g.10gb": 3, "3g.40gb": 0}``."""
    found: dict[str, int] = {}
    for m in _GRES_ITEM.finditer(value):
        parts = m.group(1).strip().removeprefix("gres:").split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        gres_type, count = (parts[1], parts[2]) if len(parts) > 2 else ("", parts[1])
        if count.isdigit():
            found[gres_type] = found.get(gres_type, 0) + int(count)
    return found


def parse_nodes(text: str) -> list[SlurmNode]:
    """The nodes of ``scontrol show node -o -d``."""
    nodes = []
    for line in text.splitlines():
        f = parse_fields(line)
        if "NodeName" not in f:
            continue
        nodes.append(
            SlurmNode(
                name=f["NodeName"],
                state=f.get("State", "UNKNOWN"),
                reason=f.get("Reason", ""),
                gres=parse_gres(f.get("Gres", "")),
                used=parse_gres(f.get("GresUsed", "")),
                partitions=tuple(p for p in f.get("Partitions", "").split(",") if p),
            )
        )
    return nodes


def parse_jobs(text: str) -> list[SlurmJob]:
    """The jobs of ``squeue -h -o SQUEUE_FORMAT``."""
    jobs = []
    for line in text.splitlines():
        parts = line.split("|", 4)
        if len(parts) < 5:
            continue
        job_id, state, node, gres, comment = parts
        jobs.append(
            SlurmJob(job_id.strip(), state.strip(), node.strip(), parse_gres(gres), comment)
        )
    return jobs


def mig_profile(gres_type: str) -> str | None:
    """The MIG profile a gres type names (``1g.10gb``, ``nvidia_h100_1g.10gb``), if any."""
    m = _MIG_TYPE.search(gres_type)
    return m.group(1) if m and m.group(1) in ALL_PROFILE_NAMES else None


def device_uuid(node: str, gres_type: str, n: int) -> str:
    return SEP.join(("slurm", node, gres_type or "gpu", str(n)))


def gres_request(uuids: Iterable[str]) -> tuple[str, str]:
    """(node, ``--gres`` value) to submit a lease's devices with: ``("gpu-a", "gpu:h100:2")``.
    ``ValueError`` when they are not one node's devices of one gres type."""
    uuids = list(uuids)
    parsed = {tuple(u.split(SEP)[1:3]) for u in uuids}
    if len(parsed) != 1 or not all(u.startswith("slurm" + SEP) for u in uuids):
        raise ValueError(f"not one Slurm node's devices of one gres type: {', '.join(uuids)}")
    ((node, gres_type),) = parsed
    return node, "gpu:" + ("" if gres_type == "gpu" else f"{gres_type}:") + str(len(uuids))


def whole_gpu_model(gres_type: str) -> GpuModel | None:
    """The catalog's model a whole-GPU gres type names (``h100`` -> H100-80GB): the
    smallest of that name, so a memory size offered always fits."""
    name = gres_type.lower().removeprefix("nvidia_")
    models = [m for key, m in CATALOG.items() if key.split("-")[0].lower() == name]
    return min(models, key=lambda m: m.memory_mib, default=None)


def _profile_shape(profile: str) -> tuple[int, int, int]:
    """(compute slices, memory slices, MiB) of a MIG profile: the smallest catalog entry."""
    shapes = [
        (p.compute_slices, p.size, p.memory_mib)
        for m in CATALOG.values()
        for p in m.profiles
        if p.name == profile
    ]
    return min(shapes, key=lambda s: s[2])


def node_inventory(
    node: SlurmNode, memory_gb: dict[str, float] | None = None
) -> tuple[list[Gpu], list[Device]]:
    """One node's GPUs and grantable devices (see the module's docstring)."""
    memory_gb = memory_gb or {}
    gpus: list[Gpu] = []
    devices: list[Device] = []
    mig: list[tuple[str, str]] = []
    for gres_type, count in node.gres.items():
        profile = mig_profile(gres_type)
        if profile is not None:
            mig += [(gres_type, profile)] * count
            continue
        model = whole_gpu_model(gres_type)
        if gres_type in memory_gb:
            mib = int(gb_to_mib(memory_gb[gres_type]))
        else:
            mib = model.memory_mib if model is not None else 0
        key = model.key if model is not None and model.memory_mib == mib else None
        for n in range(count):
            uuid = device_uuid(node.name, gres_type, n)
            index = len(gpus)
            gpus.append(Gpu(index, uuid, gres_type or "gpu", mib, False, key, node=node.name))
            devices.append(Device(uuid, "gpu", index, uuid, mib, node=node.name))
    seen: Counter[str] = Counter()
    used_compute = used_memory = COMPUTE_SLICES  # start a GPU at the first slice
    gpu: Gpu | None = None
    for gres_type, profile in mig:
        compute, size, mib = _profile_shape(profile)
        if (
            gpu is None
            or used_compute + compute > COMPUTE_SLICES
            or used_memory + size > MEMORY_SLICES
        ):
            index = len(gpus)
            gpu = Gpu(
                index,
                SEP.join(("slurm", node.name, "mig", str(index))),
                "MIG GPU",
                0,
                True,
                node=node.name,
            )
            gpus.append(gpu)
            used_compute = used_memory = 0
        devices.append(
            Device(
                device_uuid(node.name, gres_type, seen[gres_type]),
                "mig",
                gpu.index,
                gpu.uuid,
                mib,
                compute_slices=compute,
                profile=profile,
                start=used_memory,
                node=node.name,
            )
        )
        seen[gres_type] += 1
        used_compute += compute
        used_memory += size
    # a MIG GPU's memory: what its slices hold
    held: defaultdict[str, int] = defaultdict(int)
    for d in devices:
        if d.kind == "mig":
            held[d.gpu_uuid] += d.memory_mib
    gpus = [replace(g, memory_mib=held[g.uuid]) if g.mig_enabled else g for g in gpus]
    return gpus, devices


def cluster_view(
    nodes: list[SlurmNode], jobs: list[SlurmJob], memory_gb: dict[str, float] | None = None
) -> ClusterView:
    """What Slurm says, as the broker sees it (see the module's docstring)."""
    gpus: list[Gpu] = []
    devices: list[Device] = []
    outside: Counter[tuple[str, str]] = Counter()
    down: dict[str, str] = {}
    asleep: dict[str, str] = {}
    ours: Counter[tuple[str, str]] = Counter()
    holders: dict[str, str] = {}
    grants: dict[str, Counter[tuple[str, str]]] = {}
    for job in jobs:
        if job.lease_id is None:
            continue
        holders[job.lease_id] = job.id
        if job.state in ("RUNNING", "COMPLETING", "SUSPENDED"):
            for gres_type, n in job.gres.items():
                ours[(job.node, gres_type)] += n
                slot = (job.node, mig_profile(gres_type) or "gpu")
                grants.setdefault(job.lease_id, Counter())[slot] += n
    for node in nodes:
        if not node.gres:
            continue
        g, d = node_inventory(node, memory_gb)
        gpus += g
        devices += d
        if node.down is not None:
            down[node.name] = node.down
        elif node.asleep is not None:
            asleep[node.name] = node.asleep
        for gres_type, n in node.used.items():
            extra = n - ours[(node.name, gres_type)]
            if extra > 0:
                outside[(node.name, mig_profile(gres_type) or "gpu")] += extra
    inventory = Inventory(tuple(gpus), tuple(devices))
    return ClusterView(
        inventory, dict(outside), down, holders=holders, grants=grants, asleep=asleep
    )


class SlurmInventory(InventorySource):
    """The broker's inventory from a Slurm cluster (``c.GPUBroker.inventory_source =
    "slurm"``): see the module's docstring."""

    name = "slurm"
    work = "job"

    scontrol = Unicode("scontrol", help="Slurm's scontrol command (a path, or on PATH).").tag(
        config=True
    )
    squeue = Unicode("squeue", help="Slurm's squeue command (a path, or on PATH).").tag(config=True)
    timeout = Seconds(
        30.0,
        RESOLUTION,
        3600.0,
        help="Seconds scontrol and squeue may take before slurmctld counts as unreachable.",
    ).tag(config=True)
    gpu_memory_gb = Dict(
        key_trait=Unicode(),
        help="Memory (GB) of a whole GPU of each gres type, e.g. {'a100': 80}; default: the "
        "catalog's model of that name (h100: 80 GB), else 0 (never offered to a request by "
        "memory).",
    ).tag(config=True)
    partitions = List(
        Unicode(),
        help="The partitions whose nodes are the broker's, e.g. ['gpu']: those the hub's jobs "
        "go to (c.GPUBrokerSlurmSpawner.req_partition). Empty: every node with GPU gres.",
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.nodes: list[SlurmNode] = []
        """The nodes of the last read (of ``partitions``)."""
        self._seen_partitions: set[str] = set()
        self._sleep: tuple[float, SleepConfig] | None = None

    @validate("gpu_memory_gb")
    def _check_memory(self, proposal: dict[str, Any]) -> dict[str, float]:
        try:
            return {
                k: number(v, f"the memory of gres type {k!r} (GB)", 0.0, MAX_MEMORY_GB)
                for k, v in proposal["value"].items()
            }
        except InvalidRequest as e:
            raise TraitError(f"SlurmInventory.gpu_memory_gb: {e.message}") from None

    @validate("partitions")
    def _check_partitions(self, proposal: dict[str, Any]) -> list[str]:
        for name in proposal["value"]:
            if not _PARTITION.fullmatch(name):
                raise TraitError(
                    f"SlurmInventory.partitions: {name!r} is not a partition name (letters, "
                    "digits, '-', '_' and '.')"
                )
        return list(proposal["value"])

    def open(self, settings: BrokerSettings, api_url: str) -> OpenInventory:
        opened = super().open(settings, api_url)
        missing = sorted(set(self.partitions) - self._seen_partitions)
        if missing:
            opened.close()
            raise InvalidRequest(
                f"c.SlurmInventory.partitions names {', '.join(missing)}, which Slurm has not "
                f"got (its partitions: {', '.join(sorted(self._seen_partitions)) or 'none'})"
            )
        return opened

    async def read(self) -> ClusterView:
        # both to their end, even when one fails: no subprocess outlives the read
        nodes, jobs = await asyncio.gather(
            self._run(self.scontrol, "show", "node", "-o", "-d"),
            self._run(self.squeue, "-h", "-o", SQUEUE_FORMAT),
            return_exceptions=True,
        )
        for failed in (nodes, jobs):
            if isinstance(failed, BaseException):
                raise failed
        assert isinstance(nodes, str) and isinstance(jobs, str)
        every = parse_nodes(nodes)
        self._seen_partitions = {p for n in every for p in n.partitions}
        wanted = set(self.partitions)
        self.nodes = [n for n in every if not wanted or wanted & set(n.partitions)]
        return cluster_view(self.nodes, parse_jobs(jobs), dict(self.gpu_memory_gb))

    async def sleep_config(self) -> SleepConfig:
        """Which nodes Slurm's power saving lets sleep (``slurm_power``), read again at
        most every ``SLEEP_CONFIG_S``."""
        now = time.monotonic()
        if self._sleep is None or now - self._sleep[0] >= SLEEP_CONFIG_S:
            self._sleep = (now, await read_sleep_config(self._run, self.scontrol))
        return self._sleep[1]

    async def power(self, node: str, up: bool) -> None:
        """Wake ``node`` or put it to sleep once it runs nothing, through Slurm's power
        saving; ``PowerRefused`` says in a sentence why Slurm did not."""
        await set_power(self._exec, self.scontrol, node, up)

    async def _run(self, *argv: str) -> str:
        status, out, err = await self._exec(*argv)
        if status != 0:
            why = err.strip().splitlines()
            raise EngineUnavailable(
                f"slurmctld unreachable: {' '.join(argv[:3])} failed"
                + (f" ({why[-1]})" if why else f" (exit status {status})")
            )
        return out

    async def _exec(self, *argv: str) -> tuple[int, str, str]:
        """Run a Slurm command: its exit status, stdout and stderr. ``EngineUnavailable``
        when it cannot run or takes over ``timeout``."""
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
        except OSError as e:
            raise EngineUnavailable(
                f"cannot run {argv[0]} ({e.strerror}): install Slurm's client commands or set "
                f"c.SlurmInventory.{'squeue' if 'squeue' in argv[0] else 'scontrol'}"
            ) from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.timeout)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            raise EngineUnavailable(
                f"slurmctld unreachable: {' '.join(argv)} took over {self.timeout:g}s"
            ) from None
        assert proc.returncode is not None
        return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")
