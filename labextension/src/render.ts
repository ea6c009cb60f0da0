/** The panel's DOM, drawn from the model: devices with their MIG slices as a bar of
 * memory slices, the queue, my leases. Pure functions of their inputs (the time
 * included), so the tests draw them without a Lab. Each thing that persists (a lease, a
 * queue row, a GPU) carries its key in `data-key`, by which the panel updates it in
 * place (panel.ts). */

import {
  duration,
  etaBasis,
  etaText,
  mib,
  outsideText,
  extendCaption,
  extendLabel,
  holderText,
  leaseSize,
  limitWarned,
  percent,
  since,
  sizeText,
  untilText
} from './format';
import { trans } from './i18n';
import { GpuModel } from './model';
import { IDevice, IGpu, ILease, IQueueEntry, ISharing } from './types';

export interface IShow {
  devices: boolean;
  queue: boolean;
  leases: boolean;
  sparklines: boolean;
}

export interface IActions {
  cancel(requestId: string): void;
  release(leaseId: string): void;
  /** An hour more on a lease's time limit (`EXTEND_S`, format.ts). */
  extend(leaseId: string): void;
}

const MEMORY_SLICES = 8;

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  e.className = className;
  if (text !== undefined) {
    e.textContent = text;
  }
  return e;
}

/** A small SVG polyline of recent utilization (0-100 %); gaps where nothing was reported. */
export function sparkline(
  values: Array<number | null>,
  width = 60,
  height = 14
): SVGSVGElement {
  const ns = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(ns, 'svg');
  svg.setAttribute('class', 'jp-GpuBroker-spark');
  svg.setAttribute('width', String(width));
  svg.setAttribute('height', String(height));
  svg.setAttribute('viewBox', `0 0 ${width} ${height}`);
  const step = values.length > 1 ? width / (values.length - 1) : width;
  let points: string[] = [];
  const flush = () => {
    if (points.length) {
      const line = document.createElementNS(ns, 'polyline');
      line.setAttribute('points', points.join(' '));
      svg.appendChild(line);
    }
    points = [];
  };
  values.forEach((v, i) => {
    if (v === null) {
      flush();
      return;
    }
    const y = height - 1 - (Math.min(100, Math.max(0, v)) / 100) * (height - 2);
    points.push(`${(i * step).toFixed(1)},${y.toFixed(1)}`);
  });
  flush();
  return svg;
}

/** Who holds a device: free, mine, or another's (by name). */
function deviceHolder(d: IDevice, me: string): 'free' | 'mine' | 'taken' {
  return !d.holder ? 'free' : d.holder.user === me ? 'mine' : 'taken';
}

function holderWords(d: IDevice, me: string): string {
  const who = deviceHolder(d, me);
  return who === 'free'
    ? trans.__('free')
    : who === 'mine'
      ? trans.__('mine')
      : d.holder?.user || trans.__('in use');
}

/** A GPU's memory slices as a bar: each MIG slice spans its memory slices from its start,
 * marked free, mine or another's, drained ones struck; a whole GPU is one segment. */
export function sliceBar(gpu: IGpu, me: string): HTMLElement {
  if (gpu.sharing && gpu.sharing.mechanism !== 'none') {
    return shareBar(gpu, gpu.sharing, me);
  }
  const bar = el('div', 'jp-GpuBroker-bar');
  const slices = gpu.mig_enabled
    ? gpu.devices
    : gpu.devices.filter(d => d.kind === 'gpu');
  const total = gpu.mig_enabled ? MEMORY_SLICES : 1;
  for (const d of slices) {
    const span = gpu.mig_enabled
      ? Math.max(1, Math.round((d.memory_mib / gpu.memory_mib) * 8))
      : 1;
    const seg = el('div', 'jp-GpuBroker-slice');
    seg.classList.add(`jp-mod-${deviceHolder(d, me)}`);
    const who = holderWords(d, me);
    if (d.drained) {
      seg.classList.add('jp-mod-drained');
    }
    const start = gpu.mig_enabled ? (d.start ?? 0) : 0;
    seg.style.gridColumn = `${start + 1} / span ${span}`;
    seg.dataset.uuid = d.uuid;
    seg.textContent = who;
    const util =
      d.utilization_gpu === null ? '' : ` · ${percent(d.utilization_gpu)}`;
    const drained = d.drained
      ? trans.__(' · drained: %1', d.drained.reason)
      : '';
    seg.title = `${d.label}: ${who}${util}${drained}`;
    bar.appendChild(seg);
  }
  bar.style.gridTemplateColumns = `repeat(${total}, 1fr)`;
  return bar;
}

