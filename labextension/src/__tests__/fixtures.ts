/** Overviews as the broker's API writes them (api/openapi.yaml), small enough to read. */

import {
  IDevice,
  IGpu,
  ILease,
  IOverview,
  IQueueEntry,
  IRequest
} from '../types';
import { clock } from '../format';

export const NOW = Date.parse('2026-12-01T10:00:00Z');

/** "10:12 (10:06-10:20)": the start `queued` estimates, by the local clock. */
export const QUEUED_ETA = `${clock(iso(720))} (${clock(iso(360))}-${clock(iso(1200))})`;

export function iso(secondsFromNow: number): string {
  return new Date(NOW + secondsFromNow * 1000).toISOString();
}

export function slice(
  gpu: number,
  start: number,
  holder: string | null,
  extra: Partial<IDevice> = {}
): IDevice {
  return {
    uuid: `MIG-${gpu}-${start}`,
    kind: 'mig',
    label: `GPU ${gpu} / 1g.10gb@${start}`,
    profile: '1g.10gb',
    start,
    memory_mib: 9984,
    holder: holder
      ? {
          user: holder,
          lease_id: `l-${gpu}${start}`,
          request_id: `r-${gpu}${start}`
        }
      : null,
    drained: null,
    health: 'ok',
    utilization_gpu: holder ? 73 : 0,
    memory_used_mib: 0,
    temperature_c: null,
    ...extra
  };
}

export function h100(
  index: number,
  holders: Array<string | null>,
  extra: Partial<IGpu> = {}
): IGpu {
  return {
    index,
    uuid: `GPU-${index}`,
    name: 'NVIDIA H100 80GB HBM3',
    model: 'H100-80GB',
    memory_mib: 81559,
    mig_enabled: true,
    drained: null,
    health: 'ok',
    utilization_gpu: null,
    memory_used_mib: 0,
    temperature_c: 32,
    devices: holders.map((h, i) => slice(index, i, h)),
    ...extra
  };
}

export function queued(
  id: string,
  position: number,
  extra: Partial<IRequest> = {}
): IRequest {
  return {
    id,
    user: 'ann',
    profile: '1g.10gb',
    job_class: 'interactive',
    holder: `kernel-${id}`,
    state: 'queued',
    submitted_at: iso(-300),
    lease_id: null,
    position,
    eta: iso(720),
    eta_range: { low: iso(360), high: iso(1200) },
    eta_known: true,
    ...extra
  };
}

export function entry(r: IRequest, mine = true): IQueueEntry {
  return {
    position: r.position ?? 0,
    eta: r.eta,
    eta_range: r.eta_range ?? null,
    eta_known: r.eta_known,
    user: r.user,
    job_class: r.job_class,
    profile: r.profile,
    submitted_at: r.submitted_at,
    mine,
    id: mine ? r.id : null,
    holder: mine ? r.holder : null
  };
}

export function lease(
  id: string,
  device: string,
  extra: Partial<ILease> = {}
): ILease {
  return {
    id,
    request_id: `r-of-${id}`,
    user: 'ann',
    devices: [device],
    granted_at: iso(-1800),
    expires_at: iso(60),
    state: 'active',
    profile: '1g.10gb',
    reclaim_at: null,
    ...extra
  };
}

export function overview(extra: Partial<IOverview> = {}): IOverview {
  return {
    me: { user: 'ann', admin: false, kernel_id: null },
    gpus: [h100(0, ['ann', 'bob', null, null, null, null, null])],
    queue: [],
    length: 0,
    requests: [],
    leases: [lease('l-00', 'MIG-0-0')],
    ...extra
  };
}
