"""Trace loaders: the documented mapping rules, and bad rows named by file and line."""

from __future__ import annotations

import zlib
from datetime import datetime, timezone

import pytest
from replay_helpers import OPENB_HEADER, PHILLY_HEADER

from jupyter_gpubroker.broker.models import JobClass
from jupyter_gpubroker.replay.traces import (
    MIN_DURATION_S,
    TraceError,
    load,
    load_generic,
    load_openb,
    load_philly,
    synthetic_user,
)

# ---------------------------------------------------------------- openb

OPENB_ROWS = (
    "pod-a,4000,15258,1,220,,BE,Running,100,400,110",
    "pod-b,12000,16384,0,0,,LS,Running,0,50,0",
    "pod-c,88000,327680,8,1000,,Burstable,Succeeded,50,1050,60",
    "pod-d,6000,12288,1,1000,,LS,Pending,200,300,",
    "pod-e,6000,12288,1,1000,,Guaranteed,Failed,300,305,305",
)


def test_openb_mapping_rules(write_trace):
    trace = load_openb(write_trace(OPENB_HEADER, OPENB_ROWS), users=8)
    assert trace.skipped == {"CPU-only tasks (num_gpu 0)": 1}
    c, a, d, e = trace.jobs  # sorted by creation time
    assert (c.submit_s, c.gpus, c.duration_s, c.job_class) == (50, 8, 990, JobClass.BATCH)
    assert (a.submit_s, a.gpus, a.duration_s, a.job_class) == (100, 0.22, 290, JobClass.BATCH)
    # never scheduled: held for as long as it waited, from creation to deletion
    assert (d.gpus, d.duration_s, d.job_class) == (1, 100, JobClass.INTERACTIVE)
    # deleted the instant it started: the minimum lease
    assert (e.duration_s, e.job_class) == (MIN_DURATION_S, JobClass.INTERACTIVE)
    assert all(j.group == "" for j in trace.jobs)
    assert any("synthetic" in n for n in trace.notes)


def test_openb_users_follow_the_documented_template_hash(write_trace):
    rows = (
        "p1,3152,5600,1,810,,BE,Running,0,10,0",
        "p2,3152,5600,1,810,,BE,Failed,5,20,6",
        "p3,11300,49152,1,1000,,LS,Running,7,90,7",
    )
    one, two, three = load_openb(write_trace(OPENB_HEADER, rows), users=32).jobs
    assert one.user == two.user  # one template, one user
    assert one.user == f"u{zlib.crc32(b'3152|5600|1|810|BE|') % 32:02d}"
    assert three.user == synthetic_user("11300|49152|1|1000|LS|", 32)
    assert synthetic_user("anything", 1) == "u0"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("p,1,1,1,abc,,LS,Running,0,10,0", "gpu_milli must be a whole number, not 'abc'"),
        ("p,1,1,1,1500,,LS,Running,0,10,0", "gpu_milli must be at most 1000"),
        ("p,1,1,-1,1000,,LS,Running,0,10,0", "num_gpu must be at least 0"),
        ("p,1,1,1,500,,XX,Running,0,10,0", "unknown qos 'XX'"),
        ("p,1,1,1,500,,LS,Running,0,10,20", "deletion_time 10 is before its start 20"),
        ("p,1,1,1,500,,LS,Running,0,,0", "deletion_time must be a number, not ''"),
        ("p,1,1,1,500,,LS,Running,0,nan,0", "deletion_time must be finite"),
        ("p,1,1,1,500,,LS,Running,0,10", "the row has fewer columns than the header's 11"),
        ("p,1,1,1,500,,LS,Running,0,10,0,9", "the row has more columns than the header's 11"),
    ],
)
def test_openb_bad_rows_name_the_line(write_trace, row, message):
    good = "ok,1,1,1,1000,,LS,Running,0,10,0"
    path = write_trace(OPENB_HEADER, (good, row))
    with pytest.raises(TraceError) as e:
        load_openb(path)
    assert str(e.value).startswith(f"{path}:3: {message}")


def test_openb_missing_column_and_empty_trace(write_trace):
    path = write_trace("name,num_gpu,gpu_milli", ("p,1,1000",))
    with pytest.raises(TraceError, match=r":1: the header lacks column\(s\) qos, creation_time"):
        load_openb(path)
    only_cpu = write_trace(OPENB_HEADER, ("p,1,1,0,0,,LS,Running,0,10,0",))
    with pytest.raises(TraceError, match="the trace has no GPU jobs"):
        load_openb(only_cpu)


def test_unreadable_file_and_unknown_format(tmp_path):
    with pytest.raises(TraceError, match="cannot read trace .*missing.csv"):
        load(tmp_path / "missing.csv", "openb")
    with pytest.raises(TraceError, match="unknown trace format 'sge'"):
        load(tmp_path / "x.csv", "sge")
    with pytest.raises(TraceError, match="synthetic users must be at least 1"):
        load(tmp_path / "x.csv", "openb", users=0)


