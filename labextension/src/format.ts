/** Short texts the panel and the status bar show: sizes, durations, ETAs. Pure. */

import { ILease, IOutside, IQueueEntry, IRequest } from './types';

/** A request's size as the user asked: "1g.10gb", "2 GPUs", "≥ 20 GiB". */
export function sizeText(r: {
  profile?: string | null;
  gpus?: number | null;
  min_memory_gb?: number | null;
  model?: string | null;
}): string {
  if (r.profile) {
    return r.profile;
  }
  if (r.gpus) {
    const of = r.model ? ` ${r.model}` : '';
    return r.gpus === 1 ? `1${of} GPU` : `${r.gpus}${of} GPUs`;
  }
  if (r.min_memory_gb) {
    return `≥ ${r.min_memory_gb} GiB`;
  }
  return '?';
}

/** Seconds as "45 s", "12 min", "2 h 05 min". */
export function duration(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) {
    return `${s} s`;
  }
  const m = Math.round(s / 60);
  if (m < 60) {
    return `${m} min`;
  }
  const h = Math.floor(m / 60);
  return `${h} h ${String(m % 60).padStart(2, '0')} min`;
}

/** "GPU 3: in use outside the broker by bob, pid 4242, for 12 min" (the broker's words,
 * with the time counted on). */
export function outsideText(label: string, o: IOutside, now: number): string {
  return `${label}: in use outside the broker by ${o.user}, pid ${o.pid}, for ${duration(since(o.since, now))}`;
}

/** Seconds from `iso` to `now` (ms since the epoch). */
export function since(iso: string, now: number): number {
  return (now - Date.parse(iso)) / 1000;
}

/** An instant as the person's wall-clock time: "14:30" (as wire/text.py `clock`). */
export function clock(iso: string): string {
  const t = new Date(iso);
  const two = (n: number) => String(n).padStart(2, '0');
  return `${two(t.getHours())}:${two(t.getMinutes())}`;
}

/** "until 14:30": when a lease's time limit ends; undefined for a lease without one. */
export function untilText(lease: ILease): string | undefined {
  return lease.ends_at ? `until ${clock(lease.ends_at)}` : undefined;
}

/** What one Extend adds to a lease's time limit: an hour, as its label says. */
export const EXTEND_S = 3600;
export const EXTEND_LABEL = 'Extend 1 hour';
export const EXTEND_CAPTION =
  'Add an hour to its time limit, if no one waiting needs the GPU sooner';

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
  const ends = Date.parse(endsAt) > now ? 'ends' : 'ended';
  const then = deadline ? ` at ${clock(deadline)}` : '';
  return `Your GPU's time limit ${ends} at ${clock(endsAt)}; it is reclaimed${then} unless extended`;
}

/** What a start estimate rests on, in words, where it is not past holds (the usual
 * basis; as wire/text.py `ETA_BASIS`). */
const ETA_BASIS: Record<string, string> = {
  'idle reclaim': 'when an idle GPU is reclaimed',
  'time limits': 'by time limits',
  'typical hold': 'from the usual session length'
};

/** "~12 min" until an ETA, with what it rests on unless `basis` is false ("~40 min, by
 * time limits"); "ETA unknown" when the broker cannot know. A start promised from time
 * limits comes first, always: "by 14:30 at the latest (likely ~40 min)" (as
 * wire/text.py `eta_text`). */
export function etaText(
  e: {
    eta: string | null;
    eta_known: boolean;
    eta_basis?: string | null;
    eta_bound?: string | null;
  },
  now: number,
  basis = true
): string {
  if (!e.eta_known || !e.eta) {
    return 'ETA unknown';
  }
  const left = -since(e.eta, now);
  const said = left <= 0 ? 'any moment' : `~${duration(left)}`;
  if (e.eta_bound) {
    const latest = `by ${clock(e.eta_bound)} at the latest`;
    return left <= 0 ? `${said} (${latest})` : `${latest} (likely ${said})`;
  }
  const why = basis ? etaBasis(e) : undefined;
  return why ? `${said}, ${why}` : said;
}

/** What an estimate rests on in words ("by time limits"), or undefined for past holds
 * (the usual basis) and for no estimate. */
export function etaBasis(e: {
  eta_known: boolean;
  eta_basis?: string | null;
}): string | undefined {
  return e.eta_known && e.eta_basis ? ETA_BASIS[e.eta_basis] : undefined;
}

/** Memory in GiB as NVML counts it (MiB / 1024), rounded down: "9.7 GiB" (as
 * jupyter_gpubroker/broker/text.py `memory`). */
export function mib(m: number | null): string {
  return m === null
    ? '?'
    : `${(Math.floor(m / 102.4 + 1e-9) / 10).toFixed(1)} GiB`;
}

/** Who holds a lease, as its user says it (as wire/text.py `holder`): "bob's server",
 * "a `jupyter gpubroker run` command", "kernel 0f3e9a7c". */
export function holderText(holder: string | null | undefined): string {
  if (!holder) {
    return 'no kernel';
  }
  if (holder.startsWith('server:')) {
    const [user, ...name] = holder.slice('server:'.length).split(':');
    return `${user}'s server` + (name.length ? ` ${name.join(':')}` : '');
  }
  if (holder === 'cli-run') {
    return 'a `jupyter gpubroker run` command';
  }
  return `kernel ${holder.slice(0, 8)}`;
}

export function percent(p: number | null): string {
  return p === null ? 'n/a' : `${Math.round(p)}%`;
}

/** The status bar's few characters: my GPU state at a glance, or null when I have none. */
export function statusText(
  leases: ILease[],
  waiting: Array<IRequest | IQueueEntry>,
  utilization: (lease: ILease) => number | null,
  now: number
): string | null {
  const first = [...waiting].sort(
    (a, b) => (a.position ?? Infinity) - (b.position ?? Infinity)
  )[0];
  let queue: string | null = null;
  if (first && first.position) {
    const eta = etaText(first, now, false);
    queue = `queue #${first.position} ${eta === 'ETA unknown' ? '(ETA unknown)' : eta}`;
  }
  let held: string | null = null;
  const warned = leases.find(l => l.reclaim_at);
  if (warned && warned.reclaim_at) {
    const why = limitWarned(warned) ? 'time limit' : 'idle';
    held = `GPU ${why}: reclaim in ${duration(-since(warned.reclaim_at, now))}`;
  } else if (leases.length) {
    const l = leases[0];
    const more = leases.length > 1 ? ` +${leases.length - 1}` : '';
    const size = l.profile === 'gpu' ? `${l.devices.length} GPU` : l.profile;
    held = `GPU ${size} ${percent(utilization(l))}${more}`;
  }
  if (held && queue) {
    return `${held} · ${queue}`;
  }
  return held ?? (queue ? `GPU ${queue}` : null);
}
