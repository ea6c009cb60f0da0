"""The SQLite file: schema versions, atomic transactions, and the double-grant guard."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from broker_helpers import allocations, whole_inventory

from jupyter_gpubroker.broker.core import Broker
from jupyter_gpubroker.broker.migrations import MIGRATIONS, SCHEMA_VERSION
from jupyter_gpubroker.broker.models import JobClass, Lease, LeaseState, Request, RequestState
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.wire.errors import InvalidRequest, StateFileError, StorageFull
from jupyter_gpubroker.wire.sizes import Size

TABLES = {"requests", "leases", "allocations", "ledger", "quotas"}


def tables(store: Store) -> set[str]:
    return set(store.db.table_names())


def a_request(rid: str = "r-1", user: str = "alice") -> Request:
    return Request(rid, user, ("lab",), Size(gpus=1), JobClass.INTERACTIVE, 10.0, holder="k-1")


def a_lease(lid: str, rid: str, devices: tuple[str, ...]) -> Lease:
    return Lease(lid, rid, "alice", "lab", devices, float(len(devices)), 10.0, 130.0, 120.0)


def test_new_file_gets_the_current_schema(state_file):
    store = Store(state_file)
    assert SCHEMA_VERSION == len(MIGRATIONS) >= 1
    assert store.schema_version == SCHEMA_VERSION
    assert tables(store) >= TABLES
    store.close()


def test_reopening_is_idempotent_and_keeps_data(state_file):
    store = Store(state_file)
    with store.transaction():
        store.insert_request(a_request(), 1)
    store.close()
    for _ in range(3):
        again = Store(state_file)
        assert again.schema_version == SCHEMA_VERSION
        assert [r.id for r in again.live_requests()] == ["r-1"]
        again.close()


def test_a_newer_schema_is_refused_with_a_clear_error(state_file):
    conn = sqlite3.connect(state_file)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StateFileError) as info:
        Store(state_file)
    msg = info.value.message
    assert str(state_file) in msg
    assert f"schema version {SCHEMA_VERSION + 1}" in msg
    assert "upgrade" in msg
    # and nothing was done to the file
    conn = sqlite3.connect(state_file)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
    assert conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0


def test_a_file_that_is_not_a_database_is_named_with_its_cause(tmp_path):
    garbage = tmp_path / "state.sqlite"
    garbage.write_bytes(b"\x00not sqlite at all\xff" * 100)
    with pytest.raises(StateFileError) as info:
        Store(garbage)
    msg = info.value.message
    assert msg.startswith(f"{garbage}: not a SQLite database; restore it from a backup")
    assert info.value.status == 503
    assert garbage.read_bytes() == b"\x00not sqlite at all\xff" * 100  # left as it was


@pytest.mark.parametrize("keep", [50, 5000], ids=["inside its header", "after its header"])
def test_a_file_cut_short_is_named_damaged_with_a_backups_advice_not_its_permissions(
    tmp_path, keep
):
    """A truncated file (a full disk, a copy cut off) is readable: what mends it is a
    backup, and the sentence says so, read and write or read-only."""
    state = tmp_path / "state.sqlite"
    Store(state).close()
    state.write_bytes(state.read_bytes()[:keep])
    for read_only in (False, True):
        with pytest.raises(StateFileError) as info:
            Store(state, read_only=read_only)
        assert info.value.message == (
            f"{state}: the database in it is damaged (cut short or overwritten); restore it "
            "from a backup, or move it aside (the broker then starts with an empty state), or "
            "set c.GPUBroker.state_file (or $GPUBROKER_STATE) to another file"
        )
    assert len(state.read_bytes()) == keep  # left as it was


def test_a_directory_in_place_of_the_file_is_named_with_its_cause(tmp_path):
    # (an unreadable file cannot be tested as root, who reads anything: a directory fails
    # the same way, at the open)
    (tmp_path / "state.sqlite").mkdir()
    with pytest.raises(StateFileError, match=r"state.sqlite: cannot be opened \(unable to open"):
        Store(tmp_path / "state.sqlite")


def test_a_state_file_under_a_file_is_named_with_its_cause(tmp_path):
    (tmp_path / "plain").write_text("")
    with pytest.raises(StateFileError, match=r"plain/state.sqlite: cannot be opened \(File exists"):
        Store(tmp_path / "plain" / "state.sqlite")


def test_file_store_uses_wal_and_memory_store_works(state_file, store):
    file_store = Store(state_file)
    mode = file_store.conn.execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    assert file_store.conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    file_store.close()
    assert store.schema_version == SCHEMA_VERSION and tables(store) >= TABLES


def test_synchronous_mode_is_checked(state_file):
    with pytest.raises(InvalidRequest, match="synchronous"):
        Store(state_file, synchronous="OFF")
    full = Store(state_file, synchronous="FULL")
    assert full.conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    full.close()


def test_a_failed_transaction_leaves_nothing(store):
    with pytest.raises(RuntimeError), store.transaction():
        store.insert_request(a_request("r-1"), 1)
        store.insert_lease(a_lease("l-1", "r-1", ("GPU-A",)), 500.0)
        raise RuntimeError("crash in the middle")
    assert store.request("r-1") is None
    assert store.lease("l-1") is None
    assert allocations(store) == {}
    # the connection is usable again afterwards
    with store.transaction():
        store.insert_request(a_request("r-1"), 1)
    assert store.request("r-1") is not None


def test_allocations_refuse_a_second_lease_on_one_device(store):
    with store.transaction():
        store.insert_request(a_request("r-1"), 1)
        store.insert_request(a_request("r-2", "bob"), 2)
        store.insert_lease(a_lease("l-1", "r-1", ("GPU-A", "GPU-B")), 500.0)
    with pytest.raises(sqlite3.IntegrityError), store.transaction():
        store.insert_lease(a_lease("l-2", "r-2", ("GPU-C", "GPU-B")), 500.0)
    # the whole second grant rolled back, not just the clashing row
    assert allocations(store) == {"GPU-A": "l-1", "GPU-B": "l-1"}
    assert store.lease("l-2") is None
    assert store.request("r-2").state is RequestState.QUEUED


def test_the_database_stops_a_core_bug_from_double_granting(make_broker):
    broker = make_broker(whole_inventory(2))
    first = broker.submit("alice", Size(gpus=1))
    held = broker.lease(first.lease_id).devices
    # Simulate a placement bug: offer the held device again.
    broker.placer.find = lambda size, strategy, exclude=frozenset(): [  # type: ignore[method-assign]
        broker.placer.devices[held[0]]
    ]
    with pytest.raises(sqlite3.IntegrityError):
        broker.submit("bob", Size(gpus=1))
    assert allocations(broker.store) == {held[0]: first.lease_id}
    bob = [r for r in broker.store.live_requests() if r.user == "bob"]
    assert len(bob) == 1 and bob[0].state is RequestState.QUEUED  # acknowledged, not granted
    assert set(broker.holders()) == {held[0]}


def test_lease_end_writes_the_ledger_and_frees_devices(store):
    with store.transaction():
        store.insert_request(a_request("r-1"), 1)
        lease = a_lease("l-1", "r-1", ("GPU-A", "GPU-B"))
        store.insert_lease(lease, 500.0)
    lease.state, lease.ended_at, lease.reason = LeaseState.RELEASED, 3610.0, "done"
    with store.transaction():
        store.end_lease(lease, "interactive")
    assert allocations(store) == {}
    assert store.active_leases() == []
    (row,) = store.ledger()
    assert row["gpu_hours"] == pytest.approx(2.0)  # 2 GPUs for an hour
    assert store.ledger(since=3610.0) == [row]
    assert store.ledger(until=3610.0) == []  # [since, until)


def test_foreign_keys_refuse_an_allocation_without_a_lease(store):
    with pytest.raises(sqlite3.IntegrityError), store.transaction() as c:
        c.execute("INSERT INTO allocations (device, lease_id) VALUES ('GPU-A', 'l-nope')")


def test_requests_round_trip_through_the_file(state_file):
    store = Store(state_file)
    r = a_request()
    r.expected_duration_s = 900.0
    with store.transaction():
        store.insert_request(r, 1)
    store.close()
    back = Store(state_file).request("r-1")
    assert back == r


def test_broker_state_file_is_created_under_missing_directories(tmp_path, clock):
    path = tmp_path / "deep" / "er" / "state.sqlite"
    broker = Broker(Store(path), whole_inventory(1), clock=clock)
    broker.submit("alice", Size(gpus=1))
    assert path.exists()


def test_a_request_queued_before_the_upgrade_gets_a_ttl_from_the_broker(state_file, clock):
    """A version-2 file (no request liveness) upgrades in place; its queued request lives on
    with a fresh TTL, as a lease does after a restart."""
    conn = sqlite3.connect(state_file)
    for script in MIGRATIONS[:2]:
        conn.executescript(script)
    conn.execute("PRAGMA user_version=2")
    conn.execute(
        "INSERT INTO requests (id, seq, user, groups, size, job_class, submitted_at, state)"
        " VALUES ('r-old', 1, 'alice', '[]', 'gpus=1', 'batch', 10.0, 'queued')"
    )
    conn.commit()
    conn.close()
    broker = Broker(Store(state_file), whole_inventory(1), clock=clock)
    assert broker.store.schema_version == SCHEMA_VERSION
    r = broker.request("r-old")
    assert r.state is RequestState.QUEUED and r.expires_at == clock.now() + 120.0
    broker.tick()
    assert broker.request("r-old").state is RequestState.GRANTED


def test_a_full_state_file_is_a_storage_full_error_naming_it(state_file):
    """For real: SQLite's page limit raises SQLITE_FULL, as a full disk does."""
    broker = Broker(Store(state_file), whole_inventory(1))
    broker.store.conn.execute(
        f"PRAGMA max_page_count={broker.store.conn.execute('PRAGMA page_count').fetchone()[0]}"
    )
    submitted = []
    with pytest.raises(StorageFull, match=f"state file {state_file} could not be written"):
        for _ in range(5000):
            submitted.append(broker.submit("alice", Size(gpus=1), holder="x" * 256).id)
    assert [r.id for r in broker.live_requests()] == submitted  # the refused one is nowhere
    assert [r.id for r in broker.store.live_requests()] == submitted
    assert not broker.store.conn.in_transaction


