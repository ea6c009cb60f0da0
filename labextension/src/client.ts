/** The broker's HTTP API as the Lab sees it: `{base}gpubroker/api/v1/` through Jupyter's
 * own connection settings (its token or cookie and XSRF), so the panel works against the
 * embedded broker and, behind JupyterHub, the same API proxied by the user's server. */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { trans } from './i18n';
import { SseParser } from './sse';
import { IEnvelope, ILease } from './types';

export const API_PATH = 'gpubroker/api/v1';

/** What the panel says while the broker (or the proxy in front of it) does not answer. */
function notAnswering(): string {
  return trans.__('The GPU broker is not answering; trying again…');
}

/** A proxy's answers for a broker that is away (a restarting hub service). */
const GATEWAY = [502, 503, 504];

/** The broker cannot answer now: no connection, a proxy's 502/503/504 without the
 * broker's JSON (`said` false), or the broker's own 503 saying why (`said` true, the
 * sentence in `message`). Worth trying again. */
export class BrokerUnavailable extends Error {
  constructor(
    message: string,
    readonly said: boolean
  ) {
    super(message);
  }
}

/** How long to wait before try `attempt` (from 0) after `e`: 0.5 s doubling to 5 s while
 * nothing answers, every 3 s while the broker says why it cannot serve. */
export function pause(e: BrokerUnavailable, attempt: number): number {
  return e.said ? 3000 : Math.min(500 * 2 ** attempt, 5000);
}

/** What a refused answer means: the broker's own 503 saying why, or a proxy's 502/503/504
 * without the broker's JSON, is `BrokerUnavailable`; anything else an error with the
 * broker's sentence (the API's errors are {error, message}, the message for the user). */
function refusal(response: Response, text: string): Error {
  let said = '';
  try {
    said = String(JSON.parse(text).message ?? '');
  } catch {
    said = ''; // not the broker's JSON: a proxy's page
  }
  if (said && response.status === 503) {
    return new BrokerUnavailable(said, true);
  }
  if (!said && GATEWAY.includes(response.status)) {
    return new BrokerUnavailable(notAnswering(), false);
  }
  return new Error(said || `${response.status} ${response.statusText}`);
}

/** `ServerConnection.makeRequest`, with a failed connection as `BrokerUnavailable`. */
async function request(
  url: string,
  init: RequestInit,
  settings: ServerConnection.ISettings
): Promise<Response> {
  try {
    return await ServerConnection.makeRequest(url, init, settings);
  } catch (e) {
    if (init.signal?.aborted) {
      throw e;
    }
    throw new BrokerUnavailable(notAnswering(), false);
  }
}

export class BrokerClient {
  /** `apiUrl`: the broker's API elsewhere (a JupyterHub service's URL, absolute or from
   * the page's origin); empty: this server's own `{base}gpubroker/api/v1/`. */
  constructor(
    readonly settings: ServerConnection.ISettings = ServerConnection.makeSettings(),
    public apiUrl = ''
  ) {}

  /** How long a call waits for a broker that does not answer (the lease TTL). */
  retryForMs = 120_000;

  /** Told why calls wait for the broker (`null`: it answers again). */
  onUnavailable: (why: string | null) => void = () => undefined;

  sleep = (ms: number): Promise<void> =>
    new Promise(resolve => setTimeout(resolve, ms));

  url(path: string): string {
    const base = this.apiUrl || URLExt.join(this.settings.baseUrl, API_PATH);
    return URLExt.join(base, path);
  }

