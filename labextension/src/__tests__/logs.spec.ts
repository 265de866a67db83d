import { filterByRank, firstErrorLine, isErrorLine, LogBuffer, rankOf, ranksIn } from '../logs';

const LINES = [
  '[rank 0] step 0 loss 1.0',
  '[rank 1] step 0 loss 1.1',
  'cellscale: attempt 1 started',
  '[rank 10] step 0 loss 0.9',
  '[rank 1] Traceback (most recent call last):',
  '[rank 1]   File "cell.py", line 3',
  '[rank 1] ValueError: bad shape'
];

describe('ranks', () => {
  it('reads the rank prefix the runtime writes', () => {
    expect(rankOf('[rank 0] hi')).toBe(0);
    expect(rankOf('[rank 12] hi')).toBe(12);
    expect(rankOf('no prefix [rank 1]')).toBeNull();
    expect(ranksIn(LINES)).toEqual([0, 1, 10]);
  });

  it('keeps one rank, or everything', () => {
    expect(filterByRank(LINES, 1)).toEqual([LINES[1], LINES[4], LINES[5], LINES[6]]);
    expect(filterByRank(LINES, 10)).toEqual([LINES[3]]);
    expect(filterByRank(LINES, null)).toEqual(LINES);
  });
});

describe('first error', () => {
  it('finds the first Traceback or ...Error line', () => {
    expect(firstErrorLine(LINES)).toBe(4);
    expect(firstErrorLine(filterByRank(LINES, 0))).toBe(-1);
    expect(isErrorLine('RuntimeError: CUDA out of memory')).toBe(true);
    expect(isErrorLine('Error: something')).toBe(true);
    expect(isErrorLine('raise Exception("x")')).toBe(true);
  });

  it('does not flag ordinary words', () => {
    expect(isErrorLine('stderr is redirected')).toBe(false);
    expect(isErrorLine('0 errors, loss 0.1')).toBe(false);
    expect(isErrorLine('ErrorCount=0 ok')).toBe(false);
  });
});

describe('LogBuffer', () => {
  const chunk = (offset: number, text: string, complete = false) => ({
    offset,
    next_offset: offset + new TextEncoder().encode(text).length,
    text,
    complete
  });

  it('appends whole lines and tracks the next byte offset', () => {
    const log = new LogBuffer();
    expect(log.append(chunk(0, 'a\nb\n'))).toEqual(['a', 'b']);
    expect(log.append(chunk(4, 'é\n'))).toEqual(['é']);
    expect(log.nextOffset).toBe(7);
    expect(log.lines).toEqual(['a', 'b', 'é']);
  });

  it('skips a chunk it already holds (a resumed stream repeats it)', () => {
    const log = new LogBuffer();
    log.append(chunk(0, 'a\nb\n'));
    expect(log.append(chunk(0, 'a\nb\n'))).toEqual([]);
    expect(log.lines).toEqual(['a', 'b']);
  });

  it('keeps only the newest lines and counts the dropped ones', () => {
    const log = new LogBuffer(3);
    log.append(chunk(0, '1\n2\n3\n4\n5\n'));
    expect(log.lines).toEqual(['3', '4', '5']);
    expect(log.dropped).toBe(2);
  });

  it('remembers that the log is complete, even from an empty last chunk', () => {
    const log = new LogBuffer();
    log.append(chunk(0, 'x\n'));
    expect(log.complete).toBe(false);
    log.append(chunk(2, '', true));
    expect(log.complete).toBe(true);
  });
});