@pytest.mark.parametrize("step", ["cancel", "release", "renew", "expire"])
def test_a_change_the_file_refuses_leaves_the_broker_as_it_was(
    make_broker, clock, monkeypatch, step
):
    """A write that fails (disk full, I/O error) changes nothing in memory either."""
    broker = make_broker(whole_inventory(1))
    held = broker.submit("alice", Size(gpus=1))
    queued = broker.submit("bob", Size(gpus=1))
    lease = broker.lease(held.lease_id)
    before = (broker.lease(held.lease_id).to_json(), held.to_json(), queued.to_json())

    def full(*args: object) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    for write in ("end_request", "end_lease", "renew_lease"):
        monkeypatch.setattr(broker.store, write, full)
    clock.advance(lease.ttl_s + 1 if step == "expire" else 1)
    with pytest.raises(StorageFull):
        {
            "cancel": lambda: broker.cancel(queued.id),
            "release": lambda: broker.release(lease.id),
            "renew": lambda: broker.renew(lease.id),
            "expire": broker.tick,
        }[step]()
    assert (lease.to_json(), held.to_json(), queued.to_json()) == before
    assert broker.holders() == dict.fromkeys(lease.devices, lease)
    assert [e.request.id for e in broker.queue()] == [queued.id]
    monkeypatch.undo()
    assert broker.release(lease.id).state is LeaseState.RELEASED  # and works once it can
    assert broker.request(queued.id).state is RequestState.GRANTED


