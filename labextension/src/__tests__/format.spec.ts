import {
  aheadWords,
  attemptWords,
  budgetLine,
  checkpointsNone,
  clockDuration,
  costWords,
  describeUser,
  elapsedBetween,
  eventWords,
  formatAge,
  formatBytes,
  formatElapsed,
  formatGpuHours,
  formatMemory,
  formatUntil,
  formatUsd,
  formatWall,
  ioWords,
  isJobId,
  isTerminal,
  orderPoints,
  originShortText,
  originText,
  originUrl,
  paramsText,
  pendingWords,
  phaseLabel,
  pointTone,
  quotaLines,
  quotasCpuOrMemory,
  resourceWords,
  sweepDescription,
  sweepFractions,
  sweepLine,
  sweepShortText,
  waitingWords
} from '../format';
import type { components } from '../generated/api';

type PendingView = components['schemas']['PendingView'];
type EventView = components['schemas']['EventView'];
type JobView = components['schemas']['JobView'];
type Resources = components['schemas']['Resources'];
type QueueUsage = components['schemas']['QueueUsage'];
type FlavorUsage = components['schemas']['FlavorUsage'];
type BudgetView = components['schemas']['BudgetView'];
type IoProfileView = components['schemas']['IoProfileView'];
type JobCost = components['schemas']['JobCost'];
type CostEstimate = components['schemas']['CostEstimate'];
type SweepProgress = components['schemas']['SweepProgress'];
type PointView = components['schemas']['PointView'];
type Origin = components['schemas']['Origin'];

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
    ahead: [{ job_id: 'cs-0123456789ab', cluster_queue: 'desk-a', gpus: 2, why: 'next in queue', holds: '2 GPUs' }],
    estimated_start: '2025-01-01T10:05:00Z',
    resource: 'gpu'
  };

  it('says why, where in the queue, what it needs and when it may start', () => {
    expect(pendingWords(pending, now)).toEqual([
      'desk-a uses 2 of its 2 local GPUs and the cohort has none to lend.',
      'It is number 2 in its queue.',
      'It needs 2 GPUs on local; 1 is free for it now.',
      'Estimated start: in 5m 00s (if every job ahead runs to its time limit).'
    ]);
    expect(aheadWords(pending.ahead![0])).toBe('cs-0123456789ab (desk-a): 2 GPUs, next in queue');
  });

  it('puts the reason first and its details last', () => {
    const message =
      "waiting for 4 GPUs at once, 0 free to it: your job big1 holds 4 of the desk's GPUs. Details: the rest of the local quota of firm's tree is in use";
    expect(pendingWords({ ...pending, message, position: 1, estimated_start: null }, now)).toEqual([
      "waiting for 4 GPUs at once, 0 free to it: your job big1 holds 4 of the desk's GPUs.",
      'It is next in its queue.',
      'It needs 2 GPUs on local; 1 is free for it now.',
      'Estimated start: unknown.',
      "Details: the rest of the local quota of firm's tree is in use"
    ]);
  });

  it('names a job ahead and says what it holds: a CPU job holds CPUs, not GPUs', () => {
    const cpuJob = {
      job_id: 'cs-0123456789ab',
      cluster_queue: 'desk-b',
      gpus: 0,
      why: 'borrowing',
      holds: '16 CPUs',
      name: 'prep',
      owner: 'bob'
    };
    expect(aheadWords(cpuJob)).toBe('prep (cs-0123456789ab, desk-b): 16 CPUs, borrowing');
  });

  it('says when the start is unknown, or next', () => {
    const words = pendingWords({ ...pending, position: 1, estimated_start: null, needs: 0 }, now);
    expect(words).toEqual([pending.message, 'It is next in its queue.', 'Estimated start: unknown.']);
    expect(formatUntil('2025-01-01T09:00:00Z', now)).toBe('any moment now');
  });

  it('says how far staging its datasets onto its nodes has come', () => {
    const staging = 'staging bars: 3.1 of 8.0 GB onto node2, node3';
    const words = pendingWords({ ...pending, staging }, now);
    expect(words[words.length - 1]).toBe(`Data: ${staging}.`);
  });

  it.each([
    ['cpu' as const, 16, 4, 'It needs 16 CPUs on local; 4 are free for it now.'],
    ['cpu' as const, 1, 1, 'It needs 1 CPU on local; 1 is free for it now.'],
    ['memory' as const, 64 * 1024, 1536, 'It needs 64 GiB of memory on local; 1.5 GiB is free for it now.']
  ])('says what it needs of the resource it waits for (%p)', (resource, needs, available, text) => {
    expect(pendingWords({ ...pending, resource, needs, available }, now)[2]).toBe(text);
  });
});

