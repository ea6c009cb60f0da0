/** The broker's HTTP API as the Lab sees it: `{base}gpubroker/api/v1/` through Jupyter's
 * own connection settings (its token or cookie and XSRF), so the panel works against the
 * embedded broker and, behind JupyterHub, the same API proxied by the user's server. */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { SseParser } from './sse';
import { IEnvelope, ILease, IOverview } from './types';

export const API_PATH = 'gpubroker/api/v1';

/** An answer of the API other than a success: its one sentence for the user, and status. */
export class BrokerAPIError extends Error {
  constructor(
    message: string,
    readonly status: number
  ) {
    super(message);
  }
}

export class BrokerClient {
  /** `apiUrl`: the broker's API elsewhere (a JupyterHub service's URL, absolute or from
   * the page's origin); empty: this server's own `{base}gpubroker/api/v1/`. */
  constructor(
    readonly settings: ServerConnection.ISettings = ServerConnection.makeSettings(),
    public apiUrl = ''
  ) {}

  url(path: string): string {
    const base = this.apiUrl || URLExt.join(this.settings.baseUrl, API_PATH);
    return URLExt.join(base, path);
  }

  async call<T>(path: string, init: RequestInit = {}): Promise<T> {
    const response = await ServerConnection.makeRequest(this.url(path), init, this.settings);
    const text = await response.text();
    const body = text ? JSON.parse(text) : {};
    if (!response.ok) {
      // The API's errors are {error, message}: the message is one sentence for the user.
      throw new BrokerAPIError(body.message || `${response.status} ${response.statusText}`, response.status);
    }
    return body as T;
  }

  overview(): Promise<IOverview> {
    return this.call<IOverview>('overview');
  }

  cancel(requestId: string): Promise<unknown> {
    return this.call(`requests/${encodeURIComponent(requestId)}`, { method: 'DELETE' });
  }

  release(leaseId: string): Promise<ILease> {
    return this.call<ILease>(`leases/${encodeURIComponent(leaseId)}`, { method: 'DELETE' });
  }

  keep(leaseId: string): Promise<ILease> {
    return this.call<ILease>(`leases/${encodeURIComponent(leaseId)}/keep`, { method: 'POST' });
  }

  /** Follow the event stream until `signal` aborts: each message to `onEvent`, and after a
   * dropped connection or a server restart, a reconnect with the last id seen
   * (`Last-Event-ID`), so the broker replays what was missed or sends a snapshot. */
  async follow(
    onEvent: (e: IEnvelope) => void,
    signal: AbortSignal,
    onState: (connected: boolean) => void = () => undefined,
    retryMs = 2000
  ): Promise<void> {
    let last: string | null = null;
    while (!signal.aborted) {
      try {
        const headers: Record<string, string> = {};
        if (last !== null) {
          headers['Last-Event-ID'] = last;
        }
        const response = await ServerConnection.makeRequest(
          this.url('events'),
          { headers, signal, cache: 'no-store' },
          this.settings
        );
        if (!response.ok || !response.body) {
          throw new Error(`events: ${response.status}`);
        }
        onState(true);
        const reader = response.body.getReader();
        const decoder = new TextDecoder();
        const parser = new SseParser();
        for (;;) {
          const { value, done } = await reader.read();
          if (done) {
            break;
          }
          for (const m of parser.feed(decoder.decode(value, { stream: true }))) {
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
      }
      onState(false);
      await new Promise(resolve => setTimeout(resolve, retryMs));
    }
  }
}
