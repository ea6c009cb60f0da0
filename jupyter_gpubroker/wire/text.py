"""Words for people: the one way durations, start estimates, queue places, holders,
amounts and memory are written, in the core's reasons, the widgets, the hub's pages, the
spawner and the CLI. The Lab panel's ``labextension/src/format.ts`` writes sizes, ETAs,
durations and memory again in TypeScript; ``tests/wire/formatter_cases.json`` holds both
to the same texts."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from .sizes import mib_to_gb

LIVE = ("queued", "granted")
"""A request's states (as the API names them) until it ends: waiting, then held."""
SERVER_HOLDER = "server:"
"""A hub server's requests and leases are held by ``server:<user>[:<server name>]``."""
CLI_RUN_HOLDER = "cli-run"
"""``jupyter gpubroker run``'s requests and leases."""
SUSPENDED_TEXT = "suspended, its memory on the host"
"""A kernel whose GPU memory a suspend moved to host memory, until its next cell."""
ENDED_SHUT_DOWN = "the kernel was shut down: its GPU memory on the host went with it"
"""Why a suspended kernel is suspended no more, when its process ended: shut down, ..."""
ENDED_RESTARTED = "the kernel was restarted: its GPU memory on the host went with it"
"""... restarted (a new process, which asks for a GPU as a new kernel does), ..."""
ENDED_AWAY = (
    "the kernel ended while the GPU broker was down: its GPU memory on the host went with it"
)
"""... or gone when the broker started again (its server's restart usually ends it), ..."""
ENDED_EXITED = "the kernel's process ended: its GPU memory on the host went with it"
"""... or gone while the broker runs, with nobody restarting it (killed, say, by the
out-of-memory killer)."""
BIDI_CONTROLS = "\u202a-\u202e\u2066-\u2069"
"""The characters that make text read in another direction (embeddings, overrides and
isolates; a regex class's body): "ann\u202egro" reads as "annorg". No name holds one
(``broker.models.check_name``), and the hub's pages show any other text's escaped."""
_BIDI = re.compile(f"[{BIDI_CONTROLS}]")


def visible(text: str) -> str:
    """``text`` as a page shows it: a bidirectional control written as its escape
    (``\u202e``), so that nothing reads reversed."""
    return _BIDI.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


NUMBERS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def suspended_text(host_mib: float) -> str:
    """A suspended kernel as every front shows it (the lease's ``suspended.text``)."""
    held = f"its {memory(host_mib)} of GPU memory on the host" if host_mib else "nothing on the GPU"
    return f"suspended, {held}: its next cell resumes it"


def duration(seconds: float) -> str:
    """A short human duration: "40 s", "3 min", "2 h 05 min"; each unit rounded down, as
    the minutes always were (59.6 s is "59 s", not "60 s"), and none below zero (a
    deadline just past is "0 s", never "-3 s")."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{math.floor(seconds)} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min"
    return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:02.0f} min"


def clock(t: float) -> str:
    """An instant (UTC seconds) as local wall-clock time: "10:40"."""
    return datetime.fromtimestamp(t).astimezone().strftime("%H:%M")


def start_estimate(
    estimate: tuple[float, float, float | None] | None, position: int | None, now: float
) -> str:
    """A waiting request's start as its user reads it, from (low, median, high; None: no
    bound): "10:40 (10:20-11:30)"; "any moment" only once the low end is now; "unknown"
    when the broker cannot know (never a guess that looks like one). The position is the
    caller's to say, once (``queue_place``); ``position`` is kept for old callers."""
    if estimate is None:
        return "unknown"
    low, median, high = estimate
    until = f"-{clock(high)}" if high is not None else " or later"
    if median <= now:  # a bound already past promises nothing: not "by 19:18" at 19:28
        return "any moment" + (f" (by {clock(high)})" if high is not None and high > now else "")
    start = "now" if low <= now else clock(low)
    if start == clock(median) and high is not None and clock(high) == start:
        return start
    return f"{clock(median)} ({start}{until})"


def promise_broken(was: float, why: str, now_by: float | None) -> str:
    """A promised start the broker can no longer keep, in words, with the new promise."""
    then = (
        f"It now starts by {clock(now_by)} at the latest."
        if now_by is not None
        else "No start can be promised for now."
    )
    return f"The start promised by {clock(was)} cannot be kept: {why}. {then}"


