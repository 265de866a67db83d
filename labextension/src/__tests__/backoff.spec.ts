import { backoffDelay, backoffSchedule } from '../backoff';

describe('backoff', () => {
  it('doubles from 1 s up to 30 s by default', () => {
    expect(backoffSchedule(7)).toEqual([1000, 2000, 4000, 8000, 16000, 30000, 30000]);
  });

  it('waits nothing before the first failure', () => {
    expect(backoffDelay(0)).toBe(0);
  });

  it('spreads each delay by the jitter, never past the ceiling', () => {
    expect(backoffDelay(1, {}, () => 0)).toBe(800);
    expect(backoffDelay(1, {}, () => 1)).toBe(1200);
    expect(backoffDelay(10, {}, () => 1)).toBe(30000);
  });

  it('takes its own schedule', () => {
    expect(backoffSchedule(4, { initialMs: 500, factor: 3, maxMs: 5000 })).toEqual([500, 1500, 4500, 5000]);
  });
});
