"""The broker's data: inventory types, device readings, requests and leases.

Plain dataclasses with no behaviour beyond derived properties. The NVML
backends build the inventory types; the store persists requests and leases;
every front renders them through ``to_json`` so all of them show one shape.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from enum import Enum
from functools import cached_property
from typing import Any, Literal

from .errors import InvalidRequest, UnknownProfile
from .profiles import ALL_PROFILE_NAMES, COMPUTE_SLICES

# ---------------------------------------------------------------- inventory


@dataclass(frozen=True)
class Gpu:
    """A physical GPU as NVML enumerates it."""

    index: int
    uuid: str
    name: str
    memory_mib: int
    mig_enabled: bool
    model: str | None = None
    """Catalog key (``H100-80GB``) when the catalog knows the device name."""
    pci_bus_id: str = ""
    node: str = ""
    """The cluster node the GPU is on (an engine's node name); empty on one machine."""


@dataclass(frozen=True)
class Device:
    """A unit the broker can grant: a whole GPU (MIG off) or one MIG slice."""

    uuid: str
    kind: Literal["gpu", "mig"]
    gpu_index: int
    gpu_uuid: str
    memory_mib: int
    compute_slices: int = COMPUTE_SLICES
    profile: str | None = None
    start: int | None = None
    """First memory slice of a MIG slice (its placement)."""
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    node: str = ""
    """Its GPU's node: a grant of several devices never spans two nodes."""

    @property
    def gpu_equivalents(self) -> float:
        return self.compute_slices / COMPUTE_SLICES

    @property
    def memory_gb(self) -> float:
        return self.memory_mib / 1024

    @property
    def label(self) -> str:
        """What a person calls it: ``GPU 3``, ``GPU 3 / 1g.10gb@2``, on a cluster
        prefixed by the node (``node-a GPU 3``)."""
        where = f"{self.node} GPU {self.gpu_index}" if self.node else f"GPU {self.gpu_index}"
        if self.kind == "gpu":
            return where
        placed = "" if self.start is None else f"@{self.start}"  # unknown to an unprivileged broker
        return f"{where} / {self.profile}{placed}"


@dataclass(frozen=True)
class Inventory:
    """What a machine offers: its GPUs and the grantable devices on them."""

    gpus: tuple[Gpu, ...]
    devices: tuple[Device, ...]

    def device(self, uuid: str) -> Device | None:
        return next((d for d in self.devices if d.uuid == uuid), None)

    def gpu(self, uuid: str) -> Gpu | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)


class Health(str, Enum):
    """A device's state as the backend last read it."""

    OK = "ok"
    LOST = "lost"
    """NVML answered GpuIsLost: the GPU fell off the bus."""
    UNREACHABLE = "unreachable"
    """NVML could not be asked (no driver, uninitialised, unknown error)."""


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    used_memory_mib: int | None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True)
class DeviceReading:
    """One sample of a GPU or MIG slice. ``None`` means NVML does not support the metric
    there (e.g. utilization of a MIG slice), never that the value is zero."""

    uuid: str
    health: Health = Health.OK
    utilization_gpu: float | None = None
    utilization_memory: float | None = None
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    temperature_c: int | None = None
    temperature_slowdown_c: int | None = None
    """NVML's slowdown threshold of the GPU (None: NVML does not say)."""
    temperature_shutdown_c: int | None = None
    power_mw: int | None = None
    power_limit_mw: int | None = None
    clock_event_reasons: int | None = None
    processes: tuple[ProcessInfo, ...] = ()
    unsupported: tuple[str, ...] = ()
    """Names of metrics NVML answered NotSupported for."""
    error: str | None = None


@dataclass(frozen=True)
class DeviceEvent:
    """A hardware event NVML delivered through an event set. Xid errors and uncorrectable
    (double-bit) ECC errors are point events: no reading shows them afterwards."""

    uuid: str
    """The GPU's UUID, or its MIG device's when NVML named the instance."""
    kind: Literal["xid", "double_bit_ecc"]
    code: int | None = None
    """The Xid number (``None`` for ECC errors)."""


# ---------------------------------------------------------------- requests