def size_text(r: Mapping[str, Any]) -> str:
    """What a request asks for, in words: "1g.10gb", "1 GPU", "2 GPUs" ("2 H100-80GB
    GPUs"), "at least 20 GB" (a device with at least that much), or "8 GB of a shared
    GPU" ("..., at most 50% of its compute"): a device of a size and part of a shared GPU
    never read alike."""
    if r.get("gpus"):
        n = r["gpus"]
        return f"{n} {r['model'] + ' ' if r.get('model') else ''}GPU{'' if n == 1 else 's'}"
    if r.get("profile"):
        return str(r["profile"])
    if r.get("share_gb"):
        cap = r.get("compute_percent")
        return f"{r['share_gb']:g} GB of a shared GPU" + (
            f", at most {cap}% of its compute" if cap else ""
        )
    return f"at least {r.get('min_memory_gb'):g} GB"


ETA_BASIS = {
    "idle reclaim": "when an idle GPU is reclaimed",
    "time limits": "by time limits",
    "typical hold": "from the usual session length",
}
"""What a start estimate rests on (the API's ``eta_basis``), in words, where it is not
past holds, the usual basis (the Lab panel's ``format.ts`` says the same)."""


def eta_text(r: Mapping[str, Any], now: float | None = None) -> str:
    """A waiting request's or queue entry's ETA in words (``eta``, ``eta_range``,
    ``eta_known``, ``eta_basis``, ``eta_bound`` of the API): "10:40 (10:20-11:30)",
    "11:00 (now-11:00), by time limits", "unknown"; with a promised start, the promise
    first: "by 14:30 at the latest (likely 13:50)". ``now`` defaults to the wall clock, as
    the fronts that show it read one."""
    span = r.get("eta_range")
    if not (r.get("eta_known") and span and r.get("eta")):
        return "unknown"
    now = time.time() if now is None else now
    median = _instant(r["eta"])
    if r.get("eta_bound"):
        latest = f"by {clock(_instant(r['eta_bound']))} at the latest"
        return f"any moment ({latest})" if median <= now else f"{latest} (likely {clock(median)})"
    high = _instant(span["high"]) if span.get("high") else None
    said = start_estimate((_instant(span["low"]), median, high), r.get("position"), now)
    why = ETA_BASIS.get(r.get("eta_basis") or "")
    return f"{said}, {why}" if why else said


