"""Workload traces: real GPU-cluster job logs, read into jobs the replay submits.

Three formats, each with its own loader; every loader returns a :class:`Trace`
whose jobs are sorted by submit time, and raises :class:`TraceError` naming
the file and line of the first row it cannot read.

``openb`` (``openb_pod_list_default.csv``, Alibaba's GPU-sharing cluster, ATC'23
"Beware of Fragmentation"; https://github.com/alibaba/clusterdata,
``cluster-trace-gpu-v2023``)
    - tasks with ``num_gpu`` 0 are CPU-only and skipped;
    - ``num_gpu`` 1 with ``gpu_milli`` < 1000 asks for that share of one GPU
      (mapped to a MIG profile by :mod:`.sizing`); otherwise ``num_gpu`` whole GPUs;
    - ``qos`` LS (latency-sensitive) is interactive; BE (best-effort) is batch;
      Guaranteed (Kubernetes' strongest QoS, reserved for services) is
      interactive; Burstable (may be throttled) is batch;
    - submit = ``creation_time``; duration = ``deletion_time`` minus
      ``scheduled_time``, or minus ``creation_time`` for the 861 tasks that were
      never scheduled (deleted while pending): they are replayed as holding a GPU
      for as long as they waited, an upper bound of what they would have used.
      Failed tasks are replayed as they ran: a failure held its GPU until
      deletion. Tasks still running when the trace was cut (deletion at the
      trace's last instant) are censored: their duration is a lower bound;
    - the trace has no users: task *i* belongs to user ``u<k>`` where ``k`` is
      the CRC-32 of its resource template (``cpu_milli``, ``memory_mib``,
      ``num_gpu``, ``gpu_milli``, ``qos``, ``gpu_spec``) modulo ``users``, so the
      tasks of one template share a user, as the jobs of one workload usually
      do. The mapping is synthetic, and every report says so.

``philly`` (``philly_vc_jobs.csv``, Microsoft Philly 2017, CC-BY-4.0, the subset
of the Pollux OSDI'21 artifact; https://github.com/msr-fiddle/philly-traces)
    - submit = ``timestamp`` read as UTC; duration = ``duration``; ``num_gpus``
      whole GPUs; every job is batch (Philly ran training jobs);
    - the virtual cluster (``cluster``) is the tenant: it is both the job's
      group (shares are equal, the broker's default) and its user, so fair
      share and fairness are measured on the real tenants;
    - the 65 exact duplicate rows are kept: with no job id, two equal rows
      may be two jobs.

``generic`` (any trace converted to it): a CSV file with a header naming
    ``submit_s`` (seconds, any origin), ``duration_s`` (seconds), ``gpus``
    (whole GPUs, an integer >= 1, or a share of one GPU in (0, 1)), and
    optionally ``user``, ``group``, ``class`` (``interactive`` or ``batch``,
    default ``batch``). A job without a user gets a synthetic one by the
    openb rule above, its template being (``gpus``, ``group``, ``class``).

Every job lasts at least 1 s (the broker has no zero-length lease).
"""

from __future__ import annotations

import csv
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import NoReturn

from ..broker.models import JobClass, check_name
from ..wire.errors import InvalidRequest

MIN_DURATION_S = 1.0
DEFAULT_USERS = 32
"""Synthetic users when a trace has none (a team-sized JupyterHub)."""
FORMATS = ("openb", "philly", "generic")

OPENB_QOS = {
    "LS": JobClass.INTERACTIVE,
    "BE": JobClass.BATCH,
    "Guaranteed": JobClass.INTERACTIVE,
    "Burstable": JobClass.BATCH,
}


class TraceError(ValueError):
    """A trace file that cannot be read, with the file and line at fault."""


@dataclass(frozen=True)
class Job:
    """One job of a trace, as the replay submits it."""

    submit_s: float
    duration_s: float
    gpus: float
    """Whole GPUs (an integer >= 1) or a share of one GPU in (0, 1)."""
    user: str
    group: str = ""
    job_class: JobClass = JobClass.BATCH
    limit_s: float | None = None
    """The run-time limit its user declared (:mod:`.limits`); None: the trace has none,
    and the job states its true duration instead."""
    states_duration: bool = True
    """False: with no limit either, it tells the broker nothing of its run time, as a
    recorded request that stated none (``whatif``)."""


