import { leaseSize } from '../format';
import { GpuModel } from '../model';
import { renderPanel, sliceBar, sparkline } from '../render';
import {
  entry,
  h100,
  iso,
  lease,
  NOW,
  overview,
  QUEUED_ETA,
  queued
} from './fixtures';

const SHOW = { devices: true, queue: true, leases: true, sparklines: true };
const NONE = {
  cancel: () => undefined,
  release: () => undefined,
  extend: () => undefined
};

function draw(o = overview()) {
  const model = new GpuModel();
  model.setOverview(o);
  model.connected = true;
  const calls: string[] = [];
  const actions = {
    cancel: (id: string) => calls.push(`cancel ${id}`),
    release: (id: string) => calls.push(`release ${id}`),
    extend: (id: string) => calls.push(`extend ${id}`)
  };
  return { node: renderPanel(model, SHOW, NOW, actions), calls, model };
}

describe('sliceBar', () => {
  it("draws each MIG slice at its memory slices: mine, another user's, free", () => {
    const bar = sliceBar(
      h100(0, ['ann', 'bob', null, null, null, null, null]),
      'ann'
    );
    const segments = Array.from(bar.children) as HTMLElement[];
    expect(segments).toHaveLength(7);
    expect(segments.map(s => s.className.split(' ')[1])).toEqual([
      'jp-mod-mine',
      'jp-mod-taken',
      ...Array(5).fill('jp-mod-free')
    ]);
    expect(segments[1].textContent).toBe('bob');
    expect(segments[3].style.gridColumn).toBe('4 / span 1');
    expect(bar.style.gridTemplateColumns).toBe('repeat(8, 1fr)');
  });

  it('shows who holds a slice only as the broker lets the viewer see', () => {
    const gpu = h100(0, ['ann', null]);
    gpu.devices[1].holder = { user: '' };
    const second = sliceBar(gpu, 'ann').children[1] as HTMLElement;
    expect(second.textContent).toBe('in use');
  });
});

describe('a shared GPU', () => {
  const sharing = {
    mode: 'shared',
    shares_now: true,
    room_mib: 5108,
    mechanism: 'watched',
    enforced: false,
    text: 'shares not enforced: a kernel that goes over is stopped',
    shares: [
      {
        user: 'ann',
        lease_id: 'l-00',
        memory_mib: 20480,
        used_mib: 3072,
        utilization: 10
      },
      {
        user: 'bob',
        lease_id: null,
        memory_mib: 20480,
        used_mib: 9000,
        utilization: 60
      }
    ]
  };

  it('draws each share as wide as its memory, and says what holds them', () => {
    const gpu = h100(0, [], { mig_enabled: false, memory_mib: 46068, sharing });
    const segments = Array.from(sliceBar(gpu, 'ann').children) as HTMLElement[];
    expect(segments.map(x => x.textContent)).toEqual(['mine', 'bob', 'free']);
    expect(sliceBar(gpu, 'ann').style.gridTemplateColumns).toBe(
      '44fr 44fr 11fr'
    );
    expect(segments.map(x => x.title)).toEqual([
      'mine: 21.4 GB · 10%',
      'bob: 21.4 GB · 60%',
      'free: 5.3 GB'
    ]);
    const { node } = draw(overview({ gpus: [gpu], leases: [] }));
    expect(node.textContent).toContain(
      'shared · shares not enforced: a kernel that goes over is stopped'
    );
  });

  it("shows my share with what holds it and what it uses, its own load not its GPU's", () => {
    const share = {
      memory_mib: 7630,
      used_mib: 3072,
      utilization: 10,
      gpu: 'GPU 0',
      mechanism: 'mps',
      enforced: true,
      text: '8.0 GB of GPU 0, enforced by MPS'
    };
    const gpu = h100(0, [], {
      mig_enabled: false,
      memory_mib: 46068,
      utilization_gpu: 70, // both shares' together
      sharing
    });
    const o = overview({
      gpus: [gpu],
      leases: [lease('l-00', 'GPU-0', { profile: 'share', share })]
    });
    const box = draw(o).node.querySelector(
      '.jp-GpuBroker-lease'
    ) as HTMLElement;
    expect(box.textContent).toContain('8.0 GB of GPU 0, enforced by MPS');
    expect(box.textContent).toContain('held 30 min · using 3.2 GB · util 10%');
    expect(box.querySelector('.jp-GpuBroker-spark')).toBeNull(); // the GPU's, not its own
    const unknown = overview({
      gpus: [gpu],
      leases: [
        lease('l-00', 'GPU-0', {
          profile: 'share',
          share: { ...share, utilization: null }
        })
      ]
    });
    const none = draw(unknown).node.querySelector('.jp-GpuBroker-lease');
    expect(none?.textContent).toContain('using 3.2 GB · util n/a');
  });
});

