"""Durable state: one SQLite file (WAL) through sqlite-utils.

Every change the broker acknowledges is one committed transaction, so a
broker killed at any instant restarts from the file with nothing half-done.
The ``allocations`` table has one row per held device with the device as
primary key: the database itself refuses to grant one device twice. The ``shares``
table has one row per live share of a GPU; its triggers refuse a share beyond the
GPU's memory or beside a whole grant of it, and a whole grant beside a share.

``synchronous=NORMAL`` (the WAL default) survives a killed process, which is
what a broker faces; ``FULL`` also survives a power cut, at the cost of an
fsync per change (``Store(path, synchronous="FULL")``).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlite_utils

from ..wire.errors import InvalidRequest, StateFileError, StorageFull
from .migrations import (
    MIGRATIONS,
    SCHEMA_VERSION,
    check_readable,
    check_upgradable,
    statements,
)
from .models import Lease, Request
from .rows import lease_from_row, request_from_row
from .statefile import out_of_storage, unusable

UNBROKERED = "unbrokered"
"""The job class of GPU use outside the broker in usage: no request, no group."""


@dataclass(frozen=True)
class AuditRecord:
    """One admin action: who did what to which object, with what detail, when."""

    at: float
    actor: str
    action: str
    """``cancel``, ``set_class``, ``drain``, ``undrain``, ``set_quota``, ``delete_quota``,
    ``set_time_limits``, ``delete_time_limits``;
    ``outside_use`` and ``outside_use_stop`` (its actor the user whose process it was);
    ``release_stopped_server`` (its actor the hub service, a host routine); ``move`` (a
    kernel moved off a drained GPU, or not: its actor the admin who drained it, or
    ``health``)."""
    target: str
    """A request id, a GPU or device UUID, ``user:<name>`` / ``group:<name>`` (quotas),
    ``class:<name>`` / ``profile:<name>`` / ``group:<name>`` (time limits), a lease id
    (``release_stopped_server``, ``move``)."""
    detail: dict[str, Any]


class Store:
    """The broker's SQLite file. ``path=":memory:"`` keeps it in memory (replay, tests)."""

    def __init__(
        self, path: str | Path = ":memory:", synchronous: str = "NORMAL", *, read_only: bool = False
    ) -> None:
        """``read_only``: a reader beside the broker that owns the file (``jupyter gpubroker
        usage``, ``status``): opened ``mode=ro``, never migrated, and only at this
        package's schema version (a clear ``StateFileError`` otherwise)."""
        if synchronous not in ("NORMAL", "FULL"):
            raise InvalidRequest("synchronous must be 'NORMAL' or 'FULL'")
        self.path = str(path)
        self.read_only = read_only
        self._audit: AuditRecord | None = None
        try:
            if read_only:
                uri = f"{Path(self.path).resolve().as_uri()}?mode=ro"
                self.conn = sqlite3.connect(uri, uri=True, isolation_level=None)
            else:
                if self.path != ":memory:":
                    Path(self.path).parent.mkdir(parents=True, exist_ok=True)
                # Autocommit mode: transactions are opened explicitly by ``transaction()``.
                self.conn = sqlite3.connect(
                    self.path, isolation_level=None, check_same_thread=False
                )
        except (OSError, sqlite3.Error) as e:
            raise unusable(self.path, self.read_only, e) from None
        try:
            self.db = sqlite_utils.Database(self.conn)
            if read_only:
                check_readable(self.path, self.schema_version, bool(self.db.table_names()))
                return
            if self.path != ":memory:":
                self.db.enable_wal()
                self.conn.execute("PRAGMA wal_autocheckpoint=10000")
            self.conn.execute(f"PRAGMA synchronous={synchronous}")
            self.conn.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except (OSError, sqlite3.Error, StateFileError) as e:
            self.conn.close()
            raise unusable(self.path, self.read_only, e) from None

    def close(self) -> None:
        self.conn.close()

    def checkpoint(self) -> None:
        """Fold the WAL back into the database file, off the decision path.

        Automatic checkpoints are pushed out to a large WAL so they rarely land
        inside a grant; the broker calls this from its periodic ``tick``.
        """
        if self.path != ":memory:":
            self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)")

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """All statements inside commit together or not at all. A full disk or an I/O
        error on the way is a ``StorageFull`` (HTTP 507), after rolling back."""
        try:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.conn
                if self._audit is not None:
                    self._insert_audit(self._audit)
                self.conn.execute("COMMIT")
                self._audit = None
            except BaseException:
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError as e:
            if not out_of_storage(e):
                raise
            raise StorageFull(
                f"the state file {self.path} could not be written ({e}): free disk space "
                "there, then try again"
            ) from e

    @contextmanager
    def audited(self, record: AuditRecord) -> Iterator[None]:
        """Record an admin action with the change it makes: ``record`` is written in the
        first transaction committed inside the block, so the change and its record
        commit together; if the block changes nothing, on its own at the end. A block
        that raises before committing anything records nothing (nothing changed)."""
        self._audit = record
        try:
            yield
            if self._audit is not None:
                with self.transaction():
                    pass
        finally:
            self._audit = None

    def _insert_audit(self, a: AuditRecord) -> None:
        self.conn.execute(
            "INSERT INTO audit (at, actor, action, target, detail) VALUES (?,?,?,?,?)",
            (a.at, a.actor, a.action, a.target, json.dumps(a.detail, sort_keys=True)),
        )

    @property
    def schema_version(self) -> int:
        return int(self.conn.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self) -> None:
        version = self.schema_version
        check_upgradable(self.path, version)
        for i in range(version, SCHEMA_VERSION):
            with self.transaction() as c:
                for stmt in statements(MIGRATIONS[i]):
                    c.execute(stmt)
                c.execute(f"PRAGMA user_version={i + 1}")

    # -- writes (call inside ``transaction()``)

    def insert_request(self, r: Request, seq: int) -> None:
        self.conn.execute(
            "INSERT INTO requests (id, seq, user, groups, size, job_class, owner, submitted_at,"
            " expected_duration_s, state, expires_at, limit_s) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                r.id,
                seq,
                r.user,
                json.dumps(list(r.groups)),
                r.size.key,
                r.job_class.value,
                r.holder,  # the column keeps its first name: no migration
                r.submitted_at,
                r.expected_duration_s,
                r.state.value,
                r.expires_at,
                r.limit_s,
            ),
        )

    def renew_request(self, r: Request) -> None:
        self.conn.execute("UPDATE requests SET expires_at=? WHERE id=?", (r.expires_at, r.id))

    def end_request(self, r: Request) -> None:
        self.conn.execute(
            "UPDATE requests SET state=?, ended_at=?, reason=? WHERE id=?",
            (r.state.value, r.ended_at, r.reason, r.id),
        )

    def insert_lease(self, lease: Lease, expected_end: float, capacity_mib: int = 0) -> None:
        """Record a grant; a share with its GPU's memory (``capacity_mib``), which the
        file keeps its live shares within."""
        self.conn.execute(
            "INSERT INTO leases (id, request_id, user, grp, devices, gpu_equivalents, profile,"
            " granted_at, expires_at, ttl_s, expected_end, state, limit_s, share_mib,"
            " compute_percent) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                lease.id,
                lease.request_id,
                lease.user,
                lease.group,
                json.dumps(list(lease.devices)),
                lease.gpu_equivalents,
                lease.profile,
                lease.granted_at,
                lease.expires_at,
                lease.ttl_s,
                expected_end,
                lease.state.value,
                lease.limit_s,
                lease.share_mib,
                lease.compute_percent,
            ),
        )
        if lease.shared:
            self.conn.execute(
                "INSERT INTO shares (lease_id, device, mib, capacity_mib) VALUES (?,?,?,?)",
                (lease.id, lease.devices[0], lease.share_mib, capacity_mib),
            )
        else:
            self.conn.executemany(
                "INSERT INTO allocations (device, lease_id) VALUES (?, ?)",
                [(d, lease.id) for d in lease.devices],
            )
        self.conn.execute(
            "UPDATE requests SET state='granted', lease_id=? WHERE id=?",
            (lease.id, lease.request_id),
        )

    def move_lease(self, lease_id: str, old: tuple[str, ...], new: tuple[str, ...]) -> None:
        """A lease holds ``new`` instead of ``old`` (its kernel moved there)."""
        self.conn.execute(
            "UPDATE leases SET devices=? WHERE id=?", (json.dumps(list(new)), lease_id)
        )
        self.conn.executemany(
            "DELETE FROM allocations WHERE device=? AND lease_id=?", [(d, lease_id) for d in old]
        )
        self.conn.executemany(
            "INSERT INTO allocations (device, lease_id) VALUES (?, ?)", [(d, lease_id) for d in new]
        )

    def renew_lease(self, lease: Lease) -> None:
        self.conn.execute("UPDATE leases SET expires_at=? WHERE id=?", (lease.expires_at, lease.id))

    def extend_lease(self, lease: Lease, expected_end: float) -> None:
        self.conn.execute(
            "UPDATE leases SET extended_s=?, extensions=?, expected_end=? WHERE id=?",
            (lease.extended_s, lease.extensions, expected_end, lease.id),
        )

    def end_lease(self, lease: Lease, job_class: str) -> None:
        """Close a lease, free its devices and write its ledger row."""
        assert lease.ended_at is not None
        self.conn.execute(
            "UPDATE leases SET state=?, ended_at=?, reason=? WHERE id=?",
            (lease.state.value, lease.ended_at, lease.reason, lease.id),
        )
        if lease.shared:
            self.conn.execute("DELETE FROM shares WHERE lease_id=?", (lease.id,))
        else:
            self.conn.executemany(
                "DELETE FROM allocations WHERE device=? AND lease_id=?",
                [(d, lease.id) for d in lease.devices],
            )
        self.conn.execute(
            "INSERT INTO ledger VALUES (?,?,?,?,?,?,?,?,?)",
            (
                lease.id,
                lease.user,
                lease.group,
                lease.profile,
                job_class,
                lease.gpu_equivalents,
                lease.granted_at,
                lease.ended_at,
                lease.gpu_equivalents * (lease.ended_at - lease.granted_at) / 3600.0,
            ),
        )

    def open_unbrokered(
        self, uuid: str, user: str, profile: str, gpu_equivalents: float, start: float
    ) -> int:
        """Start charging ``user`` for a device used outside the broker; the record's id."""
        cur = self.conn.execute(
            "INSERT INTO unbrokered (uuid, user, profile, gpu_equivalents, start)"
            " VALUES (?,?,?,?,?)",
            (uuid, user, profile, gpu_equivalents, start),
        )
        return int(cur.lastrowid or 0)

    def close_unbrokered(self, record: int, end: float) -> None:
        self.conn.execute("UPDATE unbrokered SET end=? WHERE id=?", (end, record))

    def upsert_quota(self, kind: str, name: str, values: dict[str, float | None]) -> None:
        self.conn.execute(
            "INSERT INTO quotas (kind, name, share, max_gpus, gpu_hours, period_s)"
            " VALUES (:kind, :name, :share, :max_gpus, :gpu_hours, :period_s)"
            " ON CONFLICT (kind, name) DO UPDATE SET share=:share, max_gpus=:max_gpus,"
            " gpu_hours=:gpu_hours, period_s=:period_s",
            {"kind": kind, "name": name, **values},
        )

    def delete_quota(self, kind: str, name: str) -> None:
        self.conn.execute("DELETE FROM quotas WHERE kind=? AND name=?", (kind, name))

    def upsert_time_limits(self, kind: str, name: str, values: dict[str, Any]) -> None:
        self.conn.execute(
            "INSERT INTO time_limits (kind, name, default_s, max_s, required)"
            " VALUES (:kind, :name, :default_s, :max_s, :required)"
            " ON CONFLICT (kind, name) DO UPDATE SET default_s=:default_s, max_s=:max_s,"
            " required=:required",
            {"kind": kind, "name": name, **values},
        )

    def delete_time_limits(self, kind: str, name: str) -> None:
        self.conn.execute("DELETE FROM time_limits WHERE kind=? AND name=?", (kind, name))

    def set_job_class(self, request_id: str, job_class: str) -> None:
        self.conn.execute("UPDATE requests SET job_class=? WHERE id=?", (job_class, request_id))

    def set_drain(self, uuid: str, reason: str, since: float, cause: str) -> None:
        self.conn.execute(
            "INSERT INTO drains (uuid, reason, since, cause) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (uuid) DO UPDATE SET reason=excluded.reason, cause=excluded.cause",
            (uuid, reason, since, cause),
        )

    def clear_drain(self, uuid: str) -> None:
        self.conn.execute("DELETE FROM drains WHERE uuid=?", (uuid,))

    def insert_reclaim(
        self, lease_id: str, at: float, kind: str, reason: str, evidence: dict[str, Any]
    ) -> None:
        self.conn.execute(
            "INSERT INTO reclaims (lease_id, at, kind, reason, evidence) VALUES (?,?,?,?,?)",
            (lease_id, at, kind, reason, json.dumps(evidence, sort_keys=True)),
        )

    def end_suspension(self, lease_id: str, at: float, reason: str) -> None:
        """A suspended kernel's suspension is over (resumed, or its memory gone): why."""
        self.conn.execute(
            "INSERT INTO suspension_ends (lease_id, at, reason) VALUES (?,?,?)",
            (lease_id, at, reason),
        )

    def insert_alert(self, alert: dict[str, Any]) -> int:
        """A new active alert (its ``id`` is ignored); returns its id."""
        cur = self.conn.execute(
            "INSERT INTO alerts (uuid, label, kind, severity, message, since, ended)"
            " VALUES (:uuid, :label, :kind, :severity, :message, :since, :ended)",
            alert,
        )
        assert cur.lastrowid is not None
        return cur.lastrowid

    def escalate_alert(self, alert_id: int, severity: str, message: str) -> None:
        self.conn.execute(
            "UPDATE alerts SET severity=?, message=? WHERE id=?", (severity, message, alert_id)
        )

    def end_alert(self, alert_id: int, ended: float) -> None:
        self.conn.execute("UPDATE alerts SET ended=? WHERE id=?", (ended, alert_id))

    def purge_alerts(self, ended_before: float) -> None:
        """Forget the alerts that ended before ``ended_before``."""
        self.conn.execute("DELETE FROM alerts WHERE ended < ?", (ended_before,))

    def revoke_kernel_tokens(self, kernel_id: str, user: str | None = None) -> None:
        """Forget a kernel's tokens (only ``user``'s, when given)."""
        self.conn.execute(
            "DELETE FROM kernel_tokens WHERE kernel_id=? AND (? IS NULL OR user=?)",
            (kernel_id, user, user),
        )

    def insert_kernel_token(self, token_hash: str, user: str, kernel_id: str, at: float) -> None:
        self.conn.execute(
            "INSERT INTO kernel_tokens (hash, user, kernel_id, issued_at, renewed_at)"
            " VALUES (?,?,?,?,?)",
            (token_hash, user, kernel_id, at, at),
        )

    def renew_kernel_tokens(
        self, user: str, kernel_id: str, at: float, before: float, expired: float
    ) -> int:
        """``user``'s tokens of a kernel renewed ``at``: those last renewed before ``before``
        and not before ``expired`` (an ended token is not brought back); how many."""
        return self.conn.execute(
            "UPDATE kernel_tokens SET renewed_at=? WHERE user=? AND kernel_id=?"
            " AND renewed_at<? AND renewed_at>=?",
            (at, user, kernel_id, before, expired),
        ).rowcount

    def expire_kernel_tokens(self, renewed_before: float) -> int:
        """Forget the kernel tokens last renewed before ``renewed_before``; how many."""
        return self.conn.execute(
            "DELETE FROM kernel_tokens WHERE renewed_at < ?", (renewed_before,)
        ).rowcount

    # -- reads

    def kernel_token(self, token_hash: str) -> tuple[str, str, float] | None:
        """The (user, kernel id, last renewal) a kernel token's hash stands for."""
        row = self.conn.execute(
            "SELECT user, kernel_id, renewed_at FROM kernel_tokens WHERE hash=?", (token_hash,)
        ).fetchone()
        return None if row is None else (str(row[0]), str(row[1]), float(row[2]))

    def next_seq(self) -> int:
        return int(
            self.conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM requests").fetchone()[0]
        )

    def live_requests(self) -> list[Request]:
        """Queued and granted requests, oldest first (only an ending sets ``ended_at``)."""
        rows = self.db.query(
            "SELECT * FROM requests WHERE ended_at IS NULL AND state IN ('queued', 'granted')"
            " ORDER BY seq"
        )
        return [request_from_row(r) for r in rows]

    def request(self, request_id: str) -> Request | None:
        rows = list(self.db.query("SELECT * FROM requests WHERE id=?", [request_id]))
        return request_from_row(rows[0]) if rows else None

    def active_leases(self) -> list[tuple[Lease, float]]:
        """Active leases with their expected end."""
        rows = self.db["leases"].rows_where("state = 'active'")
        return [(lease_from_row(r), float(r["expected_end"])) for r in rows]

    def lease(self, lease_id: str) -> Lease | None:
        rows = list(self.db.query("SELECT * FROM leases WHERE id=?", [lease_id]))
        return lease_from_row(rows[0]) if rows else None

    def quotas(self) -> list[dict[str, Any]]:
        return list(self.db["quotas"].rows_where(order_by="kind, name"))

    def time_limits(self) -> list[dict[str, Any]]:
        """The time-limit rules admins set (``limitrules``)."""
        return list(self.db["time_limits"].rows_where(order_by="kind, name"))

    def drains(self) -> dict[str, tuple[str, float]]:
        """Drained GPU or device UUID -> (reason, since)."""
        rows = self.db["drains"].rows
        return {r["uuid"]: (r["reason"], r["since"]) for r in rows}

    def drain_causes(self) -> dict[str, str]:
        """Drained GPU or device UUID -> who drained it (``health``, ``vacate``, ...)."""
        return {r["uuid"]: r["cause"] for r in self.db["drains"].rows_where(select="uuid, cause")}

    def reclaims(
        self, since: float | None = None, until: float | None = None, user: str | None = None
    ) -> list[dict[str, Any]]:
        """Reclaims in [since, until) (of ``user``'s leases, when given), oldest first, each
        with its evidence decoded and its lease's user, group, profile, devices and
        ``granted_at``."""
        rows = self.db.query(
            "SELECT r.*, l.request_id, l.user, l.grp, l.profile, l.devices, l.granted_at"
            " FROM reclaims r JOIN leases l ON l.id = r.lease_id"
            " WHERE r.at >= ? AND r.at < ? AND (? IS NULL OR l.user = ?) ORDER BY r.at",
            [_low(since), _high(until), user, user],
        )
        return [
            {**r, "evidence": json.loads(r["evidence"]), "devices": json.loads(r["devices"])}
            for r in rows
        ]

    def suspensions(self) -> list[dict[str, Any]]:
        """The reclaims of suspended kernels whose suspension is not over, oldest first:
        ``lease_id``, ``at`` and the ``evidence`` (what was suspended), decoded."""
        rows = self.db.query(
            "SELECT lease_id, at, evidence FROM reclaims r WHERE kind = 'suspended' AND NOT"
            " EXISTS (SELECT 1 FROM suspension_ends e WHERE e.lease_id = r.lease_id)"
            " ORDER BY at"
        )
        return [{**r, "evidence": json.loads(r["evidence"])} for r in rows]

    def reclaim_cause(self, lease_id: str) -> str | None:
        """Why a lease was reclaimed (None: it was not)."""
        row = self.conn.execute(
            "SELECT kind FROM reclaims WHERE lease_id=?", (lease_id,)
        ).fetchone()
        return None if row is None else str(row[0])

    def suspension_end(self, lease_id: str) -> str | None:
        """Why a suspended kernel's lease is suspended no more (None: it is, or never was)."""
        row = self.conn.execute(
            "SELECT reason FROM suspension_ends WHERE lease_id=?", (lease_id,)
        ).fetchone()
        return None if row is None else str(row[0])

    def audit(
        self,
        since: float | None = None,
        actor: str | None = None,
        after: int | None = None,
        limit: int = 100,
    ) -> list[dict[str, Any]]:
        """Audit records from ``since`` on (by ``actor``, after the record id ``after``,
        when given), oldest first, at most ``limit``, each with its detail decoded."""
        rows = self.db.query(
            "SELECT * FROM audit WHERE at >= ? AND id > ? AND (? IS NULL OR actor = ?)"
            " ORDER BY id LIMIT ?",
            [_low(since), after or 0, actor, actor, limit],
        )
        return [{**r, "detail": json.loads(r["detail"])} for r in rows]

    def active_alerts(self) -> list[dict[str, Any]]:
        """The alerts not ended yet, oldest first."""
        return list(self.db.query("SELECT * FROM alerts WHERE ended IS NULL ORDER BY id"))

    def alert_history(self, before: int | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Ended alerts, newest first, at most ``limit``, of ids below ``before`` if given."""
        return list(
            self.db.query(
                "SELECT * FROM alerts WHERE ended IS NOT NULL AND id < ? ORDER BY id DESC LIMIT ?",
                [before if before is not None else 2**63 - 1, limit],
            )
        )

    def holdings(self, since: float, until: float, now: float) -> list[dict[str, Any]]:
        """Every lease held at some time inside [since, until), as a ledger row (user, grp,
        profile, job_class, gpu_equivalents, start, end): the ended ones from the ledger
        (its ``end`` index bounds the scan), the active ones up to ``now``, and the use
        outside the broker (``monitor.outside``) as job class ``unbrokered``, charged to
        the user whose process it was, in no group. One query."""
        return list(
            self.db.query(
                "SELECT user, grp, profile, job_class, gpu_equivalents, start, end FROM ledger"
                " WHERE end > :since AND start < :until"
                " UNION ALL SELECT l.user, l.grp, l.profile, COALESCE(r.job_class, ''),"
                " l.gpu_equivalents, l.granted_at, :now FROM leases l"
                " LEFT JOIN requests r ON r.id = l.request_id"
                " WHERE l.state = 'active' AND l.granted_at < :until"
                " UNION ALL SELECT user, '', profile, :unbrokered, gpu_equivalents, start,"
                " COALESCE(end, :now) FROM unbrokered"
                " WHERE COALESCE(end, :now) > :since AND start < :until",
                {"since": since, "until": until, "now": now, "unbrokered": UNBROKERED},
            )
        )

    def unbrokered(self, open_only: bool = False) -> list[dict[str, Any]]:
        """Use outside the broker, oldest first (only what still goes on: ``open_only``)."""
        where = " WHERE end IS NULL" if open_only else ""
        return list(self.db.query(f"SELECT * FROM unbrokered{where} ORDER BY id"))

    def ledger(
        self, since: float | None = None, until: float | None = None
    ) -> list[dict[str, Any]]:
        """Ledger rows of leases that ended inside [since, until)."""
        return list(
            self.db.query(
                "SELECT * FROM ledger WHERE end >= ? AND end < ? ORDER BY end",
                [_low(since), _high(until)],
            )
        )


def _low(since: float | None) -> float:
    return since if since is not None else float("-inf")


def _high(until: float | None) -> float:
    return until if until is not None else float("inf")
