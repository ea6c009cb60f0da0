"""Shares of GPUs on the running broker (``c.GPUBroker.*``): which GPUs are lent whole,
shared or both (the core's ``broker.sharing``), what holds a share to its memory on this
host (``enforce``: chosen per GPU at the start, the strongest there is) and the work
that keeps it held: the MPS daemons started with the first share of a GPU and user and
stopped after the last, the kernels' cgroups the driver caps, the environment each
share's kernel starts with, and what every front says of it (``share_json``)."""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml
from traitlets import Dict, Enum, HasTraits, List, TraitError, Unicode, default, validate

from ..broker.core import Broker, Event
from ..broker.models import Inventory, Lease
from ..broker.sharing import MODES, Sharing, SharingRule
from ..enforce import MECHANISMS, Enforcement, HostFacts, choose
from ..enforce.limits import CgroupLimits
from ..enforce.mps import MpsDaemons, MpsError
from ..engines.dra import parse_dra_uuid
from ..wire.errors import InvalidRequest
from ..wire.text import share_text

ENDED = ("released", "expired", "reclaimed")
"""The events of a lease's end."""
SIMULATED_MPS = f"{shlex.quote(sys.executable)} -m jupyter_gpubroker.enforce.mpsim"


class SharingSettings(HasTraits):
    """How GPUs without MIG are lent, and how their shares are held."""

    sharing = Enum(
        list(MODES),
        default_value="whole",
        help="How GPUs without MIG are lent outside sharing_rules: 'whole' (one request at a "
        "time, as before), 'shared' (only shares: parts of their memory, side by side) or "
        "'both'. A MIG GPU is always lent whole: its slices are never shared.",
    ).tag(config=True)
    sharing_rules = List(
        Dict(),
        help="Rules checked in order before 'sharing', the first that applies deciding: "
        "{'mode': 'shared', 'gpus': ['0', '1'], 'start': '08:00', 'end': '19:00', 'days': "
        "'mon-fri'}; 'gpus' names GPUs by index, UUID or model (none: every GPU), the hours "
        "are read in c.GPUBroker.timezone and are optional. A switch takes back nothing held.",
    ).tag(config=True)
    share_enforcement = Enum(
        ["auto", *MECHANISMS[1:]],
        default_value="auto",
        help="The strongest mechanism a share is held by: 'auto' (the driver where it can, "
        "else MPS, else watching), 'mps' (never the driver), 'watched' (only watching: a "
        "kernel that goes over its share is warned, then the reclaim action is carried out).",
    ).tag(config=True)
    mps_control = Unicode(
        help="The MPS control program, with its arguments (default: nvidia-cuda-mps-control "
        "where it is on PATH; on a simulated machine, the simulated daemon); empty: no MPS.",
    ).tag(config=True)
    mps_dir = Unicode(
        help="Where the MPS daemons' pipe and log directories are made, one per GPU and user "
        "(default: /run/gpubroker/mps for a root broker, else a directory of the broker's "
        "own under the system's temporary directory).",
    ).tag(config=True)
    share_cgroup = Unicode(
        "",
        help="A cgroup v2 directory the broker may make a cgroup in for each share's kernel "
        "(dmem delegated to it), for the driver to cap (driver r615, CUDA 13.4, root); empty: "
        "the driver does not hold shares.",
    ).tag(config=True)

    @validate("sharing_rules")
    def _check_rules(self, proposal: dict[str, Any]) -> list[dict[str, Any]]:
        for rule in proposal["value"]:
            try:
                SharingRule.from_dict(rule)
            except InvalidRequest as e:
                raise TraitError(f"GPUBroker.sharing_rules: {e.message}") from None
        return list(proposal["value"])

    @default("mps_control")
    def _default_mps_control(self) -> str:
        if getattr(self, "simulate", ""):
            return SIMULATED_MPS
        return shutil.which("nvidia-cuda-mps-control") or ""

    @default("mps_dir")
    def _default_mps_dir(self) -> str:
        if os.geteuid() == 0:
            return "/run/gpubroker/mps"
        return str(Path(tempfile.gettempdir()) / f"gpubroker-mps-{os.geteuid()}")

    def make_sharing(self, whole_only: set[str], tz: str) -> Sharing:
        """The core's sharing rules: the GPUs this host cannot share first, lent whole."""
        rules = [SharingRule.from_dict(r) for r in self.sharing_rules]
        if whole_only:
            rules.insert(0, SharingRule("whole", frozenset(whole_only)))
        return Sharing(self.sharing, tuple(rules), tz)