/** A shared GPU's memory as a bar: each share as wide as its memory, mine or another's,
 * and the room no share holds. */
function shareBar(gpu: IGpu, sharing: ISharing, me: string): HTMLElement {
  const bar = el('div', 'jp-GpuBroker-bar');
  const parts = sharing.shares.map(x => ({
    mib: x.memory_mib,
    who: x.user === me ? 'mine' : 'taken',
    words: x.user === me ? trans.__('mine') : x.user,
    util: x.utilization ?? null
  }));
  if (sharing.room_mib > 0) {
    parts.push({
      mib: sharing.room_mib,
      who: 'free',
      words: trans.__('free'),
      util: null
    });
  }
  for (const part of parts) {
    const seg = el('div', `jp-GpuBroker-slice jp-mod-${part.who}`, part.words);
    const util = part.util === null ? '' : ` · ${percent(part.util)}`;
    seg.title = `${part.words}: ${mib(part.mib)}${util}`;
    bar.appendChild(seg);
  }
  bar.style.gridTemplateColumns = parts
    .map(
      part => `${Math.max(1, Math.round((part.mib / gpu.memory_mib) * 100))}fr`
    )
    .join(' ');
  return bar;
}

/** What a GPU is cut into: "7 × 1g.10gb", "2 × 1g.20gb, 1 × 3g.40gb", "whole", or how
 * it is shared ("shared · shares enforced by MPS"). */
export function profilesText(gpu: IGpu): string {
  const sharing = gpu.sharing;
  if (sharing && sharing.mechanism !== 'none' && sharing.mode !== 'whole') {
    return trans.__(
      '%1 · %2',
      sharing.mode === 'both'
        ? trans.__('whole or shared')
        : trans.__('shared'),
      sharing.text
    );
  }
  if (!gpu.mig_enabled) {
    return trans.__('whole GPU');
  }
  const counts = new Map<string, number>();
  for (const d of gpu.devices) {
    counts.set(d.profile ?? '?', (counts.get(d.profile ?? '?') ?? 0) + 1);
  }
  return Array.from(counts, ([p, n]) => trans.__('%1 × %2', n, p)).join(', ');
}

function healthBadge(gpu: IGpu): HTMLElement {
  if (gpu.drained) {
    const b = el(
      'span',
      'jp-GpuBroker-badge jp-mod-drained',
      trans.__('drained')
    );
    b.title = gpu.drained.reason;
    return b;
  }
  return el(
    'span',
    `jp-GpuBroker-badge jp-mod-${gpu.health}`,
    healthWords(gpu.health)
  );
}

/** A GPU's health (the API's `Reading.health`), in words. */
function healthWords(health: string): string {
  switch (health) {
    case 'ok':
      return trans.__('ok');
    case 'lost':
      return trans.__('lost');
    case 'unreachable':
      return trans.__('unreachable');
  }
  return health;
}

export function renderGpu(
  gpu: IGpu,
  model: GpuModel,
  show: IShow,
  now = Date.now()
): HTMLElement {
  const me = model.overview?.me.user ?? '';
  const row = el('div', 'jp-GpuBroker-gpu');
  row.dataset.key = gpu.uuid;
  const head = el('div', 'jp-GpuBroker-gpuHead');
  head.appendChild(
    el(
      'span',
      'jp-GpuBroker-gpuName',
      trans.__('GPU %1 · %2', gpu.index, gpu.model)
    )
  );
  head.appendChild(healthBadge(gpu));
  row.appendChild(head);
  row.appendChild(el('div', 'jp-GpuBroker-profiles', profilesText(gpu)));
  row.appendChild(sliceBar(gpu, me));
  const readings = el('div', 'jp-GpuBroker-readings');
  const used = gpu.devices.some(d => d.utilization_gpu !== null)
    ? Math.max(...gpu.devices.map(d => d.utilization_gpu ?? 0))
    : gpu.utilization_gpu;
  readings.textContent = trans.__(
    'util %1 · mem %2 / %3 · %4',
    percent(used),
    mib(gpu.memory_used_mib),
    mib(gpu.memory_mib),
    gpu.temperature_c === null
      ? trans.__('n/a')
      : trans.__('%1 °C', gpu.temperature_c)
  );
  if (show.sparklines) {
    readings.appendChild(sparkline(model.history(gpu.uuid)));
  }
  row.appendChild(readings);
  if (gpu.drained) {
    row.appendChild(
      el('div', 'jp-GpuBroker-why', trans.__('drained: %1', gpu.drained.reason))
    );
  }
  for (const d of gpu.devices) {
    for (const o of d.outside ?? []) {
      row.appendChild(
        el(
          'div',
          'jp-GpuBroker-why jp-mod-outside',
          outsideText(d.label, o, now)
        )
      );
    }
  }
  return row;
}

