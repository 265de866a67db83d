/** Retry delays that grow after each consecutive failure (pure; unit-tested). */

export interface IBackoff {
  /** Delay after the first failure. */
  initialMs: number;
  /** Each further failure multiplies the delay by this. */
  factor: number;
  /** The delay never grows past this. */
  maxMs: number;
  /** Spread each delay by up to ± this fraction, so many panels do not retry in step. */
  jitter: number;
}

export const DEFAULT_BACKOFF: IBackoff = {
  initialMs: 1000,
  factor: 2,
  maxMs: 30_000,
  jitter: 0.2
};

/**
 * How long to wait after the `failures`-th failure in a row (1 = the first): 1 s, 2 s, 4 s ...
 * up to 30 s by default. `random` is injectable for tests (0.5 = no jitter).
 */
export function backoffDelay(
  failures: number,
  options: Partial<IBackoff> = {},
  random: () => number = Math.random
): number {
  const { initialMs, factor, maxMs, jitter } = { ...DEFAULT_BACKOFF, ...options };
  if (failures <= 0) {
    return 0;
  }
  const base = Math.min(maxMs, initialMs * Math.pow(factor, failures - 1));
  const spread = 1 + jitter * (2 * random() - 1);
  return Math.round(Math.min(maxMs, base * spread));
}

/** The first `n` delays without jitter, e.g. to show or document the schedule. */
export function backoffSchedule(n: number, options: Partial<IBackoff> = {}): number[] {
  return Array.from({ length: n }, (_, i) => backoffDelay(i + 1, { ...options, jitter: 0 }));
}