@dataclass(frozen=True)
class Trace:
    """The jobs of a trace, sorted by submit time, and what loading it decided."""

    name: str
    jobs: tuple[Job, ...]
    skipped: dict[str, int] = field(default_factory=dict)
    """Rows left out, by reason."""
    notes: tuple[str, ...] = ()
    """Mappings a reader of the results must know (e.g. synthetic users)."""

    def head(self, n: int) -> Trace:
        """The first ``n`` jobs by submit time (a slice for tests and quick runs)."""
        return Trace(self.name, self.jobs[:n], self.skipped, self.notes)


def load(path: str | Path, fmt: str, users: int = DEFAULT_USERS) -> Trace:
    """Read ``path`` in format ``fmt`` (one of :data:`FORMATS`)."""
    if fmt == "openb":
        return load_openb(path, users)
    if fmt == "philly":
        return load_philly(path)
    if fmt == "generic":
        return load_generic(path, users)
    raise TraceError(f"unknown trace format {fmt!r}; choose one of {', '.join(FORMATS)}")


def synthetic_user(template: str, users: int) -> str:
    """The documented deterministic user of a job with no user: CRC-32 of its template."""
    return f"u{zlib.crc32(template.encode()) % users:0{len(str(users - 1))}d}"


def load_openb(path: str | Path, users: int = DEFAULT_USERS) -> Trace:
    _check_users(users)
    jobs: list[Job] = []
    skipped: Counter[str] = Counter()
    required = ("num_gpu", "gpu_milli", "qos", "creation_time", "deletion_time", "scheduled_time")
    rows = _Rows(path, required)
    for row in rows:
        num_gpu = row.integer("num_gpu", 0)
        if num_gpu == 0:
            skipped["CPU-only tasks (num_gpu 0)"] += 1
            continue
        milli = row.integer("gpu_milli", 1)
        if milli > 1000:
            row.fail(f"gpu_milli must be at most 1000, not {milli}")
        qos = row["qos"]
        if qos not in OPENB_QOS:
            row.fail(f"unknown qos {qos!r}; expected one of {', '.join(OPENB_QOS)}")
        created = row.number("creation_time")
        started = row.number("scheduled_time") if row["scheduled_time"] else created
        deleted = row.number("deletion_time")
        if deleted < started:
            row.fail(f"deletion_time {deleted:g} is before its start {started:g}")
        template = "|".join(
            row.get(c, "")
            for c in ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "qos", "gpu_spec")
        )
        jobs.append(
            Job(
                submit_s=created,
                duration_s=max(deleted - started, MIN_DURATION_S),
                gpus=milli / 1000 if num_gpu == 1 and milli < 1000 else num_gpu,
                user=synthetic_user(template, users),
                job_class=OPENB_QOS[qos],
            )
        )
    made = len({j.user for j in jobs})
    notes = (
        f"users are synthetic: {made} users (of {users} allowed by --users), each task's by "
        "the CRC-32 of its resource template (the trace has no user column)",
        *rows.ignored(required, "cpu_milli, memory_mib and gpu_spec only pick the synthetic user"),
    )
    return _trace(path, jobs, skipped, notes)


def load_philly(path: str | Path) -> Trace:
    jobs: list[Job] = []
    required = ("timestamp", "duration", "num_gpus", "cluster")
    rows = _Rows(path, required)
    for row in rows:
        try:
            when = datetime.strptime(row["timestamp"], "%Y-%m-%d %H:%M:%S")
        except ValueError:
            row.fail(f"timestamp {row['timestamp']!r} is not 'YYYY-MM-DD HH:MM:SS'")
        tenant = row.name("cluster")
        jobs.append(
            Job(
                submit_s=when.replace(tzinfo=timezone.utc).timestamp(),
                duration_s=max(row.number("duration", 0), MIN_DURATION_S),
                gpus=row.integer("num_gpus", 1),
                user=tenant,
                group=tenant,
            )
        )
    notes = (
        "tenants are Philly's virtual clusters (real), each its own user and group",
        *rows.ignored(required),
    )
    return _trace(path, jobs, Counter(), notes)


