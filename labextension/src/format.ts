/** Short texts the panel and the status bar show: sizes, durations, ETAs, in the words
 * of wire/text.py (tests/wire/formatter_cases.json holds both to the same texts), each
 * through the translator. Pure. */

import { trans } from './i18n';
import { IEtaRange, ILease, IOutside, IQueueEntry, IRequest } from './types';

/** A request's size as every front says it (as wire/text.py `size_text`): "1g.10gb",
 * "1 GPU", "2 GPUs", "2 H100-80GB GPUs", "at least 20 GB", "8 GB of a shared GPU". */
export function sizeText(r: {
  profile?: string | null;
  gpus?: number | null;
  min_memory_gb?: number | null;
  model?: string | null;
  share_gb?: number | null;
  compute_percent?: number | null;
}): string {
  if (r.gpus) {
    return r.model
      ? trans._n('%1 %2 GPU', '%1 %2 GPUs', r.gpus, r.model)
      : trans._n('%1 GPU', '%1 GPUs', r.gpus);
  }
  if (r.profile) {
    return r.profile;
  }
  if (r.share_gb) {
    return r.compute_percent
      ? trans.__(
          '%1 GB of a shared GPU, at most %2%% of its compute',
          r.share_gb,
          r.compute_percent
        )
      : trans.__('%1 GB of a shared GPU', r.share_gb);
  }
  return trans.__('at least %1 GB', r.min_memory_gb ?? '?');
}

/** What a lease holds, as its request's size reads (as wire/text.py `lease_size`):
 * "1g.10gb", "1 GPU", "2 GPUs" (a lease's `profile` is `gpu` for whole GPUs). */
export function leaseSize(lease: {
  profile: string;
  devices: string[];
  share?: { memory_mib: number } | null;
}): string {
  if (lease.share) {
    return sizeText({ share_gb: Number(gigabytes(lease.share.memory_mib)) });
  }
  return lease.profile && lease.profile !== 'gpu'
    ? lease.profile
    : sizeText({ gpus: lease.devices.length || 1 });
}

/** Seconds as "45 s", "12 min", "2 h 05 min", each unit rounded down, none below
 * zero (as wire/text.py `duration`). */
export function duration(seconds: number): string {
  const s = Math.max(0, seconds);
  if (s < 60) {
    return trans.__('%1 s', Math.floor(s));
  }
  if (s < 3600) {
    return trans.__('%1 min', Math.floor(s / 60));
  }
  const minutes = String(Math.floor((s % 3600) / 60)).padStart(2, '0');
  return trans.__('%1 h %2 min', Math.floor(s / 3600), minutes);
}

/** "GPU 3: in use outside the broker by bob, pid 4242, for 12 min" (the broker's words,
 * with the time counted on). */
export function outsideText(label: string, o: IOutside, now: number): string {
  return trans.__(
    '%1: in use outside the broker by %2, pid %3, for %4',
    label,
    o.user,
    o.pid,
    duration(since(o.since, now))
  );
}

/** Seconds from `iso` to `now` (ms since the epoch). */
export function since(iso: string, now: number): number {
  return (now - Date.parse(iso)) / 1000;
}

/** An instant (ISO, or ms since the epoch) as the person's wall-clock time: "14:30" (as
 * wire/text.py `clock`). */
export function clock(iso: string | number): string {
  const t = new Date(iso);
  const two = (n: number) => String(n).padStart(2, '0');
  return `${two(t.getHours())}:${two(t.getMinutes())}`;
}

/** "until 14:30": when a lease's time limit ends; undefined for a lease without one. */
export function untilText(lease: ILease): string | undefined {
  return lease.ends_at ? trans.__('until %1', clock(lease.ends_at)) : undefined;
}

/** What one Extend adds to a lease's time limit: an hour, as its label says. */
export const EXTEND_S = 3600;

/** The Extend button's label and caption (as wire/text.py `EXTEND_LABEL`). */
export function extendLabel(): string {
  return trans.__('Extend 1 hour');
}

export function extendCaption(): string {
  return trans.__(
    'Add an hour to its time limit, if no one waiting needs the GPU sooner'
  );
}

/** Is a lease warned for its time limit (kept by Extend, not by using it)? */
export function limitWarned(lease: ILease): boolean {
  return Boolean(lease.reclaim_at) && lease.reclaim_cause === 'time_limit';
}

/** A time-limit warning's notice: "Your GPU's time limit ends at 14:30; it is reclaimed
 * at 14:31 unless extended" (`endsAt` the limit's end, `deadline` the reclaim's). */
export function limitWarningText(
  endsAt: string,
  deadline: string | null,
  now: number
): string {
  const ended = Date.parse(endsAt) <= now;
  const limit = ended
    ? trans.__("Your GPU's time limit ended at %1", clock(endsAt))
    : trans.__("Your GPU's time limit ends at %1", clock(endsAt));
  return deadline
    ? trans.__(
        '%1; it is reclaimed at %2 unless extended',
        limit,
        clock(deadline)
      )
    : trans.__('%1; it is reclaimed unless extended', limit);
}

/** What a start estimate rests on, in words, where it is not past holds (the usual
 * basis; as wire/text.py `ETA_BASIS`). */
function basisWords(basis: string): string | undefined {
  switch (basis) {
    case 'idle reclaim':
      return trans.__('when an idle GPU is reclaimed');
    case 'time limits':
      return trans.__('by time limits');
    case 'typical hold':
      return trans.__('from the usual session length');
  }
  return undefined;
}

