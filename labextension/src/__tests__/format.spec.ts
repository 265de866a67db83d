import {
  aheadWords,
  attemptWords,
  describeUser,
  elapsedBetween,
  eventWords,
  formatAge,
  formatBytes,
  formatElapsed,
  formatGpuHours,
  formatUntil,
  isJobId,
  isTerminal,
  pendingWords,
  phaseLabel
} from '../format';
import type { components } from '../generated/api';

type PendingView = components['schemas']['PendingView'];
type EventView = components['schemas']['EventView'];

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

describe('ages, sizes and GPU-hours', () => {
  const now = new Date('2025-01-01T10:00:00Z');
  it.each([
    ['2025-01-01T09:59:58Z', 'just now'],
    ['2025-01-01T09:59:18Z', '42s ago'],
    ['2025-01-01T09:57:00Z', '3m ago'],
    ['2025-01-01T07:00:00Z', '3h ago'],
    ['2024-12-28T10:00:00Z', '4d ago']
  ])('%p is %p', (iso, text) => {
    expect(formatAge(iso, now)).toBe(text);
  });

  it.each([
    [0, '0 B'],
    [512, '512 B'],
    [1536, '1.50 KiB'],
    [12.5 * 2 ** 20, '12.5 MiB'],
    [300 * 2 ** 30, '300 GiB']
  ])('%p bytes read %p', (n, text) => {
    expect(formatBytes(n)).toBe(text);
  });

  it('GPU-hours', () => {
    expect(formatGpuHours(0)).toBe('0');
    expect(formatGpuHours(0.004)).toBe('0.004');
    expect(formatGpuHours(0.4234)).toBe('0.42');
    expect(formatGpuHours(12.34)).toBe('12.3');
    expect(formatGpuHours(1234.5)).toBe('1235');
  });
});

describe('pendingWords', () => {
  const now = new Date('2025-01-01T10:00:00Z');
  const pending: PendingView = {
    code: 'QuotaExhausted',
    message: 'desk-a uses 2 of its 2 local GPUs and the cohort has none to lend.',
    position: 2,
    flavor: 'local',
    needs: 2,
    available: 1,
    ahead: [{ job_id: 'cs-0123456789ab', cluster_queue: 'desk-a', gpus: 2, why: 'next in queue' }],
    estimated_start: '2025-01-01T10:05:00Z'
  };

  it('says why, where in the queue, what it needs and when it may start', () => {
    expect(pendingWords(pending, now)).toEqual([
      'desk-a uses 2 of its 2 local GPUs and the cohort has none to lend.',
      'It is number 2 in its queue.',
      'It needs 2 GPUs local; 1 is free for it now.',
      'Estimated start: in 5m 00s (if every job ahead runs to its time limit).'
    ]);
    expect(aheadWords(pending.ahead![0])).toBe('cs-0123456789ab (desk-a): 2 GPUs, next in queue');
  });

  it('says when the start is unknown, or next', () => {
    const words = pendingWords({ ...pending, position: 1, estimated_start: null, needs: 0 }, now);
    expect(words).toEqual([pending.message, 'It is next in its queue.', 'Estimated start: unknown.']);
    expect(formatUntil('2025-01-01T09:00:00Z', now)).toBe('any moment now');
  });
});

describe('attempts and events', () => {
  const now = new Date('2025-01-01T10:00:00Z');
  const attempt = {
    number: 2,
    backend: 'slurm',
    backend_ref: '17',
    state: 'FAILED' as const,
    gpu_ids: [],
    submitted_at: '2025-01-01T09:58:00Z',
    started_at: '2025-01-01T09:58:10Z',
    ended_at: '2025-01-01T09:59:00Z',
    exit_code: 1,
    end_reason: 'NodeFailure',
    last_heartbeat: null,
    failed_nodes: ['node3']
  };

  it('reads an attempt with its end reason', () => {
    expect(attemptWords(attempt, now)).toBe('#2 on slurm · failed: NodeFailure (exit 1) on node3 after 50s');
    expect(
      attemptWords({ ...attempt, state: 'RUNNING', ended_at: null, exit_code: null, end_reason: null, failed_nodes: [] }, now)
    ).toBe('#2 on slurm · running for 1m 50s');
    expect(attemptWords({ ...attempt, state: 'SUCCEEDED', exit_code: 0, end_reason: 'Succeeded', failed_nodes: [] }, now)).toBe(
      '#2 on slurm · succeeded after 50s'
    );
  });

  it('reads an event as a phase move with its reason', () => {
    const event: EventView = {
      id: 1,
      job_id: 'cs-0123456789ab',
      at: '2025-01-01T09:58:00Z',
      kind: 'phase',
      attempt: null,
      from_phase: 'PENDING',
      to_phase: 'ADMITTED',
      reason: 'QuotaReserved',
      message: 'on local',
      actor: null
    };
    expect(eventWords(event)).toBe('PENDING → ADMITTED · QuotaReserved: on local');
    expect(eventWords({ ...event, from_phase: null, kind: 'phase', to_phase: 'PENDING', reason: 'Submitted', message: null })).toBe(
      'PENDING · Submitted'
    );
    expect(eventWords({ ...event, kind: 'cancel', from_phase: null, to_phase: null, reason: 'CancelRequested', message: null, actor: 'alice' })).toBe(
      'cancel · CancelRequested (by alice)'
    );
  });

  it('knows terminal phases and job ids', () => {
    expect(isTerminal('CANCELLED')).toBe(true);
    expect(isTerminal('RECOVERING')).toBe(false);
    expect(isJobId('cs-0123456789ab')).toBe(true);
    expect(isJobId('cs-0123456789abc')).toBe(false);
    expect(isJobId('../whoami')).toBe(false);
  });
});