def load_generic(path: str | Path, users: int = DEFAULT_USERS) -> Trace:
    _check_users(users)
    jobs: list[Job] = []
    synthetic: set[str] = set()
    anonymous = 0
    rows = _Rows(path, ("submit_s", "duration_s", "gpus"))
    for row in rows:
        gpus = row.number("gpus")
        if not (0 < gpus < 1 or (gpus >= 1 and gpus == int(gpus))):
            row.fail(f"gpus must be a whole number >= 1 or a share in (0, 1), not {gpus:g}")
        group = row.name("group") if row.get("group") else ""
        text = row.get("class") or JobClass.BATCH.value
        try:
            job_class = JobClass(text)
        except ValueError:
            row.fail(f"class must be 'interactive' or 'batch', not {text!r}")
        if row.get("user"):
            user = row.name("user")
        else:
            user = synthetic_user(f"{gpus:g}|{group}|{job_class.value}", users)
            synthetic.add(user)
            anonymous += 1
        jobs.append(
            Job(
                submit_s=row.number("submit_s"),
                duration_s=max(row.number("duration_s", 0), MIN_DURATION_S),
                gpus=gpus if gpus < 1 else int(gpus),
                user=user,
                group=group,
                job_class=job_class,
            )
        )
    notes = rows.ignored(("submit_s", "duration_s", "gpus", "user", "group", "class"))
    if anonymous:
        made = len(synthetic)
        notes = (
            f"users are synthetic for {anonymous} jobs without one: {made} "
            f"user{'s' if made != 1 else ''} (of {users} allowed by --users) by the CRC-32 of the "
            "template (gpus, group, class)",
            *notes,
        )
    return _trace(path, jobs, Counter(), notes)


# ---------------------------------------------------------------- rows


class _Row:
    """One CSV row that knows its file and line, so every error can name them."""

    def __init__(self, where: str, values: dict[str, str]) -> None:
        self.where = where
        self.values = values

    def __getitem__(self, column: str) -> str:
        return self.values[column].strip()

    def get(self, column: str, default: str = "") -> str:
        value = self.values.get(column)
        return default if value is None else value.strip()

    def fail(self, message: str) -> NoReturn:
        raise TraceError(f"{self.where}: {message}")

    def number(self, column: str, minimum: float | None = None) -> float:
        return self._parse(column, float, "a number", minimum)

    def integer(self, column: str, minimum: int | None = None) -> int:
        return int(self._parse(column, int, "a whole number", minimum))

    def name(self, column: str) -> str:
        try:
            return check_name(self[column], column)
        except InvalidRequest as e:
            raise TraceError(f"{self.where}: {e.message}") from None

    def _parse(
        self, column: str, kind: Callable[[str], float], what: str, minimum: float | None
    ) -> float:
        text = self[column]
        try:
            value = kind(text)
        except ValueError:
            raise TraceError(f"{self.where}: {column} must be {what}, not {text!r}") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise TraceError(f"{self.where}: {column} must be finite, not {text!r}")
        if minimum is not None and value < minimum:
            raise TraceError(f"{self.where}: {column} must be at least {minimum:g}, not {text}")
        return value


class _Rows:
    """The rows of a CSV file with a header; fails on a missing column or a short row.
    ``columns`` is the header, read when iteration starts."""

    def __init__(self, path: str | Path, required: tuple[str, ...]) -> None:
        self.path, self.required = Path(path), required
        self.columns: tuple[str, ...] = ()

    def __iter__(self) -> Iterator[_Row]:
        path = self.path
        try:
            f = path.open(newline="")
        except OSError as e:
            raise TraceError(f"cannot read trace {path}: {e.strerror}") from None
        with f:
            reader = csv.DictReader(f)
            self.columns = tuple(reader.fieldnames or ())
            missing = [c for c in self.required if c not in self.columns]
            if missing:
                raise TraceError(
                    f"{path}:1: the header lacks column(s) {', '.join(missing)} "
                    f"(it has {', '.join(self.columns) or 'nothing'})"
                )
            for values in reader:
                where = f"{path}:{reader.line_num}"
                if None in values or None in values.values():
                    more = "more" if None in values else "fewer"
                    raise TraceError(
                        f"{where}: the row has {more} columns than the header's {len(self.columns)}"
                    )
                yield _Row(where, values)

    def ignored(self, used: tuple[str, ...], also: str = "") -> tuple[str, ...]:
        """A note naming the header's columns the replay does not use, if any."""
        unused = [c for c in self.columns if c not in used]
        if not unused:
            return ()
        return (f"columns ignored: {', '.join(unused)}" + (f"; {also}" if also else ""),)


def _check_users(users: int) -> None:
    if users < 1:
        raise TraceError(f"the number of synthetic users must be at least 1, not {users}")


def _trace(
    path: str | Path, jobs: list[Job], skipped: Counter[str], notes: tuple[str, ...]
) -> Trace:
    if not jobs:
        raise TraceError(f"{path}: the trace has no GPU jobs")
    jobs.sort(key=lambda j: j.submit_s)
    return Trace(Path(path).name, tuple(jobs), dict(skipped), notes)
