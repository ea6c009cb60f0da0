import {
  clock,
  etaText,
  holderText,
  limitWarned,
  limitWarningText,
  mib,
  statusText,
  untilText
} from '../format';
import { SseParser } from '../sse';
import { iso, lease, NOW, QUEUED_ETA, queued } from './fixtures';

describe('etaText', () => {
  const at = (s: number) => clock(iso(s));

  it('says what an estimate rests on unless it is past holds', () => {
    const e = queued('r1', 1);
    expect(etaText({ ...e, eta_basis: 'history' }, NOW)).toBe(QUEUED_ETA);
    expect(etaText({ ...e, eta_basis: 'time limits' }, NOW)).toBe(
      `${QUEUED_ETA}, by time limits`
    );
    expect(etaText({ ...e, eta_basis: 'typical hold' }, NOW, false)).toBe(
      QUEUED_ETA
    );
  });

  it('puts a promised start first, in every place an ETA shows', () => {
    const e = queued('r1', 1, {
      eta: iso(40 * 60),
      eta_basis: 'time limits',
      eta_bound: iso(90 * 60)
    });
    const latest = `by ${at(90 * 60)} at the latest`;
    expect(etaText(e, NOW)).toBe(`${latest} (likely ${at(40 * 60)})`);
    expect(etaText(e, NOW, false)).toBe(`${latest} (likely ${at(40 * 60)})`);
    expect(etaText({ ...e, eta: iso(-5) }, NOW)).toBe(`any moment (${latest})`);
  });

  it('keeps the status bar short: no basis there', () => {
    const waiting = [queued('r1', 1, { eta_basis: 'typical hold' })];
    expect(statusText([], waiting, () => null, NOW)).toBe(
      `GPU queue 1 of 1, ETA ${QUEUED_ETA}`
    );
  });
});

describe('statusText', () => {
  it('shows my slice and its utilization', () => {
    expect(statusText([lease('l1', 'MIG-0-0')], [], () => 73, NOW)).toBe(
      'GPU 1g.10gb 73%'
    );
  });

  it('says a share as its request asked it, not as its profile', () => {
    const share = lease('l1', 'GPU-0', {
      profile: 'share',
      share: {
        memory_mib: 7630,
        used_mib: 2000,
        gpu: 'GPU-0',
        mechanism: 'mps',
        enforced: true,
        text: '8.0 GB of GPU 0, enforced by MPS'
      }
    });
    expect(statusText([share], [], () => 40, NOW)).toBe(
      '8 GB of a shared GPU 40%'
    );
  });

  it('shows my best place in the queue and the ETA', () => {
    const waiting = [queued('r2', 3), queued('r1', 2)];
    expect(statusText([], waiting, () => null, NOW)).toBe(
      `GPU queue 2 of 2, ETA ${QUEUED_ETA}`
    );
  });

  it('says when the ETA is unknown rather than guessing', () => {
    const waiting = [queued('r1', 1, { eta: null, eta_known: false })];
    expect(statusText([], waiting, () => null, NOW)).toBe(
      'GPU queue 1 of 1, ETA unknown'
    );
  });

  it('adds my place in the queue to what I hold', () => {
    const held = [lease('l1', 'MIG-0-0'), lease('l2', 'MIG-0-1')];
    expect(statusText(held, [queued('r1', 1)], () => 5, NOW)).toBe(
      `GPU 1g.10gb 5% +1 · queue 1 of 1, ETA ${QUEUED_ETA}`
    );
  });

  it('puts a reclaim warning first', () => {
    const warned = lease('l1', 'MIG-0-0', { reclaim_at: iso(8 * 60) });
    expect(statusText([warned], [], () => 0, NOW)).toBe(
      'GPU idle: reclaim in 8 min'
    );
  });

  it('keeps my place in the queue beside a reclaim warning', () => {
    const warned = lease('l1', 'MIG-0-0', { reclaim_at: iso(8 * 60) });
    expect(statusText([warned], [queued('r1', 1)], () => 0, NOW)).toBe(
      `GPU idle: reclaim in 8 min · queue 1 of 1, ETA ${QUEUED_ETA}`
    );
  });

  it("says a time limit's warning as such, not as idleness", () => {
    const warned = lease('l1', 'MIG-0-0', {
      reclaim_at: iso(8 * 60),
      reclaim_cause: 'time_limit',
      ends_at: iso(7 * 60)
    });
    expect(statusText([warned], [], () => 0, NOW)).toBe(
      'GPU time limit: reclaim in 8 min'
    );
  });

  it('says a whole GPU as "1 GPU", not "GPU 1 GPU"', () => {
    const whole = lease('l1', 'GPU-0', { profile: 'gpu' });
    expect(statusText([whole], [], () => 0, NOW)).toBe('1 GPU 0%');
  });

  it("says a place in the queue as the notebook's widget does, of the queue's length", () => {
    const waiting = [queued('r1', 2)];
    expect(statusText([], waiting, () => null, NOW, 2)).toBe(
      `GPU queue 2 of 2, ETA ${QUEUED_ETA}`
    );
  });

  it('has nothing to say without GPUs or requests', () => {
    expect(statusText([], [], () => null, NOW)).toBeNull();
  });
});