  /** One API call. While the broker does not answer (`BrokerUnavailable`) it is tried
   * again, after `pause` (0.5 s doubling to 5 s; a few seconds when the broker says why),
   * for up to `retryForMs`; `onUnavailable` hears why it waits, then `null` once answered. */
  async call<T>(path: string, init: RequestInit = {}): Promise<T> {
    const deadline = Date.now() + this.retryForMs;
    let waited = false;
    for (let attempt = 0; ; attempt++) {
      try {
        const body = await this._once<T>(path, init);
        if (waited) {
          this.onUnavailable(null);
        }
        return body;
      } catch (e) {
        const ms = e instanceof BrokerUnavailable ? pause(e, attempt) : -1;
        if (ms < 0 && waited) {
          this.onUnavailable(null); // it answered, with an error
        }
        if (ms < 0 || Date.now() + ms > deadline || init.signal?.aborted) {
          throw e;
        }
        waited = true;
        this.onUnavailable((e as BrokerUnavailable).message);
        await this.sleep(ms);
      }
    }
  }

  private async _once<T>(path: string, init: RequestInit): Promise<T> {
    const response = await request(this.url(path), init, this.settings);
    const text = await response.text();
    if (!response.ok) {
      throw refusal(response, text);
    }
    try {
      return (text ? JSON.parse(text) : {}) as T;
    } catch {
      throw new Error(`${path}: the answer was not the GPU broker's`);
    }
  }

  cancel(requestId: string): Promise<unknown> {
    return this.call(`requests/${encodeURIComponent(requestId)}`, {
      method: 'DELETE'
    });
  }

  release(leaseId: string): Promise<ILease> {
    return this.call<ILease>(`leases/${encodeURIComponent(leaseId)}`, {
      method: 'DELETE'
    });
  }

  keep(leaseId: string): Promise<ILease> {
    return this.call<ILease>(`leases/${encodeURIComponent(leaseId)}/keep`, {
      method: 'POST'
    });
  }

  /** More time on a lease's time limit; refused (409, the broker's sentence) where a
   * waiting request needs the GPU sooner or the class allows no more. */
  extend(leaseId: string, seconds: number): Promise<ILease> {
    return this.call<ILease>(`leases/${encodeURIComponent(leaseId)}/extend`, {
      method: 'POST',
      body: JSON.stringify({ seconds })
    });
  }

  /** Follow the event stream until `signal` aborts: each message to `onEvent`, starting
   * with a `snapshot` (the whole picture, in order with the events after it: no other
   * call), and after a dropped connection or a server restart, a reconnect with the last
   * id seen (`Last-Event-ID`), so the broker replays what was missed or sends a snapshot.
   * `onState` hears each connection and loss, with why the broker is away: it is tried
   * again after `retryMs`, or while it does not answer after 0.5 s doubling to 5 s (every
   * 3 s while it says why it cannot serve). */
  async follow(
    onEvent: (e: IEnvelope) => void,
    signal: AbortSignal,
    onState: (connected: boolean, why?: string) => void = () => undefined,
    retryMs = 2000
  ): Promise<void> {
    let last: string | null = null;
    let attempt = 0;
    while (!signal.aborted) {
      let wait = retryMs;
      let why: string | undefined;
      try {
        const headers: Record<string, string> = {};
        if (last !== null) {
          headers['Last-Event-ID'] = last;
        }
        const response = await request(
          this.url(last === null ? 'events?snapshot=true' : 'events'),
          { headers, signal, cache: 'no-store' },
          this.settings
        );
        if (!response.ok || !response.body) {
          throw refusal(response, await response.text());
        }
        attempt = 0;
        onState(true);
        const reader = response.body!.getReader();
        const decoder = new TextDecoder();
        const parser = new SseParser();
        for (;;) {
          const { value, done } = await reader.read();
          if (done) {
            break;
          }
          for (const m of parser.feed(
            decoder.decode(value, { stream: true })
          )) {
            if (m.id !== null) {
              last = m.id;
            }
            onEvent(JSON.parse(m.data) as IEnvelope);
          }
        }
      } catch (e) {
        if (signal.aborted) {
          return;
        }
        if (e instanceof BrokerUnavailable) {
          wait = pause(e, attempt++);
          why = e.message;
        }
      }
      onState(false, why);
      await this.sleep(wait);
    }
  }
}