class ShareEnforcement:
    """What holds each GPU's shares here, and the daemons and cgroups that do it."""

    def __init__(
        self,
        chosen: dict[str, Enforcement],
        labels: dict[str, str],
        daemons: MpsDaemons | None,
        limits: CgroupLimits | None,
        log: logging.Logger,
    ) -> None:
        self.chosen, self.labels = chosen, labels
        """GPU UUID -> what holds its shares; GPU UUID -> its label (``GPU 2``)."""
        self.daemons, self.limits, self.log = daemons, limits, log
        self.fallen: dict[str, Enforcement] = {}
        """Lease id -> the weaker mechanism it fell to (its MPS daemon would not start)."""
        self.held: dict[str, Lease] = {}
        """Lease id -> each live share, known from its grant."""
        self.core: Broker | None = None

    @classmethod
    def open(
        cls,
        settings: SharingSettings,
        inventory: Inventory,
        nvml: bool,
        uid_of: Callable[[str], int | None],
        as_users: bool,
        log: logging.Logger,
    ) -> ShareEnforcement:
        """Read this host (``nvml``: the GPUs are this machine's, NVML is open) and choose,
        GPU by GPU; an engine's GPUs are lent whole."""
        labels = {g.uuid: f"GPU {g.index}" for g in inventory.gpus}
        if not nvml:
            chosen = {g.uuid: engine_enforcement(g.uuid) for g in inventory.gpus}
            return cls(chosen, labels, None, None, log)
        control = shlex.split(settings.mps_control)
        facts = read_facts(control[0] if control else "", settings.share_cgroup, as_users)
        strongest = "driver" if settings.share_enforcement == "auto" else settings.share_enforcement
        chosen = {}
        for g in inventory.gpus:
            if g.mig_enabled:
                continue
            chosen[g.uuid] = choose(facts, labels[g.uuid], compute_mode(g.uuid), strongest)
            log.info("GPU broker: shares of %s: %s", labels[g.uuid], chosen[g.uuid].why)
        mechanisms = {e.mechanism for e in chosen.values()}
        daemons = (
            MpsDaemons(control, Path(settings.mps_dir), uid_of, log)
            if "mps" in mechanisms
            else None
        )
        limits = (
            CgroupLimits(Path(settings.share_cgroup), log=log) if "driver" in mechanisms else None
        )
        return cls(chosen, labels, daemons, limits, log)

    def whole_only(self) -> set[str]:
        """The GPUs this host cannot share (their compute mode, an engine's)."""
        return {u for u, e in self.chosen.items() if e.mechanism == "none"}

    def attach(self, core: Broker) -> None:
        self.core = core
        core.subscribe(self._on_event)
        for lease in core.leases():  # shares held across a restart
            if lease.shared:
                self._started(lease)

    def of(self, lease: Lease) -> Enforcement:
        """What holds ``lease``'s share."""
        fallen = self.fallen.get(lease.id)
        if fallen is not None:
            return fallen
        return self.chosen.get(lease.devices[0], Enforcement("watched", "not known"))

    def watched(self, lease: Lease) -> bool:
        """Whether only the broker's watch holds this share to its memory."""
        return lease.shared and not self.of(lease).enforced

    def under_mps(self, lease: Lease) -> bool:
        """Whether MPS holds this share: its clients only, the watch the rest."""
        return lease.shared and self.of(lease).mechanism == "mps"

    def env(self, lease: Lease) -> dict[str, str]:
        """The share's kernel's environment: its MPS daemon and limits (under MPS; an
        engine's daemon is named in the container by NVIDIA's DRA driver)."""
        if self.of(lease).mechanism != "mps":
            return {}
        env = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={lease.share_mib}M"}
        if lease.compute_percent is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(lease.compute_percent)
        if self.daemons is None:
            return env
        d = self.daemons.daemons.get((lease.devices[0], lease.user))
        return {**d.env, **env} if d is not None else {}

    def share_json(self, lease: Lease) -> dict[str, Any] | None:
        """A share as the API shows it (None: the lease holds whole devices)."""
        if not lease.shared:
            return None
        e = self.of(lease)
        label = self.labels.get(lease.devices[0], lease.devices[0])
        return {
            "memory_mib": lease.share_mib,
            "compute_percent": lease.compute_percent,
            "gpu": label,
            "mechanism": e.mechanism,
            "enforced": e.enforced,
            "why": e.why,
            "text": share_text(lease.share_mib, label, e.mechanism),
            "env": self.env(lease),
        }

    def report_pid(self, lease: Lease, pid: int) -> None:
        """The share's kernel named its process: under the driver, its cgroup and cap."""
        if lease.shared and self.of(lease).mechanism == "driver" and self.limits is not None:
            try:
                self.limits.hold(lease.id, lease.devices[0], pid, lease.share_mib)
            except (OSError, pynvml.NVMLError) as e:
                self._fall(lease, f"the driver could not cap its cgroup ({e})")

    def check(self) -> None:
        """Start again the MPS daemons that died while shares hold them (every tick)."""
        if self.daemons is not None:
            try:
                self.daemons.check()
            except MpsError as e:
                self.log.error("GPU broker: %s", e)

    def close(self) -> None:
        if self.daemons is not None:
            self.daemons.close()

    # -- internals

    def _on_event(self, e: Event) -> None:
        if self.core is None or e.lease_id is None:
            return
        if e.kind == "granted":
            lease = self.core.lease(e.lease_id)  # live: the core's own, never the state file
            if lease.shared:
                self._started(lease)
        elif e.kind in ENDED:
            ended = self.held.pop(e.lease_id, None)  # an end reads nothing back either
            if ended is not None:
                self._ended(ended)

    def _started(self, lease: Lease) -> None:
        self.held[lease.id] = lease
        if self.of(lease).mechanism != "mps" or self.daemons is None:
            return
        gpu, mine = lease.devices[0], self._user_shares(lease)
        try:
            self.daemons.ensure(gpu, lease.user, max(x.share_mib for x in mine), None)
        except MpsError as e:
            self._fall(lease, f"its MPS daemon did not start ({e})")

    def _ended(self, lease: Lease) -> None:
        self.fallen.pop(lease.id, None)
        if self.limits is not None:
            self.limits.end(lease.id)
        if self.daemons is not None and not self._user_shares(lease):
            self.daemons.stop(lease.devices[0], lease.user)

    def _user_shares(self, lease: Lease) -> list[Lease]:
        """The live shares of the lease's user on its GPU (the lease's among them)."""
        assert self.core is not None
        shares = self.core.sharers().get(lease.devices[0], [])
        return [x for x in shares if x.user == lease.user]

    def _fall(self, lease: Lease, why: str) -> None:
        label = self.labels.get(lease.devices[0], lease.devices[0])
        self.log.error(
            "GPU broker: the share of %s on %s is only watched: %s", lease.user, label, why
        )
        self.fallen[lease.id] = Enforcement(
            "watched", f"nothing holds this share of {label}: {why}"
        )


