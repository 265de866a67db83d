import { describeUser, elapsedBetween, formatElapsed, phaseLabel } from '../format';

describe('formatElapsed', () => {
  it.each([
    [0, '0s'],
    [42_900, '42s'],
    [185_000, '3m 05s'],
    [3_720_000, '1h 02m'],
    [2 * 86_400_000 + 3 * 3_600_000, '2d 3h']
  ])('%p ms reads %p', (ms, text) => {
    expect(formatElapsed(ms)).toBe(text);
  });

  it('shows a dash for a negative or unknown duration', () => {
    expect(formatElapsed(-1)).toBe('–');
    expect(formatElapsed(NaN)).toBe('–');
  });

  it('measures a running job up to now and a finished one to its end', () => {
    const now = new Date('2025-01-01T10:05:00Z');
    expect(elapsedBetween('2025-01-01T10:00:00Z', null, now)).toBe('5m 00s');
    expect(elapsedBetween('2025-01-01T10:00:00Z', '2025-01-01T10:00:30Z', now)).toBe('30s');
    expect(elapsedBetween(null, null, now)).toBe('–');
  });
});

describe('phaseLabel', () => {
  it('reads every phase in plain words with a tone', () => {
    expect(phaseLabel('PENDING')).toEqual({ label: 'waiting for admission', tone: 'waiting' });
    expect(phaseLabel('RUNNING').tone).toBe('active');
    expect(phaseLabel('SUCCEEDED').tone).toBe('good');
    expect(phaseLabel('FAILED').tone).toBe('bad');
  });
});

describe('describeUser', () => {
  it('names the desk, or says there is none', () => {
    const who = { user: 'alice', tenant: 'desk-a', tenants: ['desk-a'], queues: ['default'], admin: false };
    expect(describeUser(who)).toBe('alice · desk-a');
    expect(describeUser({ ...who, tenant: null })).toMatch(/^alice · no desk/);
  });
});
