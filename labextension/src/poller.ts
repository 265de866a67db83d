/** Calls `tick` every `intervalMs` while started; after failures it waits by the backoff schedule. */
import { backoffDelay, IBackoff } from './backoff';

export class Poller {
  constructor(
    private readonly tick: () => Promise<void>,
    private readonly intervalMs: number,
    private readonly backoff: Partial<IBackoff> = {}
  ) {}

  get running(): boolean {
    return this._running;
  }

  /** Start ticking now (again: a no-op while running). */
  start(): void {
    if (!this._running) {
      this._running = true;
      this.generation++;
      this.schedule(0);
    }
  }

  stop(): void {
    this._running = false;
    if (this.timer !== null) {
      clearTimeout(this.timer);
      this.timer = null;
    }
  }

  private schedule(delay: number): void {
    const generation = this.generation;
    this.timer = setTimeout(() => void this.run(generation), delay);
  }

  private async run(generation: number): Promise<void> {
    this.timer = null;
    try {
      await this.tick();
      this.failures = 0;
    } catch {
      this.failures++; // the tick shows its own error
    }
    // a stop() and start() while the tick ran began a new loop; this one ends
    if (this._running && generation === this.generation) {
      this.schedule(this.failures ? backoffDelay(this.failures, this.backoff) : this.intervalMs);
    }
  }

  private _running = false;
  private failures = 0;
  private generation = 0;
  private timer: ReturnType<typeof setTimeout> | null = null;
}