DRA_MPS = (
    "NVIDIA's DRA driver runs the MPS daemon of the GPU's shared claim, and each server's "
    "limits are in its environment"
)


def engine_enforcement(uuid: str) -> Enforcement:
    """What holds the shares of an engine's GPU: MPS where NVIDIA's DRA driver publishes it
    (every share's pod names the GPU's one claim, configured for MPS); else nothing, and
    the engine lends it whole (the device plugin counts devices, it names none)."""
    try:
        device = parse_dra_uuid(uuid)
    except ValueError:
        return Enforcement("none", "the GPUs are an engine's: it lends them whole")
    if device.kind != "gpu":
        return Enforcement("none", "a MIG device is never shared")
    return Enforcement("mps", DRA_MPS)


def read_facts(mps_control: str, cgroup: str, as_users: bool) -> HostFacts:
    """This host, through the open NVML."""
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
    except pynvml.NVMLError:
        driver = ""
    try:
        cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
    except pynvml.NVMLError:
        cuda = 0
    try:
        pynvml._nvmlGetFunctionPointer("nvmlDeviceSetMemoryLimits_v1")
        limits = True
    except pynvml.NVMLError:
        limits = False
    found = shutil.which(mps_control) if mps_control else None
    cgroup2 = bool(cgroup) and (Path(cgroup) / "cgroup.procs").exists()
    return HostFacts(
        driver=driver,
        cuda=cuda,
        memory_limits=limits,
        root=os.geteuid() == 0,
        cgroup=cgroup if cgroup2 else "",
        mps_control=found or "",
        as_users=as_users,
    )


def compute_mode(uuid: str) -> int:
    """A GPU's compute mode (DEFAULT where NVML cannot say)."""
    try:
        return int(pynvml.nvmlDeviceGetComputeMode(pynvml.nvmlDeviceGetHandleByUUID(uuid)))
    except pynvml.NVMLError:
        return int(pynvml.NVML_COMPUTEMODE_DEFAULT)