describe('resources', () => {
  const job = (resources: Partial<Resources>): JobView =>
    ({ spec: { source: 'pass', resources } }) as unknown as JobView;

  it.each([
    [{ gpus_per_node: 2, tasks_per_node: 2 }, '2 GPUs · 2 CPUs'],
    [{ gpus_per_node: 2, tasks_per_node: 2, cpus_per_task: 4, memory_mb_per_node: 4096 }, '2 GPUs · 8 CPUs · 4 GiB'],
    [{ nodes: 2, gpus_per_node: 4, tasks_per_node: 4, cpus_per_task: 2, memory_mb_per_node: 65536 }, '8 GPUs · 16 CPUs · 128 GiB'],
    [{ gpus_per_node: 0, cpus_per_task: 8, memory_mb_per_node: 4096 }, '8 CPUs · 4 GiB'],
    [{ cpus_per_task: 1, memory_mb_per_node: null }, '1 CPU']
  ])('%p reads %p', (resources, text) => {
    expect(resourceWords(job(resources))).toBe(text);
  });

  it.each([
    [512, '512 MiB'],
    [1024, '1 GiB'],
    [1536, '1.5 GiB'],
    [2 * 2 ** 20, '2 TiB']
  ])('%p MiB reads %p', (mb, text) => {
    expect(formatMemory(mb)).toBe(text);
  });
});

