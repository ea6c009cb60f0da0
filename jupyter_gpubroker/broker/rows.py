"""How the state file's rows read as the core's models (the columns are the
migrations', ``migrations.py``; ``Request.holder`` is the ``owner`` column)."""

from __future__ import annotations

import json
from typing import Any

from ..wire.sizes import Size
from .models import JobClass, Lease, LeaseState, Request, RequestState


def request_from_row(row: dict[str, Any]) -> Request:
    return Request(
        id=row["id"],
        user=row["user"],
        groups=tuple(json.loads(row["groups"])),
        size=Size.parse(row["size"]),
        job_class=JobClass(row["job_class"]),
        submitted_at=row["submitted_at"],
        holder=row["owner"],  # the column of ``Request.holder``
        state=RequestState(row["state"]),
        expected_duration_s=row["expected_duration_s"],
        lease_id=row["lease_id"],
        ended_at=row["ended_at"],
        reason=row["reason"],
        expires_at=row["expires_at"],
        limit_s=row["limit_s"],
    )


def lease_from_row(row: dict[str, Any]) -> Lease:
    return Lease(
        id=row["id"],
        request_id=row["request_id"],
        user=row["user"],
        group=row["grp"],
        devices=tuple(json.loads(row["devices"])),
        gpu_equivalents=row["gpu_equivalents"],
        granted_at=row["granted_at"],
        expires_at=row["expires_at"],
        ttl_s=row["ttl_s"],
        state=LeaseState(row["state"]),
        ended_at=row["ended_at"],
        reason=row["reason"],
        profile=row["profile"],
        limit_s=row["limit_s"],
        extended_s=row["extended_s"],
        extensions=row["extensions"],
        share_mib=row["share_mib"],
        compute_percent=row["compute_percent"],
    )
