/**
 * A live feed: a websocket while it is up, polling while it is down, with backoff on both.
 *
 * `connect()` opens the socket (its URL asked again each time, so a log resumes from its
 * offset). While it is open, every message goes to `receive`. When it closes with 1000 the feed
 * is finished (the server said nothing more will come). Any other close starts polling at once
 * (`poll`, every `pollIntervalMs`, backing off after failures) and tries the socket again after a
 * backoff delay; the poller stops as soon as the socket is back.
 */
import { backoffDelay, IBackoff } from './backoff';

export type FeedState = 'connecting' | 'live' | 'polling' | 'finished' | 'stopped';

export interface ILiveFeedOptions {
  /** The websocket URL, asked at every (re)connect. */
  url: () => string;
  /** A message from the socket, parsed from JSON. */
  receive: (data: unknown) => void;
  /** One read while the socket is down; resolves true when the feed is finished for good. Rejects on failure. */
  poll: () => Promise<boolean>;
  /** The feed's state, and why (the socket's close reason, a poll's error). */
  onState?: (state: FeedState, detail?: string) => void;
  pollIntervalMs?: number;
  backoff?: Partial<IBackoff>;
  /** For tests. */
  WebSocket?: { new (url: string): WebSocket };
}

export class LiveFeed {
  constructor(private readonly options: ILiveFeedOptions) {}

  get state(): FeedState {
    return this._state;
  }

  /** Connect (again); a no-op while connected or polling. */
  start(): void {
    if (this._state === 'stopped' || this._state === 'finished') {
      this.setState('connecting');
      this.connect();
    }
  }

  /** Close the socket and stop every timer; `start()` begins again. */
  stop(): void {
    this.setState('stopped');
    this.clearTimers();
    const socket = this.socket;
    this.socket = null;
    socket?.close();
  }

  private connect(): void {
    const Socket = this.options.WebSocket ?? WebSocket;
    let socket: WebSocket;
    try {
      socket = new Socket(this.options.url());
    } catch (error) {
      this.socketDown(String(error));
      return;
    }
    this.socket = socket;
    socket.onopen = () => {
      if (this.socket !== socket) {
        return;
      }
      this.socketFailures = 0;
      this.clearTimers();
      this.setState('live');
    };
    socket.onmessage = event => {
      if (this.socket === socket) {
        this.options.receive(JSON.parse(event.data));
      }
    };
    socket.onclose = event => {
      if (this.socket !== socket) {
        return;
      }
      this.socket = null;
      if (event.code === 1000) {
        this.finish(event.reason);
      } else {
        this.socketDown(event.reason || `websocket closed (${event.code})`);
      }
    };
  }

  private socketDown(reason: string): void {
    this.socketFailures++;
    this.setState('polling', reason);
    if (this.pollTimer === null && !this.pollInFlight) {
      this.schedulePoll(0);
    }
    this.reconnectTimer = setTimeout(() => {
      this.reconnectTimer = null;
      if (this._state === 'polling') {
        this.connect();
      }
    }, backoffDelay(this.socketFailures, this.options.backoff));
  }

  private schedulePoll(delay: number): void {
    this.pollTimer = setTimeout(() => void this.pollOnce(), delay);
  }

  private async pollOnce(): Promise<void> {
    this.pollTimer = null;
    if (this._state !== 'polling') {
      return;
    }
    let finished = false;
    this.pollInFlight = true;
    try {
      finished = await this.options.poll();
      this.pollFailures = 0;
    } catch (error) {
      this.pollFailures++;
      if (this._state === 'polling') {
        this.options.onState?.('polling', (error as Error)?.message ?? String(error));
      }
    } finally {
      this.pollInFlight = false;
    }
    if (this._state !== 'polling') {
      return;
    }
    if (finished) {
      this.finish();
      return;
    }
    this.schedulePoll(
      this.pollFailures
        ? backoffDelay(this.pollFailures, this.options.backoff)
        : (this.options.pollIntervalMs ?? 2000)
    );
  }

  private finish(detail?: string): void {
    this.clearTimers();
    this.setState('finished', detail);
  }

  private clearTimers(): void {
    if (this.pollTimer !== null) {
      clearTimeout(this.pollTimer);
      this.pollTimer = null;
    }
    if (this.reconnectTimer !== null) {
      clearTimeout(this.reconnectTimer);
      this.reconnectTimer = null;
    }
  }

  private setState(state: FeedState, detail?: string): void {
    this._state = state;
    this.options.onState?.(state, detail);
  }

  private _state: FeedState = 'stopped';
  private socket: WebSocket | null = null;
  private socketFailures = 0;
  private pollFailures = 0;
  private pollInFlight = false;
  private pollTimer: ReturnType<typeof setTimeout> | null = null;
  private reconnectTimer: ReturnType<typeof setTimeout> | null = null;
}
