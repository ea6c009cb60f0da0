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
          encoded.length ? { value: encoded.shift(), done: false } : { value: undefined, done: true }
      })
    }
  } as unknown as Response;
}

describe('BrokerClient.follow', () => {
  it('reconnects after the server restarts, resuming after the last event id', async () => {
    const settings = ServerConnection.makeSettings({ baseUrl: 'http://localhost:8888/' });
    const client = new BrokerClient(settings);
    const abort = new AbortController();
    const sent: Array<Record<string, string>> = [];
    const replies = [
      stream(['id: 41\ndata: {"v":1,"id":41,"type":"hello","at":"","data":{}}\n\n']),
      stream(['id: 42\ndata: {"v":1,"id":42,"type":"granted","at":"","data":{}}\n\n'])
    ];
    jest.spyOn(ServerConnection, 'makeRequest').mockImplementation(async (url, init) => {
      expect(url).toBe('http://localhost:8888/gpubroker/api/v1/events');
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
    await client.follow(e => seen.push(e), abort.signal, c => states.push(c), 0);
    expect(seen.map(e => e.type)).toEqual(['hello', 'granted']);
    expect(sent).toEqual([{}, { 'Last-Event-ID': '41' }, { 'Last-Event-ID': '42' }]);
    expect(states).toEqual([true, false, true, false]);
  });
});

describe('BrokerClient.url', () => {
  const settings = ServerConnection.makeSettings({ baseUrl: 'http://hub/user/ann/' });

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