def _instant(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def count(n: int, thing: str, plural: str | None = None) -> str:
    """ "one 1g.10gb slice", "two whole GPUs", "12 requests": numbers a person says."""
    word = NUMBERS[n] if 0 <= n < len(NUMBERS) else str(n)
    return f"{word} {thing if n == 1 else plural or thing + 's'}"


def queue_place(position: int | None, length: int, ahead: Mapping[str, int] | None = None) -> str:
    """Where a waiting request stands, said once: "position 2 of 5, one request ahead
    (interactive)", "position 1 of 3, nothing ahead". The number ahead is the position's
    own (position - 1); the classes are added only where they add up to it."""
    if not position:
        return "in the queue"
    before = position - 1
    where = f"position {position} of {max(length, position)}"
    if before == 0:
        return f"{where}, nothing ahead"
    classes = {c: n for c, n in sorted((ahead or {}).items()) if n}
    kinds = ""
    if sum(classes.values()) == before:
        kinds = (
            f" ({next(iter(classes))})"
            if len(classes) == 1
            else f" ({', '.join(f'{n} {c}' for c, n in classes.items())})"
        )
    return f"{where}, {count(before, 'request')} ahead{kinds}"


def holder(holder_id: str | None, kernel_name: str | None = None) -> str:
    """Who holds a lease or waits, as its user says it: "bob's server", "bob's server
    gpu1" (a named server), "a `jupyter gpubroker run` command", "kernel Untitled.ipynb"
    (``kernel_name``: the notebook, where the front knows it), "a kernel" otherwise."""
    if not holder_id:
        return "no kernel"
    if holder_id.startswith(SERVER_HOLDER):
        user, _, name = holder_id[len(SERVER_HOLDER) :].partition(":")
        return f"{user}'s server" + (f" {name}" if name else "")
    if holder_id == CLI_RUN_HOLDER:
        return "a `jupyter gpubroker run` command"
    return f"kernel {kernel_name}" if kernel_name else f"kernel {holder_id[:8]}"


def gigabytes(mib: float) -> str:
    """NVML's MiB as GB (``sizes.MIB_PER_GB``), one decimal, rounded down so that a size
    shown fits: "10.4" for a 1g.10gb slice of an H100 (9984 MiB)."""
    return f"{math.floor(mib_to_gb(mib) * 10 + 1e-9) / 10:.1f}"


def memory(mib: float) -> str:
    """A device's memory in GB, as NVIDIA names its cards and profiles and as
    ``min_memory_gb`` is compared: "10.4 GB" (a 1g.10gb slice), "85.5 GB" (an H100 80GB)."""
    return f"{gigabytes(mib)} GB"


def lease_size(lease: Mapping[str, Any]) -> str:
    """What a lease holds, as its request's size reads: "1g.10gb", "1 GPU", "2 GPUs",
    "8 GB of a shared GPU" (a lease's ``profile`` is ``gpu`` for whole GPUs, ``share``
    for a share, whose ``share`` says its memory)."""
    if lease.get("share"):
        return f"{float(gigabytes(lease['share']['memory_mib'])):g} GB of a shared GPU"
    if lease.get("profile") and lease["profile"] != "gpu":
        return str(lease["profile"])
    return size_text({"gpus": len(lease.get("devices") or ()) or 1})


def devices_held(held: Iterable[Mapping[str, Any]]) -> str:
    """What a user holds, in things: "one 1g.10gb slice", "two whole GPUs and 8 GB of a
    shared GPU", "nothing"; from the API's devices (``kind``, ``profile``) and shares
    (``kind`` ``share``, ``memory_mib``), which the request's words say as asked."""
    whole = 0
    slices: dict[str, int] = {}
    shares: list[float] = []
    for d in held:
        if d.get("kind") == "mig":
            slices[str(d.get("profile"))] = slices.get(str(d.get("profile")), 0) + 1
        elif d.get("kind") == "share":
            shares.append(float(gigabytes(d["memory_mib"])))
        else:
            whole += 1
    parts = [count(whole, "whole GPU")] if whole else []
    parts += [count(n, f"{p} slice") for p, n in sorted(slices.items())]
    if len(shares) == 1:
        parts.append(f"{shares[0]:g} GB of a shared GPU")
    elif shares:
        parts.append(f"{count(len(shares), 'share')} of shared GPUs, {sum(shares):g} GB in all")
    if not parts:
        return "nothing"
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def worth(gpus: float, profiles: Mapping[str, float]) -> str:
    """GPU-equivalents held, in things: "nothing", "two whole GPUs", "one 1g.10gb slice"
    (in the smallest profile they make up), else "0.3 GPUs' worth"."""
    if gpus <= 1e-9:
        return "nothing"
    if abs(gpus - round(gpus)) < 1e-6:
        return count(round(gpus), "whole GPU")
    for p, e in sorted(profiles.items(), key=lambda x: x[1]):
        n = round(gpus / e)
        if abs(n * e - gpus) < 1e-3:
            return count(n, f"{p} slice")
    return f"{gpus:.2g} GPUs' worth"


def quota_allows(max_gpus: float | None, profiles: Mapping[str, float], shared_mib: int = 0) -> str:
    """What a quota of ``max_gpus`` GPU-equivalents lets a user hold at once, in things:
    "one 1g.10gb slice at a time", "two whole GPUs at a time", "up to two 1g.10gb slices
    or one 2g.20gb slice at a time"; ``profiles``: this machine's MIG profiles and their
    GPU-equivalents. A fraction of a GPU only where no whole thing says it ("0.5 GPUs'
    worth at a time"). ``shared_mib``: the memory of the largest GPU lent in shares here
    (0: none), where a quota of less than a GPU allows "up to 8 GB of a shared GPU"."""
    if max_gpus is None:
        return "no limit at a time"
    whole = int(max_gpus + 1e-9)
    options = [count(whole, "whole GPU")] if whole >= 1 else []
    # 1e-3: the API rounds a slice's share of a GPU (1/7 to 0.1429), a quota may be exact
    fits = {p: int(max_gpus / e + 1e-3) for p, e in sorted(profiles.items(), key=lambda x: x[1])}
    options += [count(n, f"{p} slice") for p, n in fits.items() if n >= 1]
    share_gb = math.floor(mib_to_gb(max_gpus * shared_mib)) if max_gpus < 1 else 0
    options += [f"up to {share_gb} GB of a shared GPU"] if share_gb >= 1 else []
    if not options:
        return f"{max_gpus:g} GPUs' worth at a time, less than any device here"
    if len(options) == 1:
        return f"{options[0]} at a time"
    return f"up to {', '.join(options[:-1])} or {options[-1]} at a time"


def request_ended(state: str, reason: str) -> str:
    """A request that ended before its grant, its state said once: "request cancelled by
    admin1: nightly run", "request expired: its holder stopped renewing it"."""
    if not reason:
        return f"request {state}"
    return f"request {reason}" if reason.startswith(state) else f"request {state}: {reason}"


def held_back(
    kind: str,
    name: str,
    mine: bool,
    *,
    allows: str = "",
    holds: str = "",
    budget: str = "",
    renews_at: float | None = None,
) -> str:
    """Why a quota keeps a request waiting, naming whose quota it is (``mine``: the
    reader's own): "group ML Team's quota allows one 1g.10gb slice at a time and its
    members hold one 1g.10gb slice: it starts once they give one back"; a spent budget
    (``budget``: "10 GPU-hours per day"): "..., it starts when it renews at 00:00"."""
    if kind == "group":
        whose, holder, back = f"group {name}'s", "its members hold", "they give"
    elif mine:
        whose, holder, back = "your", "you hold", "you give"
    else:
        whose, holder, back = f"{name}'s", f"{name} holds", f"{name} gives"
    if renews_at is not None:
        renews = clock(renews_at)
        return f"{whose} budget of {budget} is spent: it starts when it renews at {renews}"
    return f"{whose} quota allows {allows} and {holder} {holds}: it starts once {back} one back"


def gpu_hours(hours: float) -> str:
    """GPU-hours as a chart's label says them, in hours as its title does, two
    significant digits below one, so that bars of clearly different length never read the
    same: "120 h", "2.5 h", "0.25 h", "0.0067 h"; "under 0.001 h" (four seconds of a GPU)."""
    if hours >= 10:
        return f"{hours:,.0f} h"
    if hours >= 1:
        return f"{hours:.1f} h"
    if hours >= 0.001:
        return f"{float(f'{hours:.2g}'):.6f}".rstrip("0").rstrip(".") + " h"
    return "under 0.001 h" if hours > 0 else "none"


def gpus(value: float) -> str:
    """GPU-equivalents as a chart's label says them: "2.5 GPUs", "0.14 GPUs", "none"."""
    if value <= 0:
        return "none"
    if value < 0.005:
        return "under 0.01 GPUs"
    figure = f"{value:.1f}" if value >= 1 else f"{value:.2f}"
    return f"{figure} GPU" if figure == "1.0" else f"{figure} GPUs"


def period(seconds: float) -> str:
    """A budget period as "per ..." ends: "hour", "day", "week", "30 days", "90 min"."""
    named = {3600: "hour", 86400: "day", 604800: "week"}
    if seconds in named:
        return named[int(seconds)]
    if seconds % 86400 == 0:
        return f"{seconds // 86400:.0f} days"
    return duration(seconds)


AUDIT_FIELDS = {
    "share": "share",
    "max_gpus": "most GPU-equivalents at once",
    "gpu_hours": "GPU-hours",
    "period_s": "per",
}


def audit_detail(detail: Mapping[str, object], action: str) -> str:
    """An audit record's detail in words ("was queued; reason: nightly run moved"), not
    the JSON the state file keeps."""
    said: list[str] = []
    if action == "set_quota":
        for field, label in AUDIT_FIELDS.items():
            value = detail.get(field)
            if value is None:
                continue
            if field == "period_s":
                said.append(f"per {period(float(value))}")  # type: ignore[arg-type]
            else:
                said.append(f"{label} {float(value):g}")  # type: ignore[arg-type]
        return ", ".join(said) or "no limits"
    if action == "set_time_limits":
        for field, label in (("default_s", "default"), ("max_s", "maximum")):
            value = detail.get(field)
            if value is not None:
                said.append(f"{label} {duration(float(value))}")  # type: ignore[arg-type]
        return ", ".join(said + (["required"] if detail.get("required") else []))
    if "user" in detail:
        said.append(f"{detail['user']}'s request")
    if "was" in detail and detail["was"] is not None:
        said.append(f"was {detail['was']}")
    if "state" in detail:
        said.append(f"was {detail['state']}")
    if action == "set_class":
        said.append(f"now {detail.get('job_class')}")
    if detail.get("faults"):
        said.append("still faulty: " + ", ".join(str(f) for f in detail["faults"]))  # type: ignore[attr-defined]
    if detail.get("reason"):
        said.append(f"reason: {detail['reason']}")
    return "; ".join(said)


# -------------------------------------------------------------------- time limits

EXTEND_BY_S = 3600.0
"""What one Extend button asks for: an hour more."""
EXTEND_LABEL = "Extend 1 hour"
"""That button's label."""


IDLE_RECLAIM_WORDS = {
    "suspend": "are suspended",
    "shutdown": "are shut down",
    "revoke": "lose their GPU and run on",
}
"""What idle reclaim does to idle kernels, by its action (``GET devices``' ``idle_reclaim``)."""


def idle_reclaim_text(action: str, reason: str, where: str = "here") -> str:
    """What idle reclaim does to the idle kernels ``where`` and why: "idle kernels on GPU 0
    are suspended: the canary passed ..."; "pending" while the canary has not run."""
    does = IDLE_RECLAIM_WORDS.get(action)
    if does is None:
        return f"what idle reclaim does {where} is not decided yet: {reason}"
    return f"idle kernels {where} {does}: {reason}"


def sentence(text: str) -> str:
    """``text`` as a sentence of its own: its first letter a capital, a full stop."""
    return f"{text[:1].upper()}{text[1:]}."


def limit_until(ends_at: float) -> str:
    """A lease's time limit end as a status line shows it: "until 14:30"."""
    return f"until {clock(ends_at)}"


def limit_reason(granted_at: float, ends_at: float, now: float) -> str:
    """Why a lease is warned or reclaimed at its time limit ("its time limit of 2 h 00 min
    ends at 14:30", "... is up")."""
    when = "is up" if now >= ends_at else f"ends at {clock(ends_at)}"
    return f"its time limit of {duration(ends_at - granted_at)} {when}"


def reclaim_warning(reason: str, deadline: float, cause: str) -> str:
    """A warning as its holder reads it: the broker's ``reason`` ("its time limit of
    2 h 00 min ends at 14:30") and when the GPU goes back; a time limit's (``cause``)
    says it may be extended."""
    unless = " unless it is extended" if cause == "time_limit" else ""
    return f"{reason}; the GPU is taken back at {clock(deadline)}{unless}"


def limit_extended(ends_at: float) -> str:
    """An extension, said to its holder."""
    return f"time limit extended: it now ends at {clock(ends_at)}"


# -------------------------------------------------------------------- shares of GPUs

SHARE_HOLDS = {
    "driver": "enforced by the driver",
    "mps": "enforced by MPS",
    "watched": "not enforced: a kernel that goes over is stopped",
}
"""What holds a share to its memory (``enforce``), as every front says it."""
KERNEL_PID_NAMESPACE = (
    "its kernel runs in another pid namespace than the GPU broker's, which cannot see its processes"
)
"""Why a kernel is not suspended, moved or given its devices: its renewals named its process
by a pid of another namespace (a container of its own), which means nothing to the broker."""
BROKER_PID_NAMESPACE = (
    "the GPU broker runs in a pid namespace of its own, not the host's, so it cannot tell "
    "which processes on the GPUs are its kernels'"
)
"""Why a broker on real GPUs in a container of its own suspends, moves and stops nothing:
NVIDIA's driver may list GPU processes by the host's pids (``pidns``)."""
SHARE_NOT_SUSPENDED = "a share cannot be suspended: NVIDIA documents no checkpoint of MPS clients"
"""Why idle reclaim shuts a share's kernel down, on every front (as ``MIG_TEXT`` for a
slice): NVIDIA's checkpoint acts on one process, an MPS client's GPU context is its
server's, and nothing NVIDIA publishes covers it (``docs/sharing.md``)."""


def share_text(mib: float, label: str, mechanism: str) -> str:
    """A share as its holder reads it: "8.5 GB of GPU 2, enforced by the driver"."""
    return f"{memory(mib)} of {label}, {SHARE_HOLDS.get(mechanism, 'not enforced')}"


def over_share(used_mib: float, mib: float, label: str) -> str:
    """Why a share is warned: "uses 12.0 GB of GPU 2, over its share of 8.5 GB"."""
    return f"uses {memory(used_mib)} of {label}, over its share of {memory(mib)}"


def outside_mps(label: str, mib: float) -> str:
    """Why an MPS share is warned when its kernel left MPS: nothing holds that process."""
    return f"uses {label} outside MPS, so nothing holds it to its share of {memory(mib)}"