/** A start estimate as the API writes it (`eta` its median). */
export interface IEta {
  eta: string | null;
  eta_range?: IEtaRange | null;
  eta_known: boolean;
  eta_basis?: string | null;
  eta_bound?: string | null;
}

/** A waiting request's start, by the person's clock (as wire/text.py `eta_text`):
 * "10:40 (10:20-11:30)", "11:00 (now-11:00), by time limits", "any moment (by 11:30)",
 * "unknown" when the broker cannot know; a start promised from time limits comes first:
 * "by 14:30 at the latest (likely 13:50)". `basis` false leaves out what it rests on
 * (where `etaBasis` says it once for many). */
export function etaText(e: IEta, now: number, basis = true): string {
  const span = e.eta_range;
  if (!e.eta_known || !span || !e.eta) {
    return trans.__('unknown');
  }
  const median = Date.parse(e.eta);
  if (e.eta_bound) {
    const latest = clock(e.eta_bound);
    return median <= now
      ? trans.__('any moment (by %1 at the latest)', latest)
      : trans.__('by %1 at the latest (likely %2)', latest, clock(e.eta));
  }
  const high = span.high ?? null; // absent or null: no bound
  const said = startEstimate(Date.parse(span.low), e.eta, high, now);
  const why = basis ? etaBasis(e) : undefined;
  return why ? trans.__('%1, %2', said, why) : said;
}

/** From (low, median, high; null: no bound), as wire/text.py `start_estimate`. */
function startEstimate(
  low: number,
  median: string,
  high: string | null,
  now: number
): string {
  if (Date.parse(median) <= now) {
    // a bound already past promises nothing: not "by 19:18" at 19:28
    return high && Date.parse(high) > now
      ? trans.__('any moment (by %1)', clock(high))
      : trans.__('any moment');
  }
  const start = low <= now ? trans.__('now') : clock(low);
  if (high === null) {
    return trans.__('%1 (%2 or later)', clock(median), start);
  }
  if (start === clock(median) && clock(high) === start) {
    return start;
  }
  return trans.__('%1 (%2-%3)', clock(median), start, clock(high));
}

/** What an estimate rests on in words ("by time limits"), or undefined for past holds
 * (the usual basis) and for no estimate. */
export function etaBasis(e: {
  eta_known: boolean;
  eta_basis?: string | null;
}): string | undefined {
  return e.eta_known && e.eta_basis ? basisWords(e.eta_basis) : undefined;
}

/** NVML's MiB in GB (10^9 bytes, as NVIDIA names its cards and MIG profiles), one
 * decimal, rounded down: "10.4" (as wire/text.py `gigabytes`). */
export function gigabytes(m: number): string {
  return (Math.floor(((m * 2 ** 20) / 1e9) * 10 + 1e-9) / 10).toFixed(1);
}

/** Memory in GB: "10.4 GB" for a 1g.10gb slice (as wire/text.py `memory`); "?" where
 * not reported. */
export function mib(m: number | null): string {
  return m === null ? '?' : trans.__('%1 GB', gigabytes(m));
}

/** Who holds a lease, as its user says it (as wire/text.py `holder`): "bob's server",
 * "a `jupyter gpubroker run` command", "kernel 0f3e9a7c". */
export function holderText(holder: string | null | undefined): string {
  if (!holder) {
    return trans.__('no kernel');
  }
  if (holder.startsWith('server:')) {
    const [user, ...name] = holder.slice('server:'.length).split(':');
    return name.length
      ? trans.__("%1's server %2", user, name.join(':'))
      : trans.__("%1's server", user);
  }
  if (holder === 'cli-run') {
    return trans.__('a `jupyter gpubroker run` command');
  }
  return trans.__('kernel %1', holder.slice(0, 8));
}

export function percent(p: number | null): string {
  return p === null ? trans.__('n/a') : `${Math.round(p)}%`;
}

/** The status bar's few characters: my GPU state at a glance, or null when I have none;
 * `length` the queue's, so that a place reads as the notebook's widget says it
 * ("queue 2 of 2"). The caller passes the current notebook's lease and request where it
 * has them, so the bar says what that notebook's widget says. */
export function statusText(
  leases: ILease[],
  waiting: Array<IRequest | IQueueEntry>,
  utilization: (lease: ILease) => number | null,
  now: number,
  length = 0
): string | null {
  const first = [...waiting].sort(
    (a, b) => (a.position ?? Infinity) - (b.position ?? Infinity)
  )[0];
  let queue: string | null = null;
  if (first && first.position) {
    const eta = etaText(first, now, false);
    queue = trans.__(
      'queue %1 of %2, ETA %3',
      first.position,
      Math.max(length, first.position),
      eta
    );
  }
  let held: string | null = null;
  const warned = leases.find(l => l.reclaim_at);
  if (warned && warned.reclaim_at) {
    const left = duration(-since(warned.reclaim_at, now));
    held = limitWarned(warned)
      ? trans.__('GPU time limit: reclaim in %1', left)
      : trans.__('GPU idle: reclaim in %1', left);
  } else if (leases.length) {
    const l = leases[0];
    const use = percent(utilization(l));
    held =
      l.profile === 'gpu' || l.share // "1 GPU 0%", not "GPU 1 GPU 0%"
        ? trans.__('%1 %2', leaseSize(l), use)
        : trans.__('GPU %1 %2', l.profile, use);
    if (leases.length > 1) {
      held = trans.__('%1 +%2', held, leases.length - 1);
    }
  }
  if (held && queue) {
    return trans.__('%1 · %2', held, queue);
  }
  return held ?? (queue ? trans.__('GPU %1', queue) : null);
}