describe('SseParser', () => {
  it('joins messages split across chunks and skips keepalives', () => {
    const p = new SseParser();
    expect(p.feed('id: 7\ndata: {"a"')).toEqual([]);
    expect(p.feed(': 1}\n\n: keepalive\n\nid: 8\r\ndata: {}\r\n\r\n')).toEqual([
      { id: '7', data: '{"a": 1}' },
      { id: '8', data: '{}' }
    ]);
  });
});

describe('words shared with the Python fronts', () => {
  it('names holders as people say them', () => {
    expect(holderText('server:a')).toBe("a's server");
    expect(holderText('server:bob:gpu1')).toBe("bob's server gpu1");
    expect(holderText('cli-run')).toBe('a `jupyter gpubroker run` command');
    expect(holderText('0f3e9a7c-1111')).toBe('kernel 0f3e9a7c');
  });

  it('shows memory in GB as NVIDIA names devices, rounded down, as every front does', () => {
    expect(mib(9984)).toBe('10.4 GB');
    expect(mib(81559)).toBe('85.5 GB');
  });
});

describe('time limits', () => {
  /** An ISO instant at a local wall-clock time (the person's clock, as `clock` says it). */
  const at = (h: number, m: number) =>
    new Date(2026, 11, 1, h, m, 20).toISOString();

  it("says when a lease's time limit ends by the person's clock, and nothing without one", () => {
    expect(clock(at(9, 5))).toBe('09:05');
    expect(untilText(lease('l1', 'MIG-0-0', { ends_at: at(14, 30) }))).toBe(
      'until 14:30'
    );
    expect(
      untilText(lease('l1', 'MIG-0-0', { ends_at: null }))
    ).toBeUndefined();
    expect(untilText(lease('l1', 'MIG-0-0'))).toBeUndefined();
  });

  it('tells a time-limit warning from an idle one', () => {
    const warned = { reclaim_at: at(14, 31), ends_at: at(14, 30) };
    const limit = lease('l1', 'MIG-0-0', {
      ...warned,
      reclaim_cause: 'time_limit'
    });
    const idle = lease('l1', 'MIG-0-0', { ...warned, reclaim_cause: 'idle' });
    const cleared = lease('l1', 'MIG-0-0', {
      reclaim_at: null,
      reclaim_cause: null
    });
    expect([limit, idle, cleared].map(limitWarned)).toEqual([
      true,
      false,
      false
    ]);
  });

  it("warns of a time limit's end and the reclaim after it, and says so once it is past", () => {
    const before = Date.parse(at(14, 20));
    expect(limitWarningText(at(14, 30), at(14, 31), before)).toBe(
      "Your GPU's time limit ends at 14:30; it is reclaimed at 14:31 unless extended"
    );
    expect(limitWarningText(at(14, 30), null, Date.parse(at(14, 31)))).toBe(
      "Your GPU's time limit ended at 14:30; it is reclaimed unless extended"
    );
  });
});
