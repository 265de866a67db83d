/**
 * A job's log as the panel holds it (pure; unit-tested): lines appended chunk by chunk by
 * byte offset, the ranks they come from (`[rank N] ` prefixes written by the job runtime),
 * filtering by rank, and the first line that looks like an error.
 */
import type { Schemas } from './api';

type LogChunk = Schemas['LogChunk'];

const RANK = /^\[rank (\d+)\]/;
const ERROR = /Traceback|\b[A-Za-z_]*Error\b|\bException\b/;

/** The rank that wrote a line, or null for a line without a `[rank N]` prefix. */
export function rankOf(line: string): number | null {
  const match = RANK.exec(line);
  return match ? Number(match[1]) : null;
}

/** The ranks seen in these lines, ascending. */
export function ranksIn(lines: readonly string[]): number[] {
  const ranks = new Set<number>();
  for (const line of lines) {
    const rank = rankOf(line);
    if (rank !== null) {
      ranks.add(rank);
    }
  }
  return [...ranks].sort((a, b) => a - b);
}

/** The lines of one rank (all lines when `rank` is null). */
export function filterByRank(lines: readonly string[], rank: number | null): string[] {
  return rank === null ? [...lines] : lines.filter(line => rankOf(line) === rank);
}

/** True for a line that starts or names an error: a Traceback, `SomethingError`, `Exception`. */
export function isErrorLine(line: string): boolean {
  return ERROR.test(line);
}

/** The index of the first error line, or -1. */
export function firstErrorLine(lines: readonly string[]): number {
  return lines.findIndex(isErrorLine);
}

/**
 * The lines received so far, and the byte offset to ask for next. A chunk that repeats bytes
 * already held (a resumed stream) is skipped; only the newest `maxLines` lines are kept.
 */
export class LogBuffer {
  constructor(readonly maxLines = 5000) {}

  /** Byte offset of the next chunk to ask for. */
  nextOffset = 0;
  /** Lines dropped from the front to stay within `maxLines`. */
  dropped = 0;
  /** True once the control plane said nothing more will be written. */
  complete = false;

  get lines(): readonly string[] {
    return this._lines;
  }

  /** Add a chunk; returns the lines it added (none for a repeat). */
  append(chunk: LogChunk): string[] {
    this.complete = this.complete || chunk.complete;
    if (chunk.next_offset <= this.nextOffset || !chunk.text) {
      return [];
    }
    const added = chunk.text.split('\n');
    if (added[added.length - 1] === '') {
      added.pop();
    }
    this.nextOffset = chunk.next_offset;
    this._lines.push(...added);
    const excess = this._lines.length - this.maxLines;
    if (excess > 0) {
      this._lines.splice(0, excess);
      this.dropped += excess;
    }
    return added;
  }

  private _lines: string[] = [];
}
