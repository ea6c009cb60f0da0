import { GpuModel, INotice } from '../model';
import { IOverview } from '../types';
import { entry, lease, overview, queued } from './fixtures';

function modelWith(o: IOverview): { model: GpuModel; fetches: () => number } {
  let n = 0;
  const model = new GpuModel(async () => {
    n += 1;
    return o;
  });
  model.setOverview(JSON.parse(JSON.stringify(o)));
  return { model, fetches: () => n };
}

describe('GpuModel', () => {
  it('moves my queue position in place on a positions event, without a fetch', () => {
    const r = queued('r1', 3);
    const { model, fetches } = modelWith(
      overview({ requests: [r], queue: [entry(r)], length: 3 })
    );
    model.apply({
      v: 1,
      id: 2,
      type: 'positions',
      at: r.submitted_at,
      data: { queue_length: 2, requests: [{ ...r, position: 2 }], ahead: {} }
    });
    expect(model.waiting[0].position).toBe(2);
    expect(model.overview?.queue[0].position).toBe(2);
    expect(model.overview?.length).toBe(2);
    expect(fetches()).toBe(0);
  });

  it('replaces the picture with a snapshot after a resume the broker cannot replay', () => {
    const { model } = modelWith(overview());
    const fresh = overview({ leases: [] });
    model.apply({ v: 1, id: 9, type: 'snapshot', at: '', data: fresh });
    expect(model.leases).toEqual([]);
  });

  it('notifies my grant, warning and reclaim, and fetches once for a burst of events', async () => {
    const { model, fetches } = modelWith(overview());
    const notices: INotice[] = [];
    model.notice.connect((_, n) => notices.push(n));
    const about = { user: 'ann', request_id: 'r-of-l-00', lease_id: 'l-00' };
    model.apply({
      v: 1,
      id: 3,
      type: 'granted',
      at: '',
      data: { ...about, devices: ['MIG-0-0'], waited_s: 1 }
    });
    model.apply({
      v: 1,
      id: 4,
      type: 'warning',
      at: '',
      data: {
        ...about,
        reason: 'idle for 1 h',
        deadline: '2026-12-01T10:08:00Z'
      }
    });
    model.apply({
      v: 1,
      id: 5,
      type: 'released',
      at: '',
      data: { user: 'bob', request_id: 'x', lease_id: 'y' }
    });
    expect(notices.map(n => n.kind)).toEqual(['granted', 'warning']);
    expect(notices[0].message).toBe('GPU granted: GPU 0 / 1g.10gb@0');
    expect(notices[1].deadline).toBe('2026-12-01T10:08:00Z');
    expect(model.leases[0].reclaim_at).toBe('2026-12-01T10:08:00Z');
    await model.refresh();
    expect(fetches()).toBe(2); // the one in flight, and one after it for the rest
  });

  it('tells me, and only me, that my process uses a GPU outside the broker', () => {
    const { model } = modelWith(overview());
    const notices: INotice[] = [];
    model.notice.connect((_, n) => notices.push(n));
    const message =
      'GPU 1 is not granted to you, yet your process 4242 uses it.';
    const about = {
      request_id: null,
      lease_id: null,
      device: 'GPU-1',
      label: 'GPU 1',
      pid: 4242,
      message
    };
    model.apply({
      v: 1,
      id: 3,
      type: 'outside_use',
      at: '',
      data: { user: 'ann', ...about }
    });
    model.apply({
      v: 1,
      id: 4,
      type: 'outside_use',
      at: '',
      data: { user: 'bob' }
    });
    expect(notices.map(n => [n.kind, n.message])).toEqual([
      ['outside', message]
    ]);
  });

  it("ignores other users' grants for notifications", () => {
    const { model } = modelWith(overview());
    const notices: INotice[] = [];
    model.notice.connect((_, n) => notices.push(n));
    model.apply({
      v: 1,
      id: 3,
      type: 'granted',
      at: '',
      data: {
        user: 'bob',
        request_id: 'r',
        lease_id: 'l',
        devices: ['x'],
        waited_s: 0
      }
    });
    expect(notices).toEqual([]);
  });

  it("counts only my own requests as waiting, though an admin sees everyone's", () => {
    const mine = queued('r-mine', 2);
    const { model } = modelWith(
      overview({ requests: [queued('r-bob', 1, { user: 'bob' }), mine] })
    );
    expect(model.waiting.map(r => r.id)).toEqual(['r-mine']);
  });

  it('matches starting GPU notebooks to my waiting requests no running kernel owns', () => {
    const running = queued('r0', 1);
    const a = queued('ra', 2, { submitted_at: '2026-12-01T09:50:00Z' });
    const b = queued('rb', 3, {
      submitted_at: '2026-12-01T09:55:00Z',
      profile: '3g.40gb'
    });
    const { model } = modelWith(overview({ requests: [running, b, a] }));
    model.setKernels(new Map([[running.owner, { path: 'busy.ipynb' }]]));
    const matched = model.waitingNotebooks([
      { path: 'big.ipynb', size: '3g.40gb' },
      { path: 'small.ipynb', size: '1g.10gb' }
    ]);
    expect(matched.map(m => [m.path, m.request.id])).toEqual([
      ['big.ipynb', 'rb'],
      ['small.ipynb', 'ra']
    ]);
  });

  it("takes a lease's utilization from its device and keeps a history for sparklines", () => {
    const { model } = modelWith(overview());
    model.setOverview(overview());
    expect(model.utilization(lease('l-00', 'MIG-0-0'))).toBe(73);
    expect(model.history('MIG-0-0')).toEqual([73, 73]);
  });
});
