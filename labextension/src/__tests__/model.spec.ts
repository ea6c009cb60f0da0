import { ServerConnection } from '@jupyterlab/services';

import { BrokerClient } from '../client';
import { follow, GpuModel, INotice } from '../model';
import { limitWarned } from '../format';
import { IEnvelope, ILease, IOverview } from '../types';
import { entry, h100, lease, overview, queued } from './fixtures';

function modelWith(o: IOverview): { model: GpuModel; fetches: () => number } {
  const model = new GpuModel();
  model.setOverview(JSON.parse(JSON.stringify(o)));
  return { model, fetches: () => 0 };
}

/** A model on `o`, with the notices it gives. */
function noticed(o: IOverview): { model: GpuModel; notices: INotice[] } {
  const { model } = modelWith(o);
  const notices: INotice[] = [];
  model.notice.connect((_, n) => notices.push(n));
  return { model, notices };
}

/** An event as the stream brings it. */
function event(id: number, type: string, data: any): IEnvelope {
  return { v: 1, id, type, at: '', data };
}

/** An event stream's response: its messages as the broker frames them, then its end. */
function stream(messages: IEnvelope[]): Response {
  const chunks = messages.map(m =>
    new TextEncoder().encode(`id: ${m.id}\ndata: ${JSON.stringify(m)}\n\n`)
  );
  return {
    ok: true,
    status: 200,
    body: {
      getReader: () => ({
        read: async () =>
          chunks.length
            ? { value: chunks.shift(), done: false }
            : { value: undefined, done: true }
      })
    }
  } as unknown as Response;
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
    model.apply(event(9, 'snapshot', fresh));
    expect(model.leases).toEqual([]);
  });

  it('notifies my grant, warning and reclaim', () => {
    const { model, notices } = noticed(overview());
    const about = { user: 'ann', request_id: 'r-of-l-00', lease_id: 'l-00' };
    model.apply(
      event(3, 'granted', { ...about, devices: ['MIG-0-0'], waited_s: 1 })
    );
    model.apply(
      event(4, 'warning', {
        ...about,
        reason: 'idle for 1 h',
        deadline: '2026-12-01T10:08:00Z'
      })
    );
    model.apply(
      event(5, 'released', { user: 'bob', request_id: 'x', lease_id: 'y' })
    );
    expect(notices.map(n => n.kind)).toEqual(['granted', 'warning']);
    expect(notices[0].message).toBe('GPU granted: GPU 0 / 1g.10gb@0');
    expect(notices[1].deadline).toBe('2026-12-01T10:08:00Z');
    expect(model.leases[0].reclaim_at).toBe('2026-12-01T10:08:00Z');
  });

  it('says which kernel a reclaim took the GPU of, and that its server shuts it down', () => {
    const o = overview();
    const { model, notices } = noticed(o);
    const about = { user: 'ann', request_id: 'r-of-l-00', lease_id: 'l-00' };
    const ended = { ...lease('l-00', 'MIG-0-0'), state: 'reclaimed' };
    const request = {
      ...queued('r-of-l-00', 0),
      holder: 'k-1',
      state: 'reclaimed'
    };
    model.apply(
      event(3, 'reclaimed', {
        ...about,
        reason: 'idle for 1 min: the kernel ran nothing',
        request: { ...request, lease: { ...ended, on_reclaim: 'shutdown' } }
      })
    );
    const reclaimed = notices.find(n => n.kind === 'reclaimed');
    expect(reclaimed?.holder).toBe('k-1');
    expect(reclaimed?.shutDown).toBe(true);
  });

  it('counts a lease idle on from when the broker last said it, as the widget does', () => {
    jest.useFakeTimers().setSystemTime(Date.parse('2026-12-01T10:00:00Z'));
    try {
      const { model } = modelWith(
        overview({ leases: [lease('l-00', 'MIG-0-0', { idle_s: 600 })] })
      );
      const later = Date.parse('2026-12-01T10:09:00Z');
      expect(model.idle(model.leases[0], later)).toBe(1140); // 10 min + 9 min
    } finally {
      jest.useRealTimers();
    }
  });

  it("speaks of the current notebook's own request in the status bar", () => {
    const mine = queued('r2', 2, { holder: 'k-2' });
    const { model } = modelWith(
      overview({ leases: [], requests: [queued('r1', 1), mine] })
    );
    expect(model.mineFor('k-2').waiting.map(r => r.id)).toEqual(['r2']);
    expect(model.mineFor(null).waiting.map(r => r.id)).toEqual(['r1', 'r2']);
  });

  it("offers Extend on a time limit's warning with the limit's end, and withdraws it once extended", () => {
    const limited = lease('l-00', 'MIG-0-0', {
      limit_s: 7200,
      ends_at: '2026-12-01T10:10:00.000Z',
      extensions: 0
    });
    const { model, notices } = noticed(overview({ leases: [limited] }));
    const about = { user: 'ann', request_id: 'r-of-l-00', lease_id: 'l-00' };
    const mine = (l: ILease) => ({
      ...queued('r-of-l-00', 0),
      state: 'granted',
      position: null,
      lease: l
    });
    const deadline = '2026-12-01T10:11:00.000Z';
    const warned = { ...limited, reclaim_at: deadline };
    model.apply(
      event(4, 'warning', {
        ...about,
        cause: 'time_limit',
        reason: 'its time limit of 2 h 00 min ends at 10:10',
        deadline,
        request: mine({ ...warned, reclaim_cause: 'time_limit' })
      })
    );
    expect(notices[0]).toMatchObject({
      kind: 'warning',
      cause: 'time_limit',
      endsAt: '2026-12-01T10:10:00.000Z',
      deadline
    });
    expect(limitWarned(model.leases[0])).toBe(true);
    const later = '2026-12-01T11:10:00.000Z';
    model.apply(
      event(5, 'extended', {
        ...about,
        ends_at: later,
        extensions: 1,
        request: mine({ ...warned, ends_at: later, extensions: 1 })
      })
    );
    expect(model.leases[0].ends_at).toBe(later);
    model.apply(
      event(6, 'warning_cleared', {
        ...about,
        reason: 'its time limit was extended',
        request: mine({ ...limited, ends_at: later, extensions: 1 })
      })
    );
    expect(notices.map(n => n.kind)).toEqual(['warning', 'cleared']);
    expect(model.leases[0].reclaim_at).toBeNull();
    expect(limitWarned(model.leases[0])).toBe(false);
  });

  it("keeps an idle warning's cause, with no limit's end to offer", () => {
    const { model, notices } = noticed(overview());
    model.apply(
      event(4, 'warning', {
        user: 'ann',
        request_id: 'r-of-l-00',
        lease_id: 'l-00',
        cause: 'idle',
        reason: 'idle for 1 h',
        deadline: '2026-12-01T10:08:00Z'
      })
    );
    expect(notices[0]).toMatchObject({ cause: 'idle', endsAt: null });
    expect(model.leases[0].reclaim_cause).toBe('idle');
    expect(limitWarned(model.leases[0])).toBe(false);
  });

  it('tells me, and only me, that my process uses a GPU outside the broker', () => {
    const { model, notices } = noticed(overview());
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
    model.apply(event(3, 'outside_use', { user: 'ann', ...about }));
    model.apply(event(4, 'outside_use', { user: 'bob' }));
    expect(notices.map(n => [n.kind, n.message])).toEqual([
      ['outside', message]
    ]);
  });

  it('tells me when a start promised to my request cannot be kept', () => {
    const { model, notices } = noticed(overview());
    const message =
      'The start promised by 14:30 cannot be kept: a GPU was taken out of service ' +
      '(drained by ada: maintenance). It now starts by 16:10 at the latest.';
    const about = { request_id: 'r1', lease_id: null, message };
    model.apply(event(3, 'promise_broken', { user: 'ann', ...about }));
    model.apply(event(4, 'promise_broken', { user: 'bob' }));
    expect(notices.map(n => [n.kind, n.message])).toEqual([
      ['promise', message]
    ]);
  });

  it("ignores other users' grants for notifications", () => {
    const { model, notices } = noticed(overview());
    model.apply(
      event(3, 'granted', {
        user: 'bob',
        request_id: 'r',
        lease_id: 'l',
        devices: ['x'],
        waited_s: 0
      })
    );
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
    model.setKernels(new Map([[running.holder, { path: 'busy.ipynb' }]]));
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

  it("takes a share's utilization from its own processes, not from its GPU", () => {
    const gpu = h100(0, [], {
      mig_enabled: false,
      utilization_gpu: 70, // two shares' together
      devices: []
    });
    const share = (utilization: number | null | undefined) =>
      lease('l-00', 'GPU-0', {
        profile: 'share',
        share: {
          memory_mib: 7630,
          used_mib: 1024,
          utilization,
          gpu: 'GPU 0',
          mechanism: 'watched',
          enforced: false,
          text: '8.0 GB of GPU 0, not enforced: a kernel that goes over is stopped'
        }
      });
    const { model } = modelWith(overview({ gpus: [gpu], leases: [] }));
    expect(model.utilization(share(10))).toBe(10);
    expect(model.utilization(share(null))).toBeNull(); // NVML gives none: n/a
    expect(model.utilization(share(undefined))).toBe(70); // an older broker's lease
  });

  it('renders 20 queue events from the stream alone: no HTTP call but the stream', async () => {
    const settings = ServerConnection.makeSettings({
      baseUrl: 'http://localhost:8888/'
    });
    const client = new BrokerClient(settings);
    const model = new GpuModel();
    const abort = new AbortController();
    const mine = queued('r-new', 1, {
      place: 'position 1 of 1, nothing ahead'
    });
    const held = lease('l-new', 'MIG-0-2', { request_id: 'r-new' });
    const events: IEnvelope[] = [
      { v: 1, id: 1, type: 'snapshot', at: '', data: overview() }
    ];
    const at = '2026-12-01T10:00:00Z';
    for (let i = 0; i < 5; i++) {
      // my request waits, moves, is granted and released; bob's comes and goes
      const id = 2 + 4 * i;
      const request = { ...mine, id: `r-${i}` };
      events.push(
        {
          v: 1,
          id,
          type: 'queued',
          at,
          data: {
            user: 'ann',
            request_id: request.id,
            lease_id: null,
            size: 'profile=1g.10gb',
            request: { ...request, lease: null }
          }
        },
        {
          v: 1,
          id: id + 1,
          type: 'positions',
          at,
          data: {
            queue_length: 1,
            requests: [request],
            ahead: { [request.id]: {} },
            queue: [entry(request)]
          }
        },
        {
          v: 1,
          id: id + 2,
          type: 'granted',
          at,
          data: {
            user: 'ann',
            request_id: request.id,
            lease_id: held.id,
            devices: held.devices,
            waited_s: 1,
            request: {
              ...request,
              state: 'granted',
              position: null,
              place: null,
              lease_id: held.id,
              lease: held
            }
          }
        },
        {
          v: 1,
          id: id + 3,
          type: i % 2 ? 'released' : 'granted',
          at,
          data: { user: 'bob', devices: ['MIG-0-3'] }
        }
      );
    }
    const calls: string[] = [];
    jest
      .spyOn(ServerConnection, 'makeRequest')
      .mockImplementation(async url => {
        calls.push(url);
        if (calls.length > 1) {
          abort.abort();
          throw new Error('stopped');
        }
        return stream(events);
      });
    await follow(model, client, abort.signal);
    expect(events.length).toBe(21); // the snapshot and 20 queue events
    expect(calls).toEqual([
      'http://localhost:8888/gpubroker/api/v1/events?snapshot=true',
      'http://localhost:8888/gpubroker/api/v1/events' // the reconnect, stopped
    ]);
    // the picture followed: my last request holds its slice, bob holds his
    expect(model.leases.map(l => l.id)).toEqual(['l-00', 'l-new']);
    expect(model.waiting).toEqual([]);
    expect(model.overview?.queue.map(q => q.id)).toEqual(['r-4']);
    const devices = model.overview!.gpus[0].devices;
    expect(devices[2].holder?.lease_id).toBe('l-new');
    expect(devices[3].holder?.user).toBe('bob');
  });

  it("drops a granted notice's lease when it ends, and takes readings in place", () => {
    const { model, notices } = noticed(overview());
    const about = { user: 'ann', request_id: 'r-of-l-00', lease_id: 'l-00' };
    model.apply(
      event(3, 'released', {
        ...about,
        reason: 'released',
        request: {
          ...queued('r-of-l-00', 0),
          state: 'released',
          lease: lease('l-00', 'MIG-0-0', { state: 'released' })
        }
      })
    );
    expect(notices.map(n => [n.kind, n.leaseId])).toEqual([['ended', 'l-00']]);
    expect(model.leases).toEqual([]);
    expect(model.overview?.gpus[0].devices[0].holder).toBeNull();
    model.apply(
      event(4, 'readings', {
        devices: { 'MIG-0-1': { utilization_gpu: 12, health: 'ok' } }
      })
    );
    expect(model.device('MIG-0-1')?.utilization).toBe(12);
    expect(model.history('MIG-0-1')).toEqual([73, 12]);
  });
});
