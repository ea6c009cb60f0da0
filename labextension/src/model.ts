/** What the panel and the status bar show, kept from one overview call (on connect) and
 * the event stream, with no HTTP call per event: my own events carry my request and its
 * lease in full (an `extended` lease's new end, a lease that ends with its kernel
 * suspended, and its `suspension_ended`, included), `hello`/`positions` the queue and my
 * positions, others' grants and
 * lease ends the devices they take or give back, `devices` the whole device picture after
 * a drain or outside use, `readings` the devices' latest readings, and a `snapshot`
 * replaces the picture. Also the notifications due to the user (grant, reclaim warning
 * and its withdrawal, reclaim, the end of a lease) and each device's recent utilization. */

import { ISignal, Signal } from '@lumino/signaling';

import { BrokerClient } from './client';
import { sizeText } from './format';
import { trans } from './i18n';
import {
  IEnvelope,
  IGpu,
  IHolder,
  ILease,
  IOverview,
  IPositions,
  IQueueEntry,
  IRequest
} from './types';

export interface INotice {
  kind:
    | 'granted'
    | 'warning'
    | 'cleared'
    | 'reclaimed'
    | 'outside'
    | 'ended'
    | 'promise';
  leaseId: string;
  requestId: string | null;
  message: string;
  deadline: string | null;
  /** A warning's cause: `time_limit` is kept by Extend, the others by use ("Keep it"). */
  cause?: string | null;
  /** A time-limit warning's: when the lease's limit ends. */
  endsAt?: string | null;
  /** A reclaim's: the kernel that held the lease, and whether its server shuts it down. */
  holder?: string | null;
  shutDown?: boolean;
}

/** My events that end a lease (a "GPU granted" notice about it is then stale). */
const ENDS = ['released', 'expired', 'reclaimed'];

export interface IKernelInfo {
  /** The notebook (or console) path of a running kernel, by its id. */
  path: string;
}

/** Where a starting GPU notebook's kernel stands: its request and the notebook's path. */
export interface IWaitingNotebook {
  path: string;
  request: IRequest;
}

export class GpuModel {
  constructor(readonly historyLength = 60) {}

