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
- a node Slurm has drained, lost or marked down is down, with Slurm's reason;
- the broker's jobs Slurm still has (pending or running), by lease, so a lease whose
  job ended is released, and the gres each running one holds, so a job still running
  after its lease ended (a reclaim's ``scancel`` not through yet) holds them back.

A device's UUID is ``slurm__<node>__<gres type>__<n>``: the spawner reads the node and
the gres type to submit from the lease's devices (:func:`gres_request`).
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from traitlets import Dict, TraitError, Unicode, validate

from ..broker.models import Device, Gpu, Inventory
from ..wire.errors import InvalidRequest
from ..wire.profiles import ALL_PROFILE_NAMES, CATALOG, COMPUTE_SLICES, MEMORY_SLICES, GpuModel
from ..wire.sizes import MAX_MEMORY_GB, RESOLUTION, gb_to_mib, number
from ..wire.traits import Seconds
from . import ClusterView, EngineUnavailable, InventorySource

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
        "POWERED_DOWN",
        "POWERING_DOWN",
        "UNKNOWN",
    }
)
"""Node states (base or flag, as ``scontrol`` prints them) in which a node takes no job."""
_FIELD = re.compile(r"(?:^|\s)([A-Z][A-Za-z0-9_/:]*)=")
_GRES_ITEM = re.compile(r"([^,()]+)(?:\([^)]*\))?")
_MIG_TYPE = re.compile(r"(\d+g\.\d+gb(?:\+me)?)$")


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

    @property
    def down(self) -> str | None:
        """Why the node takes no job (Slurm's reason, else its state), or ``None``."""
        if not DOWN_FLAGS & set(self.state.split("+")):
            return None
        return f"Slurm: {self.state}" + (f", {self.reason}" if self.reason else "")


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
        for gres_type, n in node.used.items():
            extra = n - ours[(node.name, gres_type)]
            if extra > 0:
                outside[(node.name, mig_profile(gres_type) or "gpu")] += extra
    inventory = Inventory(tuple(gpus), tuple(devices))
    return ClusterView(inventory, dict(outside), down, holders=holders, grants=grants)


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

    @validate("gpu_memory_gb")
    def _check_memory(self, proposal: dict[str, Any]) -> dict[str, float]:
        try:
            return {
                k: number(v, f"the memory of gres type {k!r} (GB)", 0.0, MAX_MEMORY_GB)
                for k, v in proposal["value"].items()
            }
        except InvalidRequest as e:
            raise TraitError(f"SlurmInventory.gpu_memory_gb: {e.message}") from None

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
        return cluster_view(parse_nodes(nodes), parse_jobs(jobs), dict(self.gpu_memory_gb))

    async def _run(self, *argv: str) -> str:
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
        if proc.returncode != 0:
            why = err.decode(errors="replace").strip().splitlines()
            raise EngineUnavailable(
                f"slurmctld unreachable: {' '.join(argv[:3])} failed"
                + (f" ({why[-1]})" if why else f" (exit status {proc.returncode})")
            )
        return out.decode(errors="replace")