export function renderQueue(
  queue: IQueueEntry[],
  now: number,
  actions: IActions
): HTMLElement {
  const table = el('table', 'jp-GpuBroker-queue');
  const head = table.createTHead().insertRow();
  // five columns that fit the sidebar's default width with their words whole: how long
  // a request has waited goes under its ETA, as its class under its size
  const heads = [
    trans.__('#'),
    trans.__('user'),
    trans.__('size, class'),
    trans.__('ETA'),
    ''
  ];
  for (const h of heads) {
    head.appendChild(el('th', '', h));
  }
  const body = table.createTBody();
  for (const q of queue) {
    const tr = body.insertRow();
    tr.className = q.mine ? 'jp-GpuBroker-mine' : '';
    // others' entries come without ids: their user and submission tell them apart
    tr.dataset.key = q.id ?? `${q.user} ${q.submitted_at}`;
    tr.appendChild(el('td', '', String(q.position)));
    tr.appendChild(el('td', '', q.user));
    const size = el('td', '', sizeText(q));
    size.appendChild(el('div', 'jp-GpuBroker-class', q.job_class));
    tr.appendChild(size);
    const eta = el('td', '', etaText(q, now, false));
    eta.appendChild(
      el(
        'div',
        'jp-GpuBroker-class',
        trans.__('waiting %1', duration(since(q.submitted_at, now)))
      )
    );
    tr.appendChild(eta);
    const td = el('td', '');
    if (q.mine && q.id) {
      const id = q.id;
      const b = el(
        'button',
        'jp-GpuBroker-cancel jp-mod-styled',
        trans.__('Cancel')
      );
      b.title = trans.__('Withdraw request %1', id);
      b.onclick = () => actions.cancel(id);
      td.appendChild(b);
    }
    tr.appendChild(td);
  }
  if (!queue.length) {
    const tr = body.insertRow();
    const td = el(
      'td',
      'jp-GpuBroker-empty',
      trans.__('The GPU queue is empty.')
    );
    td.colSpan = 5;
    tr.appendChild(td);
  }
  // What the ETAs rest on, said once under them (a column of it would not fit).
  const bases = [...new Set(queue.map(etaBasis).filter(b => b !== undefined))];
  if (bases.length) {
    const td = el(
      'td',
      'jp-GpuBroker-basis',
      trans.__('ETAs %1', bases.join('; '))
    );
    td.colSpan = 5;
    table.createTFoot().insertRow().appendChild(td);
  }
  return table;
}

export function renderLease(
  lease: ILease,
  model: GpuModel,
  now: number,
  show: IShow,
  actions: IActions
): HTMLElement {
  const box = el('div', 'jp-GpuBroker-lease');
  box.dataset.key = lease.id;
  if (lease.reclaim_at) {
    box.classList.add('jp-mod-warned');
  }
  const holder = model.overview?.requests.find(
    r => r.id === lease.request_id
  )?.holder;
  const where = model.kernelPath(holder) ?? holderText(holder);
  const head = el('div', 'jp-GpuBroker-leaseHead');
  head.appendChild(el('span', 'jp-GpuBroker-leaseWhere', where));
  if (limitWarned(lease)) {
    const x = el('button', 'jp-GpuBroker-extend jp-mod-styled', extendLabel());
    x.title = extendCaption();
    x.onclick = () => actions.extend(lease.id);
    head.appendChild(x);
  }
  const b = el(
    'button',
    'jp-GpuBroker-release jp-mod-styled',
    trans.__('Release')
  );
  b.title = trans.__('Give %1 back', lease.devices.join(', '));
  b.onclick = () => actions.release(lease.id);
  head.appendChild(b);
  box.appendChild(head);
  const labels = lease.devices.map(u => model.label(u));
  const share = lease.share;
  box.appendChild(
    el(
      'div',
      share
        ? `jp-GpuBroker-leaseDevice ${share.enforced ? '' : 'jp-mod-watched'}`
        : 'jp-GpuBroker-leaseDevice',
      share ? share.text : `${leaseSize(lease)} · ${labels.join(', ')}`
    )
  );
  const facts = [
    trans.__('held %1', duration(since(lease.granted_at, now))),
    ...(share && share.used_mib !== null
      ? [trans.__('using %1', mib(share.used_mib))]
      : []),
    trans.__('util %1', percent(model.utilization(lease)))
  ];
  const idle = model.idle(lease, now); // the broker's, counted on since it was read
  if (idle !== null) {
    facts.push(
      idle > 0 ? trans.__('idle %1', duration(idle)) : trans.__('in use')
    );
  }
  const until = untilText(lease);
  if (until) {
    facts.push(until);
  }
  if (lease.reclaim_at) {
    facts.push(
      trans.__('reclaim in %1', duration(-since(lease.reclaim_at, now)))
    );
  }
  const line = el('div', 'jp-GpuBroker-leaseFacts', facts.join(' · '));
  if (show.sparklines && !share) {
    // a share's GPU's history is all its shares' load: none of it is the share's own
    line.appendChild(sparkline(model.history(lease.devices[0])));
  }
  box.appendChild(line);
  return box;
}