  get overview(): IOverview | null {
    return this._overview;
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get notice(): ISignal<this, INotice> {
    return this._notice;
  }

  get connected(): boolean {
    return this._connected;
  }

  set connected(value: boolean) {
    if (value !== this._connected) {
      this._connected = value;
      this._changed.emit();
    }
  }

  /** Why the broker does not answer now, in its own words or ours; null while it does. */
  get away(): string | null {
    return this._away;
  }

  set away(why: string | null) {
    if (why !== this._away) {
      this._away = why;
      this._changed.emit();
    }
  }

  /** Recent utilization samples of a device (oldest first; null: not reported). */
  history(uuid: string): Array<number | null> {
    return this._history.get(uuid) ?? [];
  }

  /** Running kernels by id, as the Lab's sessions know them (for "which notebook"). */
  setKernels(kernels: Map<string, IKernelInfo>): void {
    this._kernels = kernels;
    this._changed.emit();
  }

  kernelPath(kernelId: string | null | undefined): string | null {
    return (kernelId && this._kernels.get(kernelId)?.path) || null;
  }

  /** My waiting requests, best position first (an admin's overview lists everyone's). */
  get waiting(): IRequest[] {
    const o = this._overview;
    return (o?.requests ?? [])
      .filter(r => r.state === 'queued' && r.user === o?.me.user)
      .sort((a, b) => (a.position ?? Infinity) - (b.position ?? Infinity));
  }

  get leases(): ILease[] {
    return (
      this._overview?.leases.filter(l => l.user === this._overview?.me.user) ??
      []
    );
  }

  /** The kernel (or server) that holds a lease: its request's holder. */
  holderOf(lease: ILease): string | null {
    return (
      this._overview?.requests.find(r => r.id === lease.request_id)?.holder ??
      null
    );
  }

  /** My leases and waiting requests of one kernel (the current notebook's), or all of
   * mine where that kernel has none: what the status bar speaks of. */
  mineFor(kernelId: string | null): {
    leases: ILease[];
    waiting: IRequest[];
  } {
    const leases = this.leases.filter(l => this.holderOf(l) === kernelId);
    const waiting = this.waiting.filter(r => r.holder === kernelId);
    return kernelId && (leases.length || waiting.length)
      ? { leases, waiting }
      : { leases: this.leases, waiting: this.waiting };
  }

  /** How long a lease has been idle now: the broker's figure when it was read, counted
   * on since (0: in use at that look; null: not known). */
  idle(lease: ILease, now: number): number | null {
    const s = lease.idle_s;
    if (s === undefined || s === null || s <= 0) {
      return s ?? null;
    }
    return s + Math.max(0, now - (this._read.get(lease.id) ?? now)) / 1000;
  }

  /** My suspended kernels' leases: ended, their kernels' GPU memory on the host. */
  get suspended(): ILease[] {
    const o = this._overview;
    return (o?.suspended ?? []).filter(l => l.user === o?.me.user);
  }

  device(uuid: string): { gpu: IGpu; utilization: number | null } | null {
    for (const gpu of this._overview?.gpus ?? []) {
      if (gpu.uuid === uuid) {
        return { gpu, utilization: gpu.utilization_gpu };
      }
      const d = gpu.devices.find(x => x.uuid === uuid);
      if (d) {
        return { gpu, utilization: d.utilization_gpu };
      }
    }
    return null;
  }

  /** A device's label ("GPU 0 / 1g.10gb@3"), or its UUID when the picture lacks it. */
  label(uuid: string): string {
    return (
      this.device(uuid)?.gpu.devices.find(d => d.uuid === uuid)?.label ?? uuid
    );
  }

  /** The highest utilization over a lease's devices; a share's own (its processes', as
   * the broker last said), not its GPU's, which is all its shares' together. */
  utilization(lease: ILease): number | null {
    if (lease.share && lease.share.utilization !== undefined) {
      return lease.share.utilization;
    }
    const values = lease.devices
      .map(u => this.device(u)?.utilization ?? null)
      .filter((v): v is number => v !== null);
    return values.length ? Math.max(...values) : null;
  }

  /** Starting GPU notebooks matched to my waiting requests that no running kernel holds:
   * a kernel that waits in the queue is not running yet, so the Lab does not know its id;
   * each starting notebook (in the order they started) takes the oldest such request of
   * its size. */
  waitingNotebooks(
    starting: Array<{ path: string; size: string | null }>
  ): IWaitingNotebook[] {
    const free = this.waiting
      .filter(r => !this._kernels.has(r.holder))
      .sort((a, b) => Date.parse(a.submitted_at) - Date.parse(b.submitted_at));
    const out: IWaitingNotebook[] = [];
    for (const nb of starting) {
      const i = free.findIndex(
        r => nb.size === null || sizeText(r) === nb.size
      );
      if (i >= 0) {
        out.push({ path: nb.path, request: free.splice(i, 1)[0] });
      }
    }
    return out;
  }

  setOverview(overview: IOverview): void {
    this._overview = overview;
    this._read.clear();
    for (const l of overview.leases) {
      this._read.set(l.id, Date.now());
    }
    for (const gpu of overview.gpus) {
      for (const d of gpu.devices) {
        this._sample(d.uuid, d.utilization_gpu);
      }
      this._sample(gpu.uuid, gpu.utilization_gpu);
    }
    this._changed.emit();
  }

  /** One message of the event stream: the picture changes in place, with no call. */
  apply(e: IEnvelope): void {
    const o = this._overview;
    const d = e.data ?? {};
    if (e.type === 'snapshot') {
      this.setOverview(d as IOverview);
      return;
    }
    if (!o) {
      return; // the overview on connect brings the picture; its events come after it
    }
    switch (e.type) {
      case 'hello':
      case 'positions':
        this._positions(o, d as IPositions);
        break;
      case 'readings':
        this._readings(o, d.devices ?? {});
        break;
      case 'devices':
        o.gpus = (d as { gpus: IGpu[] }).gpus;
        break;
      default:
        this._event(o, e.type, d);
    }
    this._changed.emit();
  }

  private _event(o: IOverview, type: string, d: any): void {
    const me = o.me.user;
    if (d.user === me && type === 'outside_use') {
      this._notify('outside', d, d.message, d.deadline ?? null);
    }
    if (d.user === me && type === 'promise_broken') {
      this._notify('promise', d, d.message, null);
    }
    const mine: (IRequest & { lease: ILease | null }) | undefined = d.request;
    if (mine) {
      this._request(o, mine);
    } else if (d.devices && type !== 'outside_use') {
      // another user's grant or lease end: who holds those devices now
      const holder = type === 'granted' ? { user: d.user } : null;
      this._hold(o, d.devices, holder);
    }
    if (d.user !== me || !d.lease_id) {
      return;
    }
    const lease = o.leases.find(l => l.id === d.lease_id);
    if (lease && (type === 'warning' || type === 'warning_cleared')) {
      lease.reclaim_at = type === 'warning' ? d.deadline : null;
      lease.reclaim_cause = type === 'warning' ? (d.cause ?? null) : null;
    }
    if (type === 'granted') {
      const labels = (d.devices ?? []).map((u: string) => this.label(u));
      const text = trans.__('GPU granted: %1', labels.join(', '));
      this._notify('granted', d, text, null);
    } else if (type === 'warning') {
      this._notify(
        'warning',
        d,
        d.reason ?? trans.__('idle'),
        d.deadline ?? null,
        {
          cause: d.cause ?? null,
          endsAt: d.cause === 'time_limit' ? (lease?.ends_at ?? null) : null
        }
      );
    } else if (type === 'warning_cleared') {
      this._notify('cleared', d, d.reason ?? '', null);
    } else if (type === 'reclaimed') {
      const ended = d.request?.lease as ILease | undefined;
      this._notify('reclaimed', d, d.reason ?? trans.__('reclaimed'), null, {
        holder: d.request?.holder ?? null,
        shutDown:
          (ended?.on_reclaim ?? 'shutdown') === 'shutdown' && !ended?.suspended
      });
    }
    if (ENDS.includes(type)) {
      this._notify('ended', d, d.reason ?? type, null);
    }
  }

  /** My request as its event left it: live ones are kept (with their lease), ended ones
   * dropped; the devices its lease holds show me as their holder. */
  private _request(o: IOverview, r: IRequest & { lease: ILease | null }): void {
    const { lease, ...request } = r;
    const known = o.requests.find(x => x.id === r.id);
    const live = r.state === 'queued' || r.state === 'granted';
    o.requests = o.requests.filter(x => x.id !== r.id);
    if (live) {
      // a queued request keeps its place until `positions` brings the new one
      o.requests.push(
        r.state === 'queued' && known
          ? {
              ...request,
              position: known.position,
              eta: known.eta,
              eta_range: known.eta_range
            }
          : request
      );
    }
    if (lease) {
      o.leases = o.leases.filter(x => x.id !== lease.id);
      // suspended when it ended so, and no more once a `suspension_ended` says so
      o.suspended = (o.suspended ?? []).filter(x => x.id !== lease.id);
      if (lease.suspended) {
        o.suspended.push(lease);
      }
      const active = lease.state === 'active';
      if (active) {
        o.leases.push(lease);
        this._read.set(lease.id, Date.now());
      }
      this._hold(
        o,
        lease.devices,
        active
          ? { user: lease.user, lease_id: lease.id, request_id: r.id }
          : null
      );
    }
  }

  private _hold(o: IOverview, devices: string[], holder: IHolder | null): void {
    for (const gpu of o.gpus) {
      for (const dev of gpu.devices) {
        if (devices.includes(dev.uuid)) {
          dev.holder = holder;
        }
      }
    }
  }

  private _readings(o: IOverview, readings: Record<string, any>): void {
    for (const gpu of o.gpus) {
      for (const dev of [gpu, ...gpu.devices]) {
        const r = readings[dev.uuid];
        if (r) {
          Object.assign(dev, r);
          this._sample(dev.uuid, dev.utilization_gpu);
        }
      }
    }
  }

  private _positions(o: IOverview, p: IPositions): void {
    const moved = new Map(p.requests.map(r => [r.id, r]));
    o.requests = o.requests.map(r => moved.get(r.id) ?? r);
    for (const r of p.requests) {
      if (!o.requests.some(x => x.id === r.id)) {
        o.requests.push(r);
      }
    }
    if (p.queue) {
      o.queue = p.queue;
    } else {
      o.queue = o.queue.map((q: IQueueEntry) => {
        const r = q.id ? moved.get(q.id) : undefined;
        return r
          ? {
              ...q,
              position: r.position ?? q.position,
              eta: r.eta,
              eta_range: r.eta_range ?? null,
              eta_known: r.eta_known,
              eta_basis: r.eta_basis,
              eta_bound: r.eta_bound
            }
          : q;
      });
    }
    o.length = p.queue_length;
  }

  private _notify(
    kind: INotice['kind'],
    d: any,
    message: string,
    deadline: string | null,
    more: Partial<INotice> = {}
  ): void {
    this._notice.emit({
      kind,
      leaseId: d.lease_id,
      requestId: d.request_id ?? null,
      message,
      deadline,
      ...more
    });
  }

  private _sample(uuid: string, value: number | null): void {
    const h = this._history.get(uuid) ?? [];
    h.push(value);
    if (h.length > this.historyLength) {
      h.splice(0, h.length - this.historyLength);
    }
    this._history.set(uuid, h);
  }

  private _overview: IOverview | null = null;
  private _connected = false;
  private _away: string | null = null;
  private _kernels = new Map<string, IKernelInfo>();
  private _history = new Map<string, Array<number | null>>();
  /** When each lease (its `idle_s`) was last read, in ms since the epoch. */
  private _read = new Map<string, number>();
  private _changed = new Signal<this, void>(this);
  private _notice = new Signal<this, INotice>(this);
}

/** Keep `model` live from `client`'s event stream until `signal` aborts: the stream's
 * snapshot, then its events, with no other call to the broker. */
export function follow(
  model: GpuModel,
  client: BrokerClient,
  signal: AbortSignal
): Promise<void> {
  return client.follow(
    e => model.apply(e),
    signal,
    (connected, why) => {
      model.connected = connected;
      model.away = connected ? null : (why ?? null);
    }
  );
}