describe('quota lines', () => {
  const gpuOnly: FlavorUsage = {
    flavor: 'local',
    backend: 'local',
    nominal: 2,
    borrowing_limit: null,
    lending_limit: null,
    used: 3,
    borrowed: 1,
    cpus_used: 3,
    cpu_nominal: null,
    memory_mb_used: 0,
    memory_mb_nominal: null
  };
  const queue = (flavors: FlavorUsage[], waiting: Partial<QueueUsage> = {}): QueueUsage => ({
    cluster_queue: 'desk-a',
    cohort: null,
    weight: 1,
    flavors,
    pending_jobs: 0,
    pending_gpus: 0,
    pending_cpus: 0,
    recent_gpus: 0,
    gpu_hours: 0,
    ...waiting
  });

  it('shows GPUs only where no queue has a CPU or memory quota', () => {
    expect(quotasCpuOrMemory([queue([gpuOnly])])).toBe(false);
    expect(quotaLines(gpuOnly)).toEqual([
      {
        resource: 'gpu',
        label: 'GPUs',
        used: 3,
        nominal: 2,
        borrowed: 1,
        usedText: '3 / 2',
        borrowedText: '1',
        description: '3 used of 2 nominal, 1 borrowed'
      }
    ]);
  });

  it('shows CPUs and memory against their quotas beside GPUs', () => {
    const quotad = { ...gpuOnly, cpus_used: 20, cpu_nominal: 16, memory_mb_used: 12 * 1024, memory_mb_nominal: 64 * 1024 };
    expect(quotasCpuOrMemory([queue([gpuOnly]), queue([quotad])])).toBe(true);
    const lines = quotaLines(quotad);
    expect(lines.map(l => [l.label, l.usedText, l.borrowedText])).toEqual([
      ['GPUs', '3 / 2', '1'],
      ['CPUs', '20 / 16', '4'],
      ['memory', '12 GiB / 64 GiB', '0 MiB']
    ]);
    expect(lines[2].description).toBe('12 GiB used of 64 GiB nominal, 0 MiB borrowed');
  });

  it('shows a CPU pool without its GPU line', () => {
    const pool = { ...gpuOnly, nominal: 0, used: 0, borrowed: 0, cpus_used: 8, cpu_nominal: 64 };
    expect(quotaLines(pool).map(l => l.resource)).toEqual(['cpu']);
  });

  it.each([
    [{}, false, 'nothing waiting'],
    [{ pending_jobs: 2, pending_gpus: 4, pending_cpus: 4 }, false, '2 jobs waiting for 4 GPUs'],
    [{ pending_jobs: 2, pending_gpus: 4, pending_cpus: 16 }, true, '2 jobs waiting for 4 GPUs · 16 CPUs'],
    [{ pending_jobs: 1, pending_gpus: 0, pending_cpus: 8 }, false, '1 job waiting for 8 CPUs']
  ])('what waits: %p (CPU quotas: %p) reads %p', (waiting, cpus, text) => {
    expect(waitingWords(queue([gpuOnly], waiting), cpus)).toBe(text);
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
    expect(attemptWords({ ...attempt, state: 'CANCELLED', exit_code: 241, end_reason: 'cancelled', failed_nodes: [] }, now)).toBe(
      '#2 on slurm · cancelled after 50s'
    );
  });

  it('says a job that ended without checkpoints has none, and one still running none yet', () => {
    expect(checkpointsNone({ phase: 'SUCCEEDED' })).toBe('no checkpoints');
    expect(checkpointsNone({ phase: 'CANCELLED' })).toBe('no checkpoints');
    expect(checkpointsNone({ phase: 'RUNNING' })).toBe('none committed yet');
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

describe('cost and budgets', () => {
  it.each([
    [0, '$0'],
    [0.42, '$0.42'],
    [5, '$5'],
    [84.4, '$84'],
    [1234.5, '$1,235']
  ])('%p dollars read %p', (usd, text) => {
    expect(formatUsd(usd)).toBe(text);
  });

  const cost: JobCost = {
    gpu_hours: 33.6,
    used_fraction: 0.41,
    usd: 84,
    idle_usd: 50,
    cpu_hours: 0,
    words: '16 GPU × 2.1 h = 33.6 GPU-h, 41% used, $84 ($50 idle)'
  };
  const estimate: CostEstimate = {
    gpus: 16,
    seconds: 7200,
    basis: 'history',
    runs: 3,
    usd_per_gpu_hour: 2.5,
    usd: 80,
    budget_fraction: 0.06,
    words: "≈16 GPU × 2.0 h ≈ $80, 6% of desk-a's weekly budget"
  };

  it("shows a job's cost in the ledger's words, and its estimate beside it", () => {
    expect(costWords({ cost, estimate })).toEqual([
      cost.words,
      "estimated: ≈16 GPU × 2.0 h ≈ $80, 6% of desk-a's weekly budget"
    ]);
    expect(costWords({ cost, estimate: null })).toEqual([cost.words]);
    // waiting: nothing spent yet, only the estimate
    expect(costWords({ cost: null, estimate })).toEqual([`estimated: ${estimate.words}`]);
    expect(costWords({})).toEqual([]);
  });

  const budget: BudgetView = {
    tenant: 'desk-a',
    period: 'week',
    usd: 100,
    gpu_hours: null,
    spent_usd: 42.2,
    spent_gpu_hours: 16.9,
    fraction: 0.422,
    warning: null,
    hard_stop: false,
    holding: false
  };

  it('shows a budget as spent of it, per period, with a percent', () => {
    expect(budgetLine(budget)).toEqual({
      tenant: 'desk-a',
      spentText: '$42 / $100 per week',
      fraction: 0.422,
      percentText: '42%',
      warning: null,
      holding: false,
      description: 'desk-a has spent 42% of its budget'
    });
    const both = budgetLine({ ...budget, gpu_hours: 40, period: 'day' });
    expect(both.spentText).toBe('$42 / $100 · 16.9 / 40.0 GPU-hours per day');
    const hours = budgetLine({ ...budget, usd: null, gpu_hours: 10, spent_gpu_hours: 3.2, period: 'month' });
    expect(hours.spentText).toBe('3.20 / 10.0 GPU-hours per month');
  });

  it("passes on the API's warning and says when the desk's new work is held", () => {
    const spent = budgetLine({
      ...budget,
      spent_usd: 104,
      fraction: 1.04,
      warning: 'past 100% of the budget: desk-a has spent $104 of its weekly $100',
      hard_stop: true,
      holding: true
    });
    expect(spent.percentText).toBe('104%');
    expect(spent.warning).toBe('past 100% of the budget: desk-a has spent $104 of its weekly $100');
    expect(spent.holding).toBe(true);
  });
});

describe('sweeps', () => {
  const progress = (counts: Partial<SweepProgress> = {}): SweepProgress => ({
    points: 250,
    queued: 0,
    running: 0,
    done: 0,
    failed: 0,
    cached: 0,
    cancelled: 0,
    retried: 0,
    max_parallel: 8,
    arrays: 1,
    eta_s: null,
    ...counts
  });

  it('reads a sweep in the job list as done (cached too) of all, and its failures', () => {
    expect(sweepShortText(progress({ done: 117, cached: 3, failed: 1, running: 8 }))).toBe('120/250 · 1 failed');
    expect(sweepShortText(progress({ done: 250 }))).toBe('250/250');
    expect(sweepShortText(progress({ points: 0 }))).toBe('0/0');
  });

  it('gives the bar its parts as fractions of the points: done and failed, never past 1', () => {
    expect(sweepFractions(progress({ done: 100, cached: 25, failed: 25 }))).toEqual({ done: 0.5, failed: 0.1 });
    expect(sweepFractions(progress({ done: 250 }))).toEqual({ done: 1, failed: 0 });
    expect(sweepFractions(progress({ points: 0 }))).toEqual({ done: 0, failed: 0 });
    // counts that disagree for a moment (a point counted twice) never overflow the bar
    const over = sweepFractions(progress({ points: 10, done: 9, failed: 3 }));
    expect(over.done).toBe(0.9);
    expect(over.failed).toBeCloseTo(0.1);
  });

  it('says the whole progress in one line, as the notebook does', () => {
    const p = progress({ done: 117, cached: 3, running: 8, failed: 1, eta_s: 42 });
    expect(sweepLine(p, 'RUNNING')).toBe('120/250 done · 8 running · 1 failed · 3 cached · ETA 0:42');
    expect(sweepLine(progress({ queued: 250 }), 'PENDING')).toBe('0/250 done · waiting');
    expect(sweepLine(progress({ done: 248, failed: 2, retried: 3, eta_s: 0 }), 'FAILED')).toBe(
      '248/250 done · 2 failed · 3 retried · job failed'
    );
    expect(sweepLine(progress({ done: 250 }), 'SUCCEEDED')).toBe('250/250 done · job succeeded');
    expect(sweepDescription(progress({ done: 120, failed: 1 }))).toBe('120 of 250 points done, 1 failed');
    expect(sweepDescription(progress({ points: 1, done: 1 }))).toBe('1 of 1 point done');
  });

  it.each([
    [0, '0:00'],
    [42.4, '0:42'],
    [725, '12:05'],
    [3725, '1:02:05'],
    [-3, '0:00']
  ])('reads %p seconds as a clock: %p', (seconds, text) => {
    expect(clockDuration(seconds)).toBe(text);
  });

  it('writes a point\'s values as k=v text, strings bare and the rest as JSON, cut when long', () => {
    expect(paramsText({ x: 3 })).toBe('x=3');
    expect(paramsText({ lr: 0.001, opt: 'adam', layers: [2, 4], wd: null, deep: { a: 1 } })).toBe(
      'lr=0.001, opt=adam, layers=[2,4], wd=null, deep={"a":1}'
    );
    expect(paramsText({})).toBe('');
    const long = paramsText({ name: 'n'.repeat(300) }, 20);
    expect(long).toHaveLength(20);
    expect(long.endsWith('…')).toBe(true);
  });

  it('reads wall times short: tenths under 10 s', () => {
    expect(formatWall(0.42)).toBe('0.4s');
    expect(formatWall(42)).toBe('42s');
    expect(formatWall(185)).toBe('3m 05s');
    expect(formatWall(null)).toBe('–');
    expect(formatWall(undefined)).toBe('–');
  });

  it('colours a point by its status', () => {
    expect(pointTone('failed')).toBe('bad');
    expect(pointTone('cached')).toBe('good');
    expect(pointTone('queued')).toBe('waiting');
  });

  it('lists the points failed first, then in index order, each once in its newest view', () => {
    const point = (index: number, status: PointView['status'], stamp = 1): PointView => ({
      index,
      params: { x: index },
      status,
      tries: 1,
      stamp
    });
    const ordered = orderPoints([
      point(0, 'done'),
      point(3, 'failed'),
      point(1, 'running'),
      point(1, 'done', 2),
      point(2, 'failed'),
      point(2, 'queued', 0) // older than the failed view of point 2
    ]);
    expect(ordered.map(p => [p.index, p.status])).toEqual([
      [2, 'failed'],
      [3, 'failed'],
      [0, 'done'],
      [1, 'done']
    ]);
    expect(orderPoints([point(1, 'done'), point(0, 'queued')]).map(p => p.index)).toEqual([0, 1]);
  });
});

describe('origins', () => {
  const origin = (fields: Partial<Origin> = {}): Origin => ({
    tool: 'dagster',
    run_id: '3f2a9c1e-5b7d-4e0f-9a21-8c6d0b4e7f13',
    step: 'model',
    asset: 'model',
    partitions: ['2026-11-30'],
    partition_count: 1,
    url: null,
    ...fields
  });
  const many = { asset: 'backtest', partitions: ['2026-01-02', '2026-01-05'], partition_count: 100 };

  it.each([
    [{}, 'dagster run 3f2a9c1e, asset model, partition 2026-11-30'],
    [many, 'dagster run 3f2a9c1e, asset backtest, 100 partitions from 2026-01-02'],
    [{ asset: null, partitions: [], partition_count: 0 }, 'dagster run 3f2a9c1e, step model'],
    [{ asset: null, step: null, partitions: [], partition_count: 0 }, 'dagster run 3f2a9c1e'],
    // a count beyond the names listed, none of them sent: the count alone
    [{ partitions: [], partition_count: 3 }, 'dagster run 3f2a9c1e, asset model, 3 partitions']
  ])('says %p as the notebook does: %p', (fields, text) => {
    expect(originText(origin(fields))).toBe(text);
  });

  it.each([
    [{}, 'dagster · model · 2026-11-30'],
    [many, 'dagster · backtest · 100 partitions'],
    [{ asset: null, step: 'train', partitions: [], partition_count: 0 }, 'dagster · train'],
    [{ asset: null, step: null, partitions: [], partition_count: 0 }, 'dagster · run 3f2a9c1e']
  ])('reads %p in a job-list row as %p', (fields, text) => {
    expect(originShortText(origin(fields))).toBe(text);
  });

  it.each([
    ['https://dagster.example/runs/3f2a9c1e', 'https://dagster.example/runs/3f2a9c1e'],
    ['http://localhost:3000/runs/3f2a9c1e', 'http://localhost:3000/runs/3f2a9c1e'],
    ['javascript:alert(1)', null],
    [' JavaScript:alert(1)', null],
    ['data:text/html,<script>alert(1)</script>', null],
    ['/runs/3f2a9c1e', null],
    ['not a url', null],
    [null, null]
  ])('links the run only at an http(s) URL: %p gives %p', (url, href) => {
    expect(originUrl(origin({ url }))).toBe(href);
  });
});

describe('I/O profile', () => {
  const io: IoProfileView = {
    attempt: 1,
    verdict: 'not I/O-bound: 1% of step time in reads (92% from the node cache)',
    io_bound: false,
    blocked_fraction: 0.01,
    bytes: 1_300_000_000,
    cache_hit_ratio: 0.92,
    sources: [
      { source: 'cache', bytes: 1200 * 2 ** 20, reads: 900, read_s: 1.3, mb_per_s: 960.4 },
      { source: 's3://md', bytes: 100 * 2 ** 20, reads: 40, read_s: 2, mb_per_s: null }
    ],
    rank_count: 0,
    ranks: [],
    staging: []
  };

  it('says its verdict, then where the reads came from', () => {
    expect(ioWords(io)).toEqual([
      'not I/O-bound: 1% of step time in reads (92% from the node cache)',
      'cache 1.17 GiB at 960 MB/s · s3://md 100 MiB'
    ]);
  });

  it('says only its verdict when nothing was read', () => {
    expect(ioWords({ ...io, sources: [] })).toEqual([io.verdict]);
  });
});
