"""The state file's schema: the migrations that build it, one version each.

A file records the version it is at (``PRAGMA user_version``); ``store.Store`` runs the
migrations above it, each in one transaction, when the broker opens the file. A reader
(``Store(read_only=True)``) never migrates, and reads only a file at this version; the
checks below refuse, in one sentence, a file that cannot be read or upgraded.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

from ..wire.errors import StateFileError

# Each entry upgrades the schema by one version; never edit a released one.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE requests (
        id TEXT PRIMARY KEY,
        seq INTEGER NOT NULL UNIQUE,
        user TEXT NOT NULL,
        groups TEXT NOT NULL,
        size TEXT NOT NULL,
        job_class TEXT NOT NULL,
        owner TEXT NOT NULL DEFAULT '',
        submitted_at REAL NOT NULL,
        expected_duration_s REAL,
        state TEXT NOT NULL,
        lease_id TEXT,
        ended_at REAL,
        reason TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX requests_live ON requests(state) WHERE state IN ('queued', 'granted');
    CREATE TABLE leases (
        id TEXT PRIMARY KEY,
        request_id TEXT NOT NULL UNIQUE REFERENCES requests(id),
        user TEXT NOT NULL,
        grp TEXT NOT NULL,
        devices TEXT NOT NULL,
        gpu_equivalents REAL NOT NULL,
        profile TEXT NOT NULL,
        granted_at REAL NOT NULL,
        expires_at REAL NOT NULL,
        ttl_s REAL NOT NULL,
        expected_end REAL NOT NULL,
        state TEXT NOT NULL,
        ended_at REAL,
        reason TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX leases_active ON leases(state) WHERE state = 'active';
    CREATE TABLE allocations (
        device TEXT PRIMARY KEY,
        lease_id TEXT NOT NULL REFERENCES leases(id)
    );
    CREATE TABLE ledger (
        lease_id TEXT PRIMARY KEY REFERENCES leases(id),
        user TEXT NOT NULL,
        grp TEXT NOT NULL,
        profile TEXT NOT NULL,
        job_class TEXT NOT NULL,
        gpu_equivalents REAL NOT NULL,
        start REAL NOT NULL,
        end REAL NOT NULL,
        gpu_hours REAL NOT NULL
    );
    CREATE INDEX ledger_end ON ledger(end);
    CREATE TABLE quotas (
        kind TEXT NOT NULL CHECK (kind IN ('user', 'group')),
        name TEXT NOT NULL,
        share REAL,
        max_gpus REAL,
        gpu_hours REAL,
        period_s REAL,
        PRIMARY KEY (kind, name)
    );
    """,
    # 2: drained devices, reclaim evidence, device samples (downsampled tiers) and events
    """
    CREATE TABLE drains (
        uuid TEXT PRIMARY KEY,
        reason TEXT NOT NULL,
        since REAL NOT NULL
    );
    CREATE TABLE reclaims (
        lease_id TEXT PRIMARY KEY REFERENCES leases(id),
        at REAL NOT NULL,
        kind TEXT NOT NULL,
        reason TEXT NOT NULL,
        evidence TEXT NOT NULL
    );
    CREATE INDEX reclaims_at ON reclaims(at);
    CREATE TABLE samples (
        uuid TEXT NOT NULL,
        res INTEGER NOT NULL,
        t REAL NOT NULL,
        n INTEGER NOT NULL,
        utilization_gpu REAL,
        utilization_memory REAL,
        memory_used_mib REAL,
        temperature_c REAL,
        power_w REAL,
        clock_event_reasons INTEGER,
        unhealthy INTEGER NOT NULL,
        PRIMARY KEY (uuid, res, t)
    ) WITHOUT ROWID;
    CREATE TABLE device_events (
        id INTEGER PRIMARY KEY,
        uuid TEXT NOT NULL,
        at REAL NOT NULL,
        kind TEXT NOT NULL,
        code INTEGER
    );
    CREATE INDEX device_events_at ON device_events(uuid, at);
    """,
    # 3: a queued request lives while its holder renews it
    """
    ALTER TABLE requests ADD COLUMN expires_at REAL;
    """,
    # 4: who drained a device (until now only health checks did)
    """
    ALTER TABLE drains ADD COLUMN cause TEXT NOT NULL DEFAULT 'health';
    """,
    # 5: kernel tokens outlive a broker restart (their sha256, never the token)
    """
    CREATE TABLE kernel_tokens (
        hash TEXT PRIMARY KEY,
        user TEXT NOT NULL,
        kernel_id TEXT NOT NULL,
        issued_at REAL NOT NULL
    );
    CREATE INDEX kernel_tokens_kernel ON kernel_tokens(kernel_id, user);
    """,
    # 6: what admins did (who, what, target, detail, when)
    """
    CREATE TABLE audit (
        id INTEGER PRIMARY KEY,
        at REAL NOT NULL,
        actor TEXT NOT NULL,
        action TEXT NOT NULL,
        target TEXT NOT NULL,
        detail TEXT NOT NULL
    );
    CREATE INDEX audit_at ON audit(at);
    """,
    # 7: health alerts (active: ended is null), a bounded history
    """
    CREATE TABLE alerts (
        id INTEGER PRIMARY KEY,
        uuid TEXT NOT NULL,
        label TEXT NOT NULL,
        kind TEXT NOT NULL,
        severity TEXT NOT NULL,
        message TEXT NOT NULL,
        since REAL NOT NULL,
        ended REAL
    );
    CREATE INDEX alerts_ended ON alerts(ended);
    """,
    # 8: a release deletes its lease's allocations by lease, not by a scan of them all
    """
    CREATE INDEX allocations_lease ON allocations(lease_id);
    """,
    # 9: fewer B-tree pages written per grant: allocations keyed by device alone (a
    # release deletes its devices by key, so allocations_lease goes), and the live
    # requests indexed by what a grant leaves alone: seq, on the rows not ended (keyed
    # and filtered by state, each grant moved its request in that index)
    """
    DROP INDEX allocations_lease;
    CREATE TABLE allocations_new (
        device TEXT PRIMARY KEY,
        lease_id TEXT NOT NULL REFERENCES leases(id)
    ) WITHOUT ROWID;
    INSERT INTO allocations_new SELECT device, lease_id FROM allocations;
    DROP TABLE allocations;
    ALTER TABLE allocations_new RENAME TO allocations;
    DROP INDEX requests_live;
    CREATE INDEX requests_live ON requests(seq) WHERE ended_at IS NULL;
    """,
    # 10: GPU use outside the broker (a process on a device its user was not granted),
    # charged to that user as unbrokered use; open while ``end`` is null
    """
    CREATE TABLE unbrokered (
        id INTEGER PRIMARY KEY,
        uuid TEXT NOT NULL,
        user TEXT NOT NULL,
        profile TEXT NOT NULL,
        gpu_equivalents REAL NOT NULL,
        start REAL NOT NULL,
        end REAL
    );
    CREATE INDEX unbrokered_end ON unbrokered(end);
    """,
    # 11: time limits: a request's, copied to its lease, and what extensions added
    """
    ALTER TABLE requests ADD COLUMN limit_s REAL;
    ALTER TABLE leases ADD COLUMN limit_s REAL;
    ALTER TABLE leases ADD COLUMN extended_s REAL NOT NULL DEFAULT 0;
    ALTER TABLE leases ADD COLUMN extensions INTEGER NOT NULL DEFAULT 0;
    """,
    # 12: suspended kernels outlive a broker restart: a suspension is its lease's reclaim
    # (cause 'suspended', what was suspended in its evidence), over once it has an end;
    # those of a broker that kept them in memory only were forgotten at its restart
    """
    CREATE INDEX reclaims_suspended ON reclaims(lease_id) WHERE kind = 'suspended';
    CREATE TABLE suspension_ends (
        lease_id TEXT PRIMARY KEY REFERENCES leases(id),
        at REAL NOT NULL,
        reason TEXT NOT NULL
    );
    INSERT INTO suspension_ends (lease_id, at, reason)
        SELECT lease_id, at, 'the GPU broker restarted and kept no record of the suspension'
        FROM reclaims WHERE kind = 'suspended';
    """,
    # 13: time-limit rules an admin set at run time, per job class, profile or group
    """
    CREATE TABLE time_limits (
        kind TEXT NOT NULL CHECK (kind IN ('class', 'profile', 'group')),
        name TEXT NOT NULL,
        default_s REAL,
        max_s REAL,
        required INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (kind, name)
    );
    """,
    # 14: a kernel token ends once it goes unused for the broker's maximum age: its last
    # renewal (its issue, for those issued before)
    """
    ALTER TABLE kernel_tokens ADD COLUMN renewed_at REAL NOT NULL DEFAULT 0;
    UPDATE kernel_tokens SET renewed_at = issued_at;
    CREATE INDEX kernel_tokens_renewed ON kernel_tokens(renewed_at);
    """,
    # 15: shares of GPUs: a lease's share of its GPU's memory, and the live shares of each
    # GPU, which the file itself keeps within the GPU's memory and apart from a GPU held
    # whole (as allocations keep one device from being granted twice)
    """
    ALTER TABLE leases ADD COLUMN share_mib INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE leases ADD COLUMN compute_percent INTEGER;
    CREATE TABLE shares (
        lease_id TEXT PRIMARY KEY REFERENCES leases(id),
        device TEXT NOT NULL,
        mib INTEGER NOT NULL,
        capacity_mib INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX shares_device ON shares(device, mib);
    CREATE TRIGGER shares_fit BEFORE INSERT ON shares
    WHEN NEW.mib + COALESCE((SELECT SUM(mib) FROM shares WHERE device = NEW.device), 0)
        > NEW.capacity_mib
        OR EXISTS (SELECT 1 FROM allocations WHERE device = NEW.device)
    BEGIN SELECT RAISE(ABORT, 'the share does not fit its GPU'); END;
    CREATE TRIGGER allocations_unshared BEFORE INSERT ON allocations
    WHEN EXISTS (SELECT 1 FROM shares WHERE device = NEW.device)
    BEGIN SELECT RAISE(ABORT, 'the device is shared'); END;
    """,
    # 16: the machine the broker served, from when (each GPU's catalog model and MIG
    # slices), and the settings it ordered by (policy, its parameters and windows, dynamic
    # MIG): a replay of the file's history (``replay.whatif``) rebuilds both
    """
    CREATE TABLE machines (
        since REAL PRIMARY KEY,
        gpus TEXT NOT NULL,
        settings TEXT NOT NULL
    );
    """,
    # 17: when each lease's kernel was busy, as idle reclaim saw it (``recorded.Activity``:
    # a JSON list of [start, end] spans, end null while busy; null: its kernel never seen),
    # so that a what-if can vary the idle timeout and the reclaim action
    """
    ALTER TABLE leases ADD COLUMN busy TEXT;
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


def statements(script: str) -> Iterator[str]:
    """A migration's statements one by one (a trigger's body holds semicolons of its own;
    ``execute`` takes one statement, and ``executescript`` would commit the transaction)."""
    pending = ""
    for part in script.split(";"):
        pending += part + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \n;"):
                yield pending
            pending = ""


def check_readable(path: str, version: int, has_tables: bool) -> None:
    """Refuse what this package cannot read as it is: a file with no broker tables, or
    one at another schema version (a reader never migrates)."""
    if version == 0 and not has_tables:
        raise StateFileError(f"{path}: not a GPU broker state file (it holds no tables)")
    check_upgradable(path, version)
    if version < SCHEMA_VERSION:
        raise StateFileError(
            f"{path} was written by an older jupyter-gpubroker (schema version "
            f"{version}, this one reads {SCHEMA_VERSION}); it is left as it is: the broker "
            "upgrades it when it next starts"
        )


def check_upgradable(path: str, version: int) -> None:
    """Refuse a file written by a newer package: its schema cannot be migrated down."""
    if version > SCHEMA_VERSION:
        raise StateFileError(
            f"{path}: schema version {version} is newer than this jupyter-gpubroker "
            f"supports ({SCHEMA_VERSION}); upgrade the package (pip install -U "
            "jupyter-gpubroker), or set c.GPUBroker.state_file to another file"
        )