MAX_NAME = 255
"""The longest user or group name, in characters: JupyterHub's own bound (its user and
group names are columns of 255)."""
UNSAFE_IN_NAME = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
"""What a name may not hold: control characters and line separators (they would break a
log line, a table row, a header) and half a UTF-16 pair (it cannot be stored as UTF-8)."""
RESOLUTION = 1e-3
"""The finest non-zero amount the broker takes, in every unit (GPU-equivalents, GB,
GPU-hours, shares, seconds): a smaller one, a subnormal like 5e-324 above all, is a slip
or a probe, never a size or a limit anyone means (a 1e-320 GPU quota refuses everything)."""
MAX_GPUS = 1024
MAX_MEMORY_GB = 4096.0


class RequestState(str, Enum):
    QUEUED = "queued"
    GRANTED = "granted"
    RELEASED = "released"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    RECLAIMED = "reclaimed"
    REFUSED = "refused"
    """Became impossible while queued (its devices left the inventory)."""

    @property
    def ended(self) -> bool:
        return self not in (RequestState.QUEUED, RequestState.GRANTED)


class JobClass(str, Enum):
    INTERACTIVE = "interactive"
    BATCH = "batch"


def finite_number(value: object) -> bool:
    """A JSON number that fits a float: not a bool, NaN, an infinity or a huge integer."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer beyond the largest float
        return False


def quantity(value: object, lo: float, hi: float) -> bool:
    """A JSON number fit to be an amount from ``lo`` to ``hi``: finite, and 0 or at least
    ``RESOLUTION``."""
    return (
        finite_number(value)
        and lo <= value <= hi  # type: ignore[operator]
        and (value == 0 or abs(value) >= RESOLUTION)  # type: ignore[arg-type]
    )


def amounts(lo: float, hi: float) -> str:
    """The words for what ``quantity(value, lo, hi)`` takes: "0 or a number from 0.001 to 10"."""
    lo_text = f"0 or a number from {RESOLUTION:g}" if lo == 0 else f"a number from {lo:.15g}"
    return f"{lo_text} to {hi:.15g}"


def check_name(value: object, what: str) -> str:
    """A user or group name, the one rule of every front: any text JupyterHub takes (user
    names: anything without '/'; group names: anything, from an identity provider's
    ``/staff``, ``org:team`` or ``ML Team``), used only as an opaque key and escaped
    wherever it is shown. Refused only: empty, longer than ``MAX_NAME``, or holding a
    character of ``UNSAFE_IN_NAME``."""
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{what} name must be non-empty text, not {value!r}")
    if len(value) > MAX_NAME:
        raise InvalidRequest(
            f"{what} name {value[:40]!r}... is too long: {len(value)} characters, "
            f"at most {MAX_NAME}"
        )
    unsafe = UNSAFE_IN_NAME.search(value)
    if unsafe:
        raise InvalidRequest(
            f"{what} name {value!r} holds {unsafe.group()!r}: a name may hold any character "
            "but control characters and line breaks"
        )
    return value


@dataclass(frozen=True)
class Size:
    """What a request asks for: exactly one of N whole GPUs, a MIG profile, or any
    device with at least ``min_memory_gb`` of memory."""

    gpus: int | None = None
    profile: str | None = None
    min_memory_gb: float | None = None

    def __post_init__(self) -> None:
        given = [f for f in ("gpus", "profile", "min_memory_gb") if getattr(self, f) is not None]
        if len(given) != 1:
            raise InvalidRequest(
                "a request asks for exactly one of 'gpus', 'profile' or 'min_memory_gb'"
                + (f" (got {', '.join(given)})" if given else "")
            )
        if self.gpus is not None:
            if isinstance(self.gpus, bool) or not isinstance(self.gpus, int):
                raise InvalidRequest(f"'gpus' must be a whole number, not {self.gpus!r}")
            if not 1 <= self.gpus <= MAX_GPUS:
                raise InvalidRequest(f"'gpus' must be between 1 and {MAX_GPUS}, not {self.gpus}")
        if self.profile is not None and not isinstance(self.profile, str):
            raise InvalidRequest(f"'profile' must be a MIG profile name, not {self.profile!r}")
        if self.profile is not None and self.profile not in ALL_PROFILE_NAMES:
            raise UnknownProfile(
                f"unknown MIG profile {self.profile!r}; known profiles: "
                + ", ".join(sorted(ALL_PROFILE_NAMES))
            )
        if self.min_memory_gb is not None:
            m = self.min_memory_gb
            if not quantity(m, RESOLUTION, MAX_MEMORY_GB):
                raise InvalidRequest(
                    f"'min_memory_gb' must be {amounts(RESOLUTION, MAX_MEMORY_GB)}, not {m!r}"
                )

    @cached_property
    def key(self) -> str:
        """A short stable text form, also the queue's shape key: ``gpus=2``,
        ``profile=1g.10gb`` or ``min_memory_gb=20``."""
        if self.gpus is not None:
            return f"gpus={self.gpus}"
        if self.profile is not None:
            return f"profile={self.profile}"
        m = float(self.min_memory_gb or 0)
        short = f"{m:g}"  # 6 significant digits: keep it only when it reads back exactly
        return f"min_memory_gb={short if float(short) == m else repr(m)}"

    @classmethod
    def parse(cls, text: str) -> Size:
        """Parse the short form a person types: ``2`` or ``gpus=2``, ``1g.10gb``,
        ``20GB`` or ``min_memory_gb=20``."""
        t = text.strip()
        if "=" in t:
            k, _, v = t.partition("=")
            k = k.strip()
            if k == "gpus":
                return cls(gpus=_int(v))
            if k == "profile":
                return cls(profile=v.strip())
            if k == "min_memory_gb":
                return cls(min_memory_gb=_float(v))
            raise InvalidRequest(f"unknown size field {k!r} in {text!r}")
        if t.isdigit():
            return cls(gpus=_int(t))
        if t.lower().endswith("gb") and t[:-2].replace(".", "", 1).isdigit():
            return cls(min_memory_gb=_float(t[:-2]))
        return cls(profile=t)

    def to_json(self) -> dict[str, Any]:
        # field by field, not ``asdict``: its deep copy is a visible share of an API call
        sizes = {"gpus": self.gpus, "profile": self.profile, "min_memory_gb": self.min_memory_gb}
        return {k: v for k, v in sizes.items() if v is not None}


def _int(v: str) -> int:
    try:
        return int(v)
    except ValueError:
        raise InvalidRequest(f"{v!r} is not a whole number") from None


def _float(v: str) -> float:
    try:
        return float(v)
    except ValueError:
        raise InvalidRequest(f"{v!r} is not a number") from None


@dataclass
class Request:
    """One GPU request, from submission to its end."""

    id: str
    user: str
    groups: tuple[str, ...]
    size: Size
    job_class: JobClass
    submitted_at: float
    owner: str = ""
    """What it is for: a kernel id or a server name."""
    state: RequestState = RequestState.QUEUED
    expected_duration_s: float | None = None
    """The submitter's estimate of how long it will hold the grant, if given."""
    lease_id: str | None = None
    ended_at: float | None = None
    reason: str = ""
    expires_at: float | None = None
    """While queued: when it expires unless its holder renews it (``Broker.renew_request``)."""
    ttl_s: float | None = None
    """How long a renewal keeps it queued. Not stored: the broker's configuration sets it."""

    @property
    def group(self) -> str:
        """The group charged for this request: the first one it names ('' for none)."""
        return self.groups[0] if self.groups else ""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "user": self.user,
            "groups": list(self.groups),
            **self.size.to_json(),
            "job_class": self.job_class.value,
            "owner": self.owner,
            "state": self.state.value,
            "submitted_at": self.submitted_at,
            "expected_duration_s": self.expected_duration_s,
            "lease_id": self.lease_id,
            "ended_at": self.ended_at,
            "reason": self.reason,
            "expires_at": self.expires_at if self.state is RequestState.QUEUED else None,
            "ttl_s": self.ttl_s if self.state is RequestState.QUEUED else None,
        }


class LeaseState(str, Enum):
    ACTIVE = "active"
    RELEASED = "released"
    EXPIRED = "expired"
    RECLAIMED = "reclaimed"


@dataclass
class Lease:
    """A grant: devices held by one request while its holder keeps renewing."""

    id: str
    request_id: str
    user: str
    group: str
    devices: tuple[str, ...]
    gpu_equivalents: float
    granted_at: float
    expires_at: float
    ttl_s: float
    state: LeaseState = LeaseState.ACTIVE
    ended_at: float | None = None
    reason: str = ""
    profile: str = field(default="")
    """``gpu`` for whole GPUs, else the MIG profile held."""
    reclaim_at: float | None = None
    """When a pending warning says the lease will be reclaimed. Not stored: after a
    restart the reclaimer judges the lease afresh and warns again before reclaiming."""

    def to_json(self) -> dict[str, Any]:
        d = {f: getattr(self, f) for f in _LEASE_FIELDS}  # not ``asdict``: see Size.to_json
        d["devices"] = list(self.devices)
        d["state"] = self.state.value
        return d


_LEASE_FIELDS = tuple(f.name for f in fields(Lease))