/** A suspended kernel of mine: which notebook, and the broker's words for its state. */
export function renderSuspended(lease: ILease, model: GpuModel): HTMLElement {
  const box = el('div', 'jp-GpuBroker-lease jp-mod-suspended');
  box.dataset.key = lease.id;
  const kernel = lease.suspended?.kernel_id;
  const head = el('div', 'jp-GpuBroker-leaseHead');
  head.appendChild(
    el(
      'span',
      'jp-GpuBroker-leaseWhere',
      model.kernelPath(kernel) ?? holderText(kernel)
    )
  );
  box.appendChild(head);
  const text = lease.suspended?.text ?? '';
  box.appendChild(
    el(
      'div',
      'jp-GpuBroker-leaseFacts',
      text.charAt(0).toUpperCase() + text.slice(1)
    )
  );
  box.title = trans.__(
    'It held %1',
    lease.devices.map(u => model.label(u)).join(', ')
  );
  return box;
}

function section(key: string, title: string): HTMLElement {
  const s = el('section', 'jp-GpuBroker-section');
  s.dataset.key = key;
  s.appendChild(el('h3', 'jp-GpuBroker-title', title));
  return s;
}

/** The whole panel. */
export function renderPanel(
  model: GpuModel,
  show: IShow,
  now: number,
  actions: IActions
): HTMLElement {
  const root = el('div', 'jp-GpuBroker-content');
  const o = model.overview;
  if (!o) {
    root.appendChild(
      el(
        'div',
        'jp-GpuBroker-empty',
        model.away ?? trans.__('Connecting to the GPU broker…')
      )
    );
    return root;
  }
  if (!model.connected || model.away) {
    root.appendChild(
      el(
        'div',
        'jp-GpuBroker-offline',
        model.away ?? trans.__('Reconnecting to the GPU broker…')
      )
    );
  }
  if (show.leases) {
    const s = section('leases', trans.__('My GPUs (%1)', model.leases.length));
    for (const lease of model.leases) {
      s.appendChild(renderLease(lease, model, now, show, actions));
    }
    if (!model.leases.length) {
      s.appendChild(el('div', 'jp-GpuBroker-empty', trans.__('No GPU held.')));
    }
    for (const lease of model.suspended) {
      s.appendChild(renderSuspended(lease, model));
    }
    root.appendChild(s);
  }
  if (show.queue) {
    const s = section('queue', trans.__('Queue (%1)', o.length));
    s.appendChild(renderQueue(o.queue, now, actions));
    root.appendChild(s);
  }
  if (show.devices) {
    const slices = o.gpus.reduce(
      (n, g) => n + (g.mig_enabled ? g.devices.length : 0),
      0
    );
    const free = o.gpus.reduce(
      (n, g) =>
        n + g.devices.filter(d => !d.holder && !d.drained && !d.shares).length,
      0
    );
    const s = section(
      'gpus',
      trans.__(
        'GPUs (%1 GPUs, %2 MIG slices, %3 free)',
        o.gpus.length,
        slices,
        free
      )
    );
    for (const gpu of o.gpus) {
      s.appendChild(renderGpu(gpu, model, show, now));
    }
    root.appendChild(s);
  }
  return root;
}
