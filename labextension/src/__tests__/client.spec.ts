import { ServerConnection } from '@jupyterlab/services';

import { BrokerClient } from '../client';
import { IEnvelope } from '../types';

/** A streamed response whose body yields `chunks`, then ends (the server went away). */
function stream(chunks: string[]): Response {
  const encoded = chunks.map(c => new TextEncoder().encode(c));
  return {
    ok: true,
    status: 200,
    body: {
      getReader: () => ({
        read: async () =>
          encoded.length
            ? { value: encoded.shift(), done: false }
            : { value: undefined, done: true }
      })
    }
  } as unknown as Response;
}

describe('BrokerClient.follow', () => {
  it('reconnects after the server restarts, resuming after the last event id', async () => {
    const settings = ServerConnection.makeSettings({
      baseUrl: 'http://localhost:8888/'
    });
    const client = new BrokerClient(settings);
    const abort = new AbortController();
    const sent: Array<Record<string, string>> = [];
    const urls: string[] = [];
    const replies = [
      stream([
        'id: 41\ndata: {"v":1,"id":41,"type":"hello","at":"","data":{}}\n\n'
      ]),
      stream([
        'id: 42\ndata: {"v":1,"id":42,"type":"granted","at":"","data":{}}\n\n'
      ])
    ];
    jest
      .spyOn(ServerConnection, 'makeRequest')
      .mockImplementation(async (url, init) => {
        urls.push(url);
        sent.push({ ...(init.headers as Record<string, string>) });
        const reply = replies.shift();
        if (!reply) {
          abort.abort();
          throw new Error('stopped');
        }
        return reply;
      });
    const seen: IEnvelope[] = [];
    const states: boolean[] = [];
    await client.follow(
      e => seen.push(e),
      abort.signal,
      c => states.push(c),
      0
    );
    expect(seen.map(e => e.type)).toEqual(['hello', 'granted']);
    const events = 'http://localhost:8888/gpubroker/api/v1/events';
    // a new stream starts with the whole picture; a resumed one with what it missed
    expect(urls).toEqual([`${events}?snapshot=true`, events, events]);
    expect(sent).toEqual([
      {},
      { 'Last-Event-ID': '41' },
      { 'Last-Event-ID': '42' }
    ]);
    expect(states).toEqual([true, false, true, false]);
  });
});

describe('BrokerClient.url', () => {
  const settings = ServerConnection.makeSettings({
    baseUrl: 'http://hub/user/ann/'
  });

  it("calls this server's own broker by default", () => {
    expect(new BrokerClient(settings).url('overview')).toBe(
      'http://hub/user/ann/gpubroker/api/v1/overview'
    );
  });

  it('calls a broker elsewhere, such as a hub service, when told', () => {
    const client = new BrokerClient(settings, '/services/gpubroker/api/v1/');
    expect(client.url('events')).toBe('/services/gpubroker/api/v1/events');
  });
});

/** A response with `status` and `text` (the broker's JSON or a proxy's page). */
function answer(status: number, text: string): Response {
  return {
    ok: status < 400,
    status,
    statusText: '',
    text: async () => text
  } as unknown as Response;
}

const PROXY_PAGE = '<html><body>503 Service Unavailable</body></html>';