def test_a_grant_commits_only_the_pages_it_must(state_file):
    """Every grant's commit writes each B-tree page it touched to the WAL. The request's
    row and the lease's row with its three indexes (id, request, active) are needed; the
    held devices take one B-tree keyed by device (no rowid table, no lease index: a
    release deletes them by key), and the live-requests index is keyed by ``seq`` on
    rows not ended, which a grant leaves alone. Version 8 wrote 9 pages here."""
    store = Store(state_file)
    with store.transaction():
        store.insert_request(a_request("r-1"), 1)
        store.insert_request(a_request("r-2", "bob"), 2)
        store.insert_lease(a_lease("l-1", "r-1", ("GPU-A",)), 500.0)
    store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    with store.transaction():
        store.insert_lease(a_lease("l-2", "r-2", ("GPU-B", "GPU-C")), 500.0)
    page = store.conn.execute("PRAGMA page_size").fetchone()[0]
    frames = (Path(f"{state_file}-wal").stat().st_size - 32) // (page + 24)
    assert frames == 6
    restart = (
        "SELECT * FROM requests WHERE ended_at IS NULL AND state IN ('queued', 'granted')"
        " ORDER BY seq"
    )
    (plan,) = store.conn.execute("EXPLAIN QUERY PLAN " + restart).fetchall()
    assert "USING INDEX requests_live" in plan[-1], plan  # neither a scan nor a sort
    release = "DELETE FROM allocations WHERE device=? AND lease_id=?"
    (plan,) = store.conn.execute("EXPLAIN QUERY PLAN " + release, ("GPU-B", "l-2")).fetchall()
    assert "USING PRIMARY KEY" in plan[-1], plan
    store.close()


