"""The broker's data: inventory types, device readings, requests, leases and events.

Plain dataclasses with no behaviour beyond derived properties. The NVML
backends build the inventory types; the store persists requests and leases;
every front renders them through ``to_json`` so all of them show one shape.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Literal

from ..wire.errors import InvalidRequest
from ..wire.profiles import COMPUTE_SLICES
from ..wire.sizes import Size, hold_seconds
from ..wire.text import BIDI_CONTROLS

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
    mps: bool = False
    """NVML lists it with an MPS compute context: a client of an MPS server."""
    utilization: float | None = None
    """Its own SM utilization in percent of a whole GPU, averaged over NVML's samples
    since the last reading (0: none, it had no load); None where NVML gives none (MIG)."""


@dataclass(frozen=True)
class ShareUse:
    """What a share's own processes use of its GPU at the last sample (None: not known)."""

    used_mib: int | None = None
    utilization: float | None = None
    """Their SM utilization summed, in percent of the GPU (None: NVML gives none)."""


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
UNSAFE_IN_NAME = re.compile(rf"[\x00-\x1f\x7f-\x9f\u2028\u2029{BIDI_CONTROLS}\ud800-\udfff]")
"""What a name may not hold: control characters and line separators (they would break a
log line, a table row, a header), the controls that reverse text (a name would read as
another on the admin page and in the audit log, and in every front that shows it) and
half a UTF-16 pair (it cannot be stored as UTF-8)."""


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


MAX_GROUPS = 32
MAX_HOLDER = 256
REQUEST_ID = re.compile(r"r-[0-9a-f]{12,32}")
"""A request's id: the broker's own (``r-`` and 12 hex digits), or one its client chose
at random, so that a submit retried after a lost answer is not queued twice."""


def parse_job_class(value: JobClass | str) -> JobClass:
    try:
        return JobClass(value)
    except ValueError:
        raise InvalidRequest(f"job class must be 'interactive' or 'batch', not {value!r}") from None


def check_submission(
    user: str,
    groups: tuple[str, ...],
    job_class: JobClass | str,
    holder: str,
    expected_duration_s: float | None,
) -> JobClass:
    """A submission's job class; ``InvalidRequest``, naming what is wrong, for a malformed
    one."""
    check_name(user, "user")
    if len(groups) > MAX_GROUPS:
        raise InvalidRequest(f"at most {MAX_GROUPS} groups per request")
    for g in groups:
        check_name(g, "group")
    cls = parse_job_class(job_class)
    if not isinstance(holder, str) or len(holder) > MAX_HOLDER:
        raise InvalidRequest(f"'holder' must be text of at most {MAX_HOLDER} characters")
    if expected_duration_s is not None:
        hold_seconds(expected_duration_s, "expected_duration_s")
    return cls


def check_request_id(request_id: object) -> None:
    """Refuse a client's request id that is not ``REQUEST_ID``."""
    if not isinstance(request_id, str) or not REQUEST_ID.fullmatch(request_id):
        raise InvalidRequest(
            "'id' must be 'r-' and 12 to 32 lowercase hex digits, chosen at random"
        )


@dataclass
class Request:
    """One GPU request, from submission to its end."""

    id: str
    user: str
    groups: tuple[str, ...]
    size: Size
    job_class: JobClass
    submitted_at: float
    holder: str = ""
    """Who holds it (renews it and is granted its lease): a kernel id, ``server:<user>``
    for a GPU server, ``cli``."""
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
    limit_s: float | None = None
    """Its time limit (``broker.limits``): its lease is reclaimed once it has held it this
    long (plus its extensions and a grace). None: no limit."""

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
            "holder": self.holder,
            "state": self.state.value,
            "submitted_at": self.submitted_at,
            "expected_duration_s": self.expected_duration_s,
            "lease_id": self.lease_id,
            "ended_at": self.ended_at,
            "reason": self.reason,
            "expires_at": self.expires_at if self.state is RequestState.QUEUED else None,
            "ttl_s": self.ttl_s if self.state is RequestState.QUEUED else None,
            "limit_s": self.limit_s,
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
    """``gpu`` for whole GPUs, ``share`` for part of a shared GPU, else the MIG profile
    held."""
    reclaim_at: float | None = None
    """When a pending warning says the lease will be reclaimed. Not stored: after a
    restart the reclaimer judges the lease afresh and warns again before reclaiming."""
    reclaim_cause: str | None = None
    """Why that warning (``idle``, ``stalled``, ``preempted``, ``time_limit``): what would
    keep the lease, which a front offers (Extend for a time limit)."""
    limit_s: float | None = None
    """Its request's time limit (None: none)."""
    extended_s: float = 0.0
    """Time its extensions added to the limit (``Broker.extend``)."""
    extensions: int = 0
    share_mib: int = 0
    """A share's memory on its one GPU (MiB), which others share too; 0: it holds its
    devices whole."""
    compute_percent: int | None = None
    """A share's cap on its GPU's compute, in percent (None: none)."""

    @property
    def shared(self) -> bool:
        return self.share_mib > 0

    @property
    def ends_at(self) -> float | None:
        """When its time limit, with its extensions, ends (None: no limit)."""
        if self.limit_s is None:
            return None
        return self.granted_at + self.limit_s + self.extended_s

    def to_json(self) -> dict[str, Any]:
        d = {f: getattr(self, f) for f in _LEASE_FIELDS}  # not ``asdict``: see Size.to_json
        d["devices"] = list(self.devices)
        d["state"] = self.state.value
        d["ends_at"] = self.ends_at
        return d


_LEASE_FIELDS = tuple(f.name for f in fields(Lease))


# ---------------------------------------------------------------- events


@dataclass(frozen=True)
class Event:
    """Something a holder or watcher may want to see: queued, granted, released, ..."""

    kind: str
    at: float
    user: str
    request_id: str | None = None
    lease_id: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of_lease(cls, kind: str, at: float, lease: Lease, detail: dict[str, Any]) -> Event:
        """An event for a lease's holder (a warning, its device drained, ...)."""
        return cls(kind, at, lease.user, lease.request_id, lease.id, detail)

    def to_json(self) -> dict[str, Any]:
        """The event's type, time and data: who and what it is about, with the detail
        nested under ``data`` (never over the envelope: a quota's ``kind`` is its own)."""
        return {
            "type": self.kind,
            "at": self.at,
            "data": {
                "user": self.user,
                "request_id": self.request_id,
                "lease_id": self.lease_id,
                **self.detail,
            },
        }