describe('BrokerClient while the broker does not answer', () => {
  const settings = ServerConnection.makeSettings({
    baseUrl: 'http://localhost:8888/'
  });

  function client(replies: Array<Response | Error>): {
    client: BrokerClient;
    waits: number[];
    told: Array<string | null>;
  } {
    const c = new BrokerClient(settings);
    const waits: number[] = [];
    const told: Array<string | null> = [];
    c.sleep = async ms => void waits.push(ms);
    c.onUnavailable = why => told.push(why);
    jest.spyOn(ServerConnection, 'makeRequest').mockImplementation(async () => {
      const reply = replies.shift();
      if (reply === undefined || reply instanceof Error) {
        throw reply ?? new Error('no more replies');
      }
      return reply;
    });
    return { client: c, waits, told };
  }

  afterEach(() => jest.restoreAllMocks());

  it('tries again after a proxy 502/503 or no connection, 0.5 s doubling to 5 s, and says so', async () => {
    const {
      client: c,
      waits,
      told
    } = client([
      answer(502, PROXY_PAGE),
      answer(503, PROXY_PAGE),
      new ServerConnection.NetworkError(new TypeError('Failed to fetch')),
      answer(503, ''),
      answer(504, PROXY_PAGE),
      answer(502, PROXY_PAGE),
      answer(200, '{"me": {"user": "ann"}}')
    ]);
    expect(await c.call('overview')).toEqual({ me: { user: 'ann' } });
    expect(waits).toEqual([500, 1000, 2000, 4000, 5000, 5000]);
    expect(told).toEqual([
      ...Array(6).fill('The GPU broker is not answering; trying again…'),
      null
    ]);
  });

  it("shows the broker's own reason for a 503 in full and tries again every few seconds", async () => {
    const why =
      'The GPU broker could not start: its state file /srv/gpubroker.sqlite is held by pid 7.';
    const {
      client: c,
      waits,
      told
    } = client([
      answer(
        503,
        JSON.stringify({ error: 'broker_unavailable', message: why })
      ),
      answer(
        503,
        JSON.stringify({ error: 'broker_unavailable', message: why })
      ),
      answer(200, '{}')
    ]);
    await c.call('overview');
    expect(waits).toEqual([3000, 3000]);
    expect(told).toEqual([why, why, null]);
  });

  it("fails at once with the broker's sentence for its other errors, and after its time", async () => {
    const { client: c, waits } = client([
      answer(
        409,
        JSON.stringify({
          error: 'conflict',
          message: 'That lease is already released.'
        })
      )
    ]);
    await expect(c.release('l-1')).rejects.toThrow(
      'That lease is already released.'
    );
    expect(waits).toEqual([]);
    const gone = client(Array(20).fill(answer(502, PROXY_PAGE)));
    gone.client.retryForMs = 0;
    await expect(gone.client.call('overview')).rejects.toThrow(
      'The GPU broker is not answering; trying again…'
    );
  });

  it('asks for an hour more on a lease, and fails with the sentence the broker refuses it with', async () => {
    const refused =
      'not extended: a waiting request needs this GPU when its time limit ends, at 14:30';
    const { client: c, waits } = client([
      answer(200, '{"id": "l-1"}'),
      answer(409, JSON.stringify({ error: 'conflict', message: refused }))
    ]);
    expect(await c.extend('l-1', 3600)).toEqual({ id: 'l-1' });
    const [url, init] = (ServerConnection.makeRequest as jest.Mock).mock
      .calls[0];
    expect(url).toBe(
      'http://localhost:8888/gpubroker/api/v1/leases/l-1/extend'
    );
    expect(init).toMatchObject({ method: 'POST', body: '{"seconds":3600}' });
    await expect(c.extend('l-1', 3600)).rejects.toThrow(refused);
    expect(waits).toEqual([]); // a refusal is an answer: not tried again
  });

  it('reconnects the event stream with the same backoff, saying why it is away', async () => {
    const abort = new AbortController();
    const { client: c, waits } = client([
      answer(502, PROXY_PAGE),
      new ServerConnection.NetworkError(new TypeError('Failed to fetch')),
      answer(
        503,
        JSON.stringify({ error: 'broker_unavailable', message: 'Starting.' })
      ),
      stream([]),
      answer(503, PROXY_PAGE)
    ]);
    const states: Array<[boolean, string | undefined]> = [];
    c.sleep = async ms => {
      waits.push(ms);
      if (waits.length === 5) {
        abort.abort();
      }
    };
    await c.follow(
      () => undefined,
      abort.signal,
      (up, why) => states.push([up, why]),
      2000
    );
    const away = 'The GPU broker is not answering; trying again…';
    expect(states).toEqual([
      [false, away],
      [false, away],
      [false, 'Starting.'],
      [true, undefined],
      [false, undefined],
      [false, away]
    ]);
    expect(waits).toEqual([500, 1000, 3000, 2000, 500]);
  });
});