def test_a_version_8_file_keeps_its_grants_and_queue_through_the_upgrade(state_file, clock):
    """Migration 9 rebuilds allocations and the live-requests index: the held devices,
    the queue's order and the double-grant guard survive it."""
    inventory = whole_inventory(2)
    held = inventory.devices[0].uuid
    conn = sqlite3.connect(state_file)
    for script in MIGRATIONS[:8]:
        conn.executescript(script)
    conn.execute("PRAGMA user_version=8")
    rows = [("r-held", 1, "granted", "l-1"), ("r-next", 2, "queued", None)]
    for rid, seq, state, lease in rows:
        conn.execute(
            "INSERT INTO requests (id, seq, user, groups, size, job_class, submitted_at, state,"
            " lease_id, expires_at) VALUES (?, ?, 'alice', '[]', 'gpus=1', 'batch', 10.0, ?, ?,"
            " 1e12)",
            (rid, seq, state, lease),
        )
    conn.execute(
        "INSERT INTO leases (id, request_id, user, grp, devices, gpu_equivalents, profile,"
        " granted_at, expires_at, ttl_s, expected_end, state) VALUES ('l-1', 'r-held', 'alice',"
        " '', ?, 1.0, 'gpu', 10.0, 1e12, 120.0, 1e12, 'active')",
        (json.dumps([held]),),
    )
    conn.execute("INSERT INTO allocations VALUES (?, 'l-1')", (held,))
    conn.commit()
    conn.close()
    broker = Broker(Store(state_file), inventory, clock=clock)
    assert broker.store.schema_version == SCHEMA_VERSION
    assert allocations(broker.store) == {held: "l-1"}
    origins = [row[3] for row in broker.store.conn.execute("PRAGMA index_list(allocations)")]
    assert origins == ["pk"]  # rebuilt without its rowid table and lease index
    assert [r.id for r in broker.store.live_requests()] == ["r-held", "r-next"]
    with pytest.raises(sqlite3.IntegrityError), broker.store.transaction() as c:
        c.execute("INSERT INTO allocations VALUES (?, 'l-1')", (held,))
    broker.schedule()  # the queued request gets the other GPU
    nxt = broker.request("r-next")
    assert nxt.state is RequestState.GRANTED
    broker.release("l-1")
    assert allocations(broker.store) == {broker.lease(nxt.lease_id).devices[0]: nxt.lease_id}


SUSPENDED_AT = next(i for i, m in enumerate(MIGRATIONS) if "suspension_ends" in m)
"""The schema version before suspensions were kept in the file."""


def test_a_suspension_is_live_until_its_end_is_stored(state_file, clock):
    broker = Broker(Store(state_file), whole_inventory(2), clock=clock)
    kept, other = (broker.submit("alice", Size(gpus=1)).lease_id for _ in range(2))
    assert kept is not None and other is not None
    evidence = {"host_mib": 4096.0, "suspension": {"kernel_id": "k-1", "pids": [42]}}
    broker.reclaim(kept, "idle; suspended", cause="suspended", evidence=evidence)
    broker.reclaim(other, "idle", cause="idle", evidence={})
    broker.store.close()
    store = Store(state_file)  # a restarted broker
    (live,) = store.suspensions()
    assert live["lease_id"] == kept and live["evidence"] == evidence
    assert store.suspension_end(kept) is None
    with store.transaction():
        store.end_suspension(kept, clock.now(), "resumed")
    with pytest.raises(sqlite3.IntegrityError), store.transaction():  # it ends once
        store.end_suspension(kept, clock.now(), "shut down")
    assert store.suspensions() == [] and store.suspension_end(kept) == "resumed"


def test_suspensions_of_a_broker_that_kept_them_in_memory_are_over_after_the_upgrade(
    state_file,
):
    conn = sqlite3.connect(state_file)
    for script in MIGRATIONS[:SUSPENDED_AT]:
        conn.executescript(script)
    conn.execute(f"PRAGMA user_version={SUSPENDED_AT}")
    conn.execute(
        "INSERT INTO requests (id, seq, user, groups, size, job_class, submitted_at, state)"
        " VALUES ('r-old', 1, 'alice', '[]', 'gpus=1', 'interactive', 10.0, 'reclaimed')"
    )
    conn.execute(
        "INSERT INTO leases (id, request_id, user, grp, devices, gpu_equivalents, profile,"
        " granted_at, expires_at, ttl_s, expected_end, state, ended_at, reason) VALUES"
        " ('l-old', 'r-old', 'alice', '', '[\"GPU-0\"]', 1.0, 'gpu', 10.0, 20.0, 10.0, 20.0,"
        " 'reclaimed', 15.0, 'idle; suspended')"
    )
    conn.execute(
        "INSERT INTO reclaims (lease_id, at, kind, reason, evidence)"
        " VALUES ('l-old', 15.0, 'suspended', 'idle; suspended', '{\"host_mib\": 4096}')"
    )
    conn.commit()
    conn.close()
    store = Store(state_file)
    assert store.schema_version == SCHEMA_VERSION
    assert store.suspensions() == []  # its broker restarted since, and forgot it
    assert store.suspension_end("l-old") == (
        "the GPU broker restarted and kept no record of the suspension"
    )
