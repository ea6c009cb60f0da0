/** What the panel and the status bar show, kept from one overview call and the event
 * stream: positions move in place from `hello`/`positions` messages, a `snapshot`
 * replaces the picture, and any other event asks for one fresh overview (coalesced: at
 * most one call in flight, one more queued behind it). Also the notifications due to the
 * user (grant, reclaim warning, reclaim) and each device's recent utilization. */

import { ISignal, Signal } from '@lumino/signaling';

import { sizeText } from './format';
import {
  IEnvelope,
  IGpu,
  ILease,
  IOverview,
  IPositions,
  IQueueEntry,
  IRequest
} from './types';

export interface INotice {
  kind: 'granted' | 'warning' | 'reclaimed' | 'outside';
  leaseId: string;
  requestId: string | null;
  message: string;
  deadline: string | null;
}

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
  constructor(
    readonly fetchOverview: () => Promise<IOverview>,
    readonly historyLength = 60
  ) {}

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

  /** The highest utilization over a lease's devices. */
  utilization(lease: ILease): number | null {
    const values = lease.devices
      .map(u => this.device(u)?.utilization ?? null)
      .filter((v): v is number => v !== null);
    return values.length ? Math.max(...values) : null;
  }

  /** Starting GPU notebooks matched to my waiting requests that no running kernel owns:
   * a kernel that waits in the queue is not running yet, so the Lab does not know its id;
   * each starting notebook (in the order they started) takes the oldest such request of
   * its size. */
  waitingNotebooks(
    starting: Array<{ path: string; size: string | null }>
  ): IWaitingNotebook[] {
    const free = this.waiting
      .filter(r => !this._kernels.has(r.owner))
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

  /** Fetch the whole picture now (or right after the call in flight). */
  async refresh(): Promise<void> {
    if (this._inFlight) {
      this._again = true;
      return this._inFlight;
    }
    this._inFlight = (async () => {
      try {
        do {
          this._again = false;
          this.setOverview(await this.fetchOverview());
        } while (this._again);
      } finally {
        this._inFlight = null;
      }
    })();
    return this._inFlight;
  }

  setOverview(overview: IOverview): void {
    this._overview = overview;
    for (const gpu of overview.gpus) {
      for (const d of gpu.devices) {
        this._sample(d.uuid, d.utilization_gpu);
      }
      this._sample(gpu.uuid, gpu.utilization_gpu);
    }
    this._changed.emit();
  }

  /** One message of the event stream. */
  apply(e: IEnvelope): void {
    const o = this._overview;
    switch (e.type) {
      case 'snapshot':
        this.setOverview(e.data as IOverview);
        return;
      case 'hello':
      case 'positions':
        if (o) {
          this._positions(o, e.data as IPositions);
          this._changed.emit();
        } else {
          void this.refresh();
        }
        return;
    }
    const me = o?.me.user;
    const d = e.data ?? {};
    if (me !== undefined && d.user === me && e.type === 'outside_use') {
      this._notify('outside', d, d.message, d.deadline ?? null);
    }
    if (me !== undefined && d.user === me && d.lease_id) {
      if (e.type === 'granted') {
        const labels = (d.devices ?? []).map((u: string) => this.label(u));
        this._notify('granted', d, `GPU granted: ${labels.join(', ')}`, null);
      } else if (e.type === 'warning') {
        this._notify('warning', d, d.reason ?? 'idle', d.deadline ?? null);
      } else if (e.type === 'reclaimed') {
        this._notify('reclaimed', d, d.reason ?? 'reclaimed', null);
      }
      const lease = o?.leases.find(l => l.id === d.lease_id);
      if (lease && (e.type === 'warning' || e.type === 'warning_cleared')) {
        lease.reclaim_at = e.type === 'warning' ? d.deadline : null;
        this._changed.emit();
      }
    }
    void this.refresh();
  }

  private _positions(o: IOverview, p: IPositions): void {
    const moved = new Map(p.requests.map(r => [r.id, r]));
    o.requests = o.requests.map(r => moved.get(r.id) ?? r);
    for (const r of p.requests) {
      if (!o.requests.some(x => x.id === r.id)) {
        o.requests.push(r);
      }
    }
    o.queue = o.queue.map((q: IQueueEntry) => {
      const r = q.id ? moved.get(q.id) : undefined;
      return r
        ? {
            ...q,
            position: r.position ?? q.position,
            eta: r.eta,
            eta_known: r.eta_known
          }
        : q;
    });
    o.length = p.queue_length;
  }

  private _notify(
    kind: INotice['kind'],
    d: any,
    message: string,
    deadline: string | null
  ): void {
    this._notice.emit({
      kind,
      leaseId: d.lease_id,
      requestId: d.request_id ?? null,
      message,
      deadline
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
  private _inFlight: Promise<void> | null = null;
  private _again = false;
  private _changed = new Signal<this, void>(this);
  private _notice = new Signal<this, INotice>(this);
}
