/** A server-sent events parser for a fetch body: the broker's stream sends `id:` and one
 * `data:` line per message, and `: keepalive` comments. Fed chunks as they arrive (a
 * message may be split anywhere), it returns the complete messages. */

export interface ISseMessage {
  id: string | null;
  data: string;
}

export class SseParser {
  feed(chunk: string): ISseMessage[] {
    this._buffer += chunk;
    const out: ISseMessage[] = [];
    let end: number;
    while ((end = this._buffer.search(/\r?\n/)) >= 0) {
      const line = this._buffer.slice(0, end);
      this._buffer = this._buffer.slice(
        end + (this._buffer[end] === '\r' ? 2 : 1)
      );
      if (line === '') {
        if (this._data.length) {
          out.push({ id: this._id, data: this._data.join('\n') });
        }
        this._data = [];
        this._id = null;
        continue;
      }
      if (line.startsWith(':')) {
        continue;
      }
      const colon = line.indexOf(':');
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? '' : line.slice(colon + 1);
      if (value.startsWith(' ')) {
        value = value.slice(1);
      }
      if (field === 'data') {
        this._data.push(value);
      } else if (field === 'id') {
        this._id = value;
      }
    }
    return out;
  }

  private _buffer = '';
  private _data: string[] = [];
  private _id: string | null = null;
}