describe('renderPanel', () => {
  it('says which device is used outside the broker, by whom, and for how long', () => {
    const gpu = h100(1, Array(7).fill(null));
    gpu.devices[2].outside = [
      { user: 'bob', pid: 4242, since: iso(-12 * 60), text: '' }
    ];
    const { node } = draw(overview({ gpus: [gpu] }));
    expect(node.querySelector('.jp-mod-outside')?.textContent).toBe(
      'GPU 1 / 1g.10gb@2: in use outside the broker by bob, pid 4242, for 12 min'
    );
  });

  it('counts the GPUs, slices and free ones, and says why a GPU is drained', () => {
    const drained = h100(1, Array(7).fill(null), {
      drained: {
        reason: 'Xid 79: fell off the bus',
        since: '2026-12-01T09:00:00Z'
      }
    });
    const { node } = draw(
      overview({
        gpus: [h100(0, ['ann', 'bob', null, null, null, null, null]), drained]
      })
    );
    expect(node.textContent).toContain('GPUs (2 GPUs, 14 MIG slices, 12 free)');
    expect(node.textContent).toContain('GPU 1 · H100-80GBdrained7 × 1g.10gb');
    expect(
      node
        .querySelector('.jp-GpuBroker-badge.jp-mod-drained')
        ?.getAttribute('title')
    ).toBe('Xid 79: fell off the bus');
    expect(node.textContent).toContain('drained: Xid 79: fell off the bus');
  });

  it('highlights my queued request and cancels only mine', () => {
    const mine = queued('r-mine', 2);
    const theirs = { ...entry(queued('r-bob', 1, { user: 'bob' }), false) };
    const { node, calls } = draw(
      overview({ queue: [theirs, entry(mine)], requests: [mine], length: 2 })
    );
    const rows = Array.from(
      node.querySelectorAll('.jp-GpuBroker-queue tbody tr')
    );
    expect(rows.map(r => r.className)).toEqual(['', 'jp-GpuBroker-mine']);
    expect(rows[1].textContent).toContain(
      `2ann1g.10gbinteractive${QUEUED_ETA}waiting 5 min`
    );
    expect(rows[1].querySelector('.jp-GpuBroker-class')?.textContent).toBe(
      'interactive'
    );
    expect(rows[0].querySelector('button')).toBeNull();
    (rows[1].querySelector('button') as HTMLButtonElement).click();
    expect(calls).toEqual(['cancel r-mine']);
  });

  it('says once under the queue what its ETAs rest on, when not past holds', () => {
    const mine = queued('r-mine', 1, { eta_basis: 'typical hold' });
    const { node } = draw(
      overview({
        queue: [{ ...entry(mine), eta_basis: 'typical hold' }],
        requests: [mine],
        length: 1
      })
    );
    const row = node.querySelector('.jp-GpuBroker-queue tbody tr');
    expect(row?.textContent).toContain(QUEUED_ETA);
    expect(row?.textContent).not.toContain('usual');
    expect(node.querySelector('.jp-GpuBroker-basis')?.textContent).toBe(
      'ETAs from the usual session length'
    );
    const known = draw(overview({ queue: [entry(queued('r', 1))], length: 1 }));
    expect(known.node.querySelector('.jp-GpuBroker-basis')).toBeNull();
  });

  it('shows my lease with its notebook, held time, reclaim deadline and Release', () => {
    const o = overview();
    o.leases[0].reclaim_at = new Date(NOW + 8 * 60_000).toISOString();
    o.leases[0].idle_s = 3600;
    o.requests = [
      {
        ...queued('r-of-l-00', 0),
        state: 'granted',
        holder: 'k-1',
        position: null
      }
    ];
    const { node, calls, model } = draw(o);
    model.setKernels(new Map([['k-1', { path: 'train.ipynb' }]]));
    const again = renderPanel(model, SHOW, NOW, {
      ...NONE,
      release: id => calls.push(id)
    });
    const box = again.querySelector('.jp-GpuBroker-lease') as HTMLElement;
    expect(box.classList).toContain('jp-mod-warned');
    expect(box.textContent).toContain('train.ipynb');
    expect(box.textContent).toContain('1g.10gb · GPU 0 / 1g.10gb@0');
    const whole = leaseSize({ profile: 'gpu', devices: ['GPU-1'] });
    expect(whole).toBe('1 GPU'); // a whole GPU's card: "1 GPU · GPU 1", not "gpu · GPU 1"
    expect(box.textContent).toContain(
      'held 30 min · util 73% · idle 1 h 00 min · reclaim in 8 min'
    );
    (box.querySelector('button') as HTMLButtonElement).click();
    expect(calls).toEqual(['l-00']);
    expect(node.textContent).toContain('kernel k-1');
  });

  it("shows when my lease's time limit ends, and Extend while it is warned for it", () => {
    const ends = new Date(2026, 11, 1, 14, 30).toISOString();
    const limited = lease('l-00', 'MIG-0-0', { limit_s: 7200, ends_at: ends });
    const facts = (node: HTMLElement) =>
      node.querySelector('.jp-GpuBroker-leaseFacts')?.textContent;
    const buttons = (node: HTMLElement) =>
      Array.from(node.querySelectorAll('.jp-GpuBroker-lease button')).map(
        b => b.textContent
      );
    const plain = draw(overview({ leases: [limited] })).node;
    expect(facts(plain)).toBe('held 30 min · util 73% · until 14:30');
    expect(buttons(plain)).toEqual(['Release']);
    const idle = { ...limited, reclaim_at: iso(480), reclaim_cause: 'idle' };
    expect(buttons(draw(overview({ leases: [idle] })).node)).toEqual([
      'Release'
    ]);
    const warned = { ...idle, reclaim_cause: 'time_limit' };
    const { node, calls } = draw(overview({ leases: [warned] }));
    expect(facts(node)).toBe(
      'held 30 min · util 73% · until 14:30 · reclaim in 8 min'
    );
    expect(buttons(node)).toEqual(['Extend 1 hour', 'Release']);
    (node.querySelector('.jp-GpuBroker-extend') as HTMLButtonElement).click();
    expect(calls).toEqual(['extend l-00']);
  });

  it('shows my suspended kernel under My GPUs from its reclaim until it is resumed', () => {
    const { model } = draw();
    model.setKernels(new Map([['k-1', { path: 'train.ipynb' }]]));
    const text =
      'suspended, its 4.2 GB of GPU memory on the host: its next cell resumes it';
    const suspended = { kernel_id: 'k-1', host_mib: 4096, text };
    const ended = (type: string, id: number, more: object) => ({
      v: 1,
      id,
      type,
      at: '',
      data: {
        user: 'ann',
        request_id: 'r-of-l-00',
        lease_id: 'l-00',
        reason: 'idle for 25 min; suspended',
        request: {
          ...queued('r-of-l-00', 0),
          state: 'reclaimed',
          lease: lease('l-00', 'MIG-0-0', { state: 'reclaimed', ...more })
        }
      }
    });
    const panel = () => renderPanel(model, SHOW, NOW, NONE);
    model.apply(ended('reclaimed', 5, { suspended }));
    const box = panel().querySelector('.jp-mod-suspended') as HTMLElement;
    expect(box.textContent).toBe(
      'train.ipynbSuspended, its 4.2 GB of GPU memory on the host: its next cell resumes it'
    );
    expect(box.title).toBe('It held GPU 0 / 1g.10gb@0');
    expect(box.querySelector('button')).toBeNull(); // nothing to release
    expect(panel().textContent).toContain('My GPUs (0)No GPU held.train.ipynb');
    model.apply(ended('suspension_ended', 6, { suspended: null }));
    expect(panel().querySelector('.jp-mod-suspended')).toBeNull();
  });

  it('shows a suspended kernel from the overview it connects with', () => {
    const text = 'suspended, nothing on the GPU: its next cell resumes it';
    const { node } = draw(
      overview({
        leases: [],
        suspended: [
          lease('l-07', 'MIG-0-0', {
            state: 'reclaimed',
            suspended: { kernel_id: 'k-2', host_mib: 0, text }
          })
        ]
      })
    );
    expect(node.querySelector('.jp-mod-suspended')?.textContent).toBe(
      'kernel k-2Suspended, nothing on the GPU: its next cell resumes it'
    );
  });

  it('says it is reconnecting while the event stream is down', () => {
    const { model } = draw();
    model.connected = false;
    const node = renderPanel(model, SHOW, NOW, NONE);
    expect(node.textContent).toContain('Reconnecting to the GPU broker');
  });

  it('says why the broker is away, in its own words when it gave them, before and after a first picture', () => {
    const why =
      'The GPU broker could not start: its state file is held by pid 7.';
    const fresh = new GpuModel();
    fresh.away = why;
    expect(renderPanel(fresh, SHOW, NOW, NONE).textContent).toBe(why);
    const { model } = draw();
    model.away = why;
    expect(renderPanel(model, SHOW, NOW, NONE).textContent).toContain(why);
  });
});

describe('sparkline', () => {
  it('breaks the line where nothing was reported', () => {
    const svg = sparkline([0, 100, null, 50, 50], 40, 12);
    const lines = Array.from(svg.querySelectorAll('polyline')).map(l =>
      l.getAttribute('points')
    );
    expect(lines).toEqual(['0.0,11.0 10.0,1.0', '30.0,6.0 40.0,6.0']);
  });
});