# ---------------------------------------------------------------- philly


def test_philly_tenants_are_users_and_groups_and_duplicates_stay(write_trace):
    row = "2017-10-09 07:01:55,66.0,1,66.0,11cb48"
    rows = (row, "2017-10-09 06:13:03,2951.0,8,23608.0,6214e9", row)
    trace = load_philly(write_trace(PHILLY_HEADER, rows))
    first, dup1, dup2 = trace.jobs
    assert (first.user, first.group, first.gpus, first.duration_s) == ("6214e9", "6214e9", 8, 2951)
    assert dup1 == dup2  # exact duplicates are two jobs
    assert dup1.submit_s == datetime(2017, 10, 9, 7, 1, 55, tzinfo=timezone.utc).timestamp()
    assert all(j.job_class is JobClass.BATCH for j in trace.jobs)
    assert trace.skipped == {}


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("2017/10/09 07:01:55,66,1,66,vc", "timestamp '2017/10/09 07:01:55' is not"),
        ("2017-10-09 07:01:55,-5,1,66,vc", "duration must be at least 0, not -5"),
        ("2017-10-09 07:01:55,66,0,66,vc", "num_gpus must be at least 1, not 0"),
        ("2017-10-09 07:01:55,66,1.5,66,vc", "num_gpus must be a whole number, not '1.5'"),
        (
            "2017-10-09 07:01:55,66,1,66,bad\tname",
            "cluster name .+ holds .+ but control characters",
        ),
    ],
)
def test_philly_bad_rows_name_the_line(write_trace, row, message):
    path = write_trace(PHILLY_HEADER, ("2017-10-09 07:01:55,66,1,66,vc", row))
    with pytest.raises(TraceError, match=f"^{path}:3: {message}"):
        load_philly(path)


# ---------------------------------------------------------------- generic


def test_generic_columns_and_defaults(write_trace):
    rows = ("10,50,2,,,", "0,100,0.5,ann,lab,interactive", "20,0,1,bob,,batch")
    trace = load_generic(write_trace("submit_s,duration_s,gpus,user,group,class", rows))
    ann, anon, bob = trace.jobs
    assert (ann.user, ann.group, ann.gpus, ann.job_class) == ("ann", "lab", 0.5, "interactive")
    assert anon.user == synthetic_user("2||batch", 32) and anon.job_class is JobClass.BATCH
    assert (bob.gpus, bob.duration_s) == (1, MIN_DURATION_S)
    assert isinstance(anon.gpus, int)
    assert trace.notes == (
        "users are synthetic for 1 jobs without one: 1 user (of 32 allowed by --users) by the "
        "CRC-32 of the template (gpus, group, class)",
    )


def test_one_gpu_jobs_without_users_replay_as_one_user_and_the_note_says_so(write_trace):
    rows = [f"{i},10,1" for i in range(50)]
    trace = load(write_trace("submit_s,duration_s,gpus,site", [r + ",x" for r in rows]), "generic")
    assert {j.user for j in trace.jobs} == {synthetic_user("1||batch", 32)}
    assert trace.notes == (
        "users are synthetic for 50 jobs without one: 1 user (of 32 allowed by --users) by the "
        "CRC-32 of the template (gpus, group, class)",
        "columns ignored: site",
    )


def test_openb_says_which_columns_it_ignores(write_trace):
    trace = load_openb(write_trace(OPENB_HEADER, OPENB_ROWS), users=8)
    assert trace.notes[1] == (
        "columns ignored: name, cpu_milli, memory_mib, gpu_spec, pod_phase; "
        "cpu_milli, memory_mib and gpu_spec only pick the synthetic user"
    )
    made = len({j.user for j in trace.jobs})
    assert trace.notes[0].startswith(f"users are synthetic: {made} users (of 8 allowed")


def test_generic_needs_only_three_columns(write_trace):
    trace = load(write_trace("submit_s,duration_s,gpus", ("0,10,1", "5,10,4")), "generic", 4)
    assert {j.user for j in trace.jobs} <= {"u0", "u1", "u2", "u3"}
    assert len(trace.notes) == 1


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("0,10,1.5,ann,,", "gpus must be a whole number >= 1 or a share in (0, 1), not 1.5"),
        ("0,10,0,ann,,", "gpus must be a whole number >= 1 or a share in (0, 1), not 0"),
        ("0,10,1,ann,,urgent", "class must be 'interactive' or 'batch', not 'urgent'"),
        ("0,ten,1,ann,,", "duration_s must be a number, not 'ten'"),
        ("0,10,1,\x1b[2Jann,,", "user name '\\x1b[2Jann' holds '\\x1b'"),
    ],
)
def test_generic_bad_rows_name_the_line(write_trace, row, message):
    path = write_trace("submit_s,duration_s,gpus,user,group,class", ("0,10,1,ann,,", row))
    with pytest.raises(TraceError) as e:
        load_generic(path)
    assert str(e.value).startswith(f"{path}:3: {message}")
