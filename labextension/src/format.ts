/** Pure display helpers (no DOM, no JupyterLab): unit-tested with jest. */
import type { Schemas } from './api';

type Phase = Schemas['Phase'];
type WhoAmI = Schemas['WhoAmI'];

/** How a phase reads in the panel, and the tone its badge takes. */
export interface IPhaseLabel {
  label: string;
  tone: 'waiting' | 'active' | 'good' | 'bad' | 'muted';
}

// A Record over the generated Phase union: a phase added to the API fails to compile here.
const PHASES: Record<Phase, IPhaseLabel> = {
  PENDING: { label: 'waiting for admission', tone: 'waiting' },
  ADMITTED: { label: 'admitted', tone: 'active' },
  STARTING: { label: 'starting', tone: 'active' },
  RUNNING: { label: 'running', tone: 'active' },
  RECOVERING: { label: 'recovering', tone: 'waiting' },
  SUCCEEDED: { label: 'succeeded', tone: 'good' },
  FAILED: { label: 'failed', tone: 'bad' },
  CANCELLED: { label: 'cancelled', tone: 'muted' }
};

export function phaseLabel(phase: Phase): IPhaseLabel {
  return PHASES[phase] ?? { label: String(phase).toLowerCase(), tone: 'muted' };
}

/** A duration in milliseconds as the panel shows it: 42s, 3m 05s, 1h 02m, 2d 3h. */
export function formatElapsed(ms: number): string {
  if (!Number.isFinite(ms) || ms < 0) {
    return '–';
  }
  const s = Math.floor(ms / 1000);
  const pad = (n: number) => String(n).padStart(2, '0');
  if (s < 60) {
    return `${s}s`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)}m ${pad(s % 60)}s`;
  }
  if (s < 86400) {
    return `${Math.floor(s / 3600)}h ${pad(Math.floor((s % 3600) / 60))}m`;
  }
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

/** Time from an ISO start to an ISO end, or to `now` while it is still going. */
export function elapsedBetween(
  start: string | null,
  end: string | null,
  now: Date = new Date()
): string {
  if (!start) {
    return '–';
  }
  const to = end ? Date.parse(end) : now.getTime();
  return formatElapsed(to - Date.parse(start));
}

/** "alice · desk-a", or says that the user is in no desk yet. */
export function describeUser(who: WhoAmI): string {
  const desk = who.tenant ?? 'no desk (ask an admin to add you to one)';
  return `${who.user} · ${desk}`;
}

type PendingView = Schemas['PendingView'];
type AttemptView = Schemas['AttemptView'];
type EventView = Schemas['EventView'];

/** How long ago an ISO time was: "just now", "42s ago", "3m ago", "2h ago", "4d ago". */
export function formatAge(iso: string | null | undefined, now: Date = new Date()): string {
  if (!iso) {
    return '–';
  }
  const s = Math.floor((now.getTime() - Date.parse(iso)) / 1000);
  if (!Number.isFinite(s)) {
    return '–';
  }
  if (s < 5) {
    return 'just now';
  }
  if (s < 60) {
    return `${s}s ago`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)}m ago`;
  }
  if (s < 86400) {
    return `${Math.floor(s / 3600)}h ago`;
  }
  return `${Math.floor(s / 86400)}d ago`;
}

/** A size in bytes, binary units: 512 B, 1.5 KiB, 12.0 MiB, 3.25 GiB. */
export function formatBytes(n: number): string {
  if (!Number.isFinite(n) || n < 0) {
    return '–';
  }
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  if (i === 0) {
    return `${n} B`;
  }
  return `${n < 10 ? n.toFixed(2) : n < 100 ? n.toFixed(1) : Math.round(n)} ${units[i]}`;
}

/** "in 5m", "any moment now" (a time already passed), from now to an ISO time. */
export function formatUntil(iso: string, now: Date = new Date()): string {
  const ms = Date.parse(iso) - now.getTime();
  if (!Number.isFinite(ms)) {
    return 'unknown';
  }
  return ms <= 0 ? 'any moment now' : `in ${formatElapsed(ms)}`;
}

/** Why a job waits, in plain sentences for the panel: the control plane's first sentence
 * first (what it waits for, and who has it), its details (quotas, cohorts) last. */
export function pendingWords(pending: PendingView, now: Date = new Date()): string[] {
  const [headline, details] = pending.message.split(/(?<=\.) (?=Details: )/, 2);
  const words = [headline];
  words.push(
    pending.position === 1
      ? 'It is next in its queue.'
      : `It is number ${pending.position} in its queue.`
  );
  if (pending.needs > 0) {
    words.push(needsWords(pending));
  }
  words.push(
    pending.estimated_start
      ? `Estimated start: ${formatUntil(pending.estimated_start, now)} (if every job ahead runs to its time limit).`
      : 'Estimated start: unknown.'
  );
  if (pending.staging) {
    words.push(`Data: ${pending.staging}.`);
  }
  if (details) {
    words.push(details);
  }
  return words;
}

/** What a waiting job needs of the resource it waits for, and what is free to it:
 * "It needs 2 GPUs on local; 1 is free for it now.", "It needs 64 GiB of memory on slurm; 16 GiB is free…". */
function needsWords(pending: PendingView): string {
  const on = pending.flavor ? ` on ${pending.flavor}` : '';
  const { needs, available } = pending;
  if (pending.resource === 'memory') {
    return `It needs ${formatMemory(needs)} of memory${on}; ${formatMemory(available)} is free for it now.`;
  }
  const noun = pending.resource === 'cpu' ? 'CPU' : 'GPU';
  return `It needs ${plural(needs, noun)}${on}; ${available} ${available === 1 ? 'is' : 'are'} free for it now.`;
}

/** One job in the way of a waiting one, with what it holds of the resource in the way:
 * "big1 (cs-…, desk-b): 2 GPUs, borrowing", "cs-… (desk-b): 16 CPUs, within its quota". */
export function aheadWords(ahead: NonNullable<PendingView['ahead']>[number]): string {
  const who = ahead.name ? `${ahead.name} (${ahead.job_id}, ${ahead.cluster_queue})` : `${ahead.job_id} (${ahead.cluster_queue})`;
  return `${who}: ${ahead.holds}, ${ahead.why}`;
}

/** The checkpoint list when it is empty: a job that ended without any has "no checkpoints". */
export function checkpointsNone(job: Pick<Schemas['JobView'], 'phase'>): string {
  return isTerminal(job.phase) ? 'no checkpoints' : 'none committed yet';
}

/** An attempt in one line: "#1 on local · succeeded after 42s", "#2 on slurm · failed: NodeFailure (exit 1) on node3". */
export function attemptWords(attempt: AttemptView, now: Date = new Date()): string {
  const state = attempt.state.toLowerCase();
  let text = `#${attempt.number} on ${attempt.backend} · ${state}`;
  if (attempt.end_reason && attempt.end_reason.toLowerCase() !== state) {
    text += `: ${attempt.end_reason}`;
  }
  // a cancelled attempt's exit code is how it was stopped (241, a signal): "cancelled" says it
  if (attempt.exit_code !== null && attempt.exit_code !== 0 && attempt.state !== 'CANCELLED') {
    text += ` (exit ${attempt.exit_code})`;
  }
  if (attempt.failed_nodes?.length) {
    text += ` on ${attempt.failed_nodes.join(', ')}`;
  }
  if (attempt.started_at) {
    text += ` ${attempt.ended_at ? 'after' : 'for'} ${elapsedBetween(attempt.started_at, attempt.ended_at, now)}`;
  }
  return text;
}

/** A timeline event in one line: "PENDING → ADMITTED · Admitted: on local". */
export function eventWords(event: EventView): string {
  const move =
    event.to_phase && event.from_phase
      ? `${event.from_phase} → ${event.to_phase}`
      : (event.to_phase ?? event.kind);
  const why = [event.reason, event.message].filter(Boolean).join(': ');
  const who = event.actor && event.kind === 'cancel' ? ` (by ${event.actor})` : '';
  return why ? `${move} · ${why}${who}` : `${move}${who}`;
}

/** "1 GPU", "3 GPUs". */
export function plural(n: number, noun: string): string {
  return `${n} ${noun}${n === 1 ? '' : 's'}`;
}

/** GPU-hours with sensible precision: 0.004, 0.42, 12.5, 1234. */
export function formatGpuHours(hours: number): string {
  if (hours < 0.01) {
    return hours === 0 ? '0' : hours.toFixed(3);
  }
  return hours < 10 ? hours.toFixed(2) : hours < 100 ? hours.toFixed(1) : String(Math.round(hours));
}

const TERMINAL: ReadonlySet<Phase> = new Set<Phase>(['SUCCEEDED', 'FAILED', 'CANCELLED']);

/** A job in a terminal phase never changes again. */
export function isTerminal(phase: Phase): boolean {
  return TERMINAL.has(phase);
}

/** A job id as the control plane mints them (the server extension refuses anything else). */
export function isJobId(id: string): boolean {
  return /^cs-[0-9a-f]{12}$/.test(id);
}

/** What a job asks for, as the notebook shows it too: "2 GPUs · 8 CPUs · 4 GiB"; a CPU job's
 * without GPUs ("8 CPUs"); memory only where it asked for some (--mem). The spec's defaults
 * where it left a field out. */
export function resourceWords(job: Schemas['JobView']): string {
  const r = job.spec.resources;
  const nodes = r?.nodes ?? 1;
  const gpus = nodes * (r?.gpus_per_node ?? 0);
  const cpus = nodes * (r?.tasks_per_node ?? 1) * (r?.cpus_per_task ?? 1);
  const memory = nodes * (r?.memory_mb_per_node ?? 0);
  return [gpus ? plural(gpus, 'GPU') : '', plural(cpus, 'CPU'), memory ? formatMemory(memory) : '']
    .filter(Boolean)
    .join(' · ');
}

/** A memory size in MiB as people read it: 512 MiB, 4 GiB, 1.5 GiB, 2 TiB. */
export function formatMemory(mb: number): string {
  const units = ['MiB', 'GiB', 'TiB'];
  let i = 0;
  while (mb >= 1024 && i < units.length - 1) {
    mb /= 1024;
    i++;
  }
  return `${Math.round(mb * 10) / 10} ${units[i]}`;
}

type QueueUsage = Schemas['QueueUsage'];
type FlavorUsage = Schemas['FlavorUsage'];

/** One resource of a flavor in the quota view: its use against the queue's quota there. */
export interface IQuotaLine {
  resource: Schemas['Resource'];
  /** "GPUs", "CPUs", "memory". */
  label: string;
  used: number;
  nominal: number;
  borrowed: number;
  /** "2 / 2", "6 / 16", "12 GiB / 64 GiB". */
  usedText: string;
  borrowedText: string;
  /** For screen readers: "6 used of 16 nominal, 0 borrowed". */
  description: string;
}

/** Whether the quota view shows CPUs and memory at all: only where a queue has a quota on
 * them, so a GPU-only deployment's view stays as it was. */
export function quotasCpuOrMemory(queues: QueueUsage[]): boolean {
  return queues.some(q => q.flavors.some(f => f.cpu_nominal != null || f.memory_mb_nominal != null));
}

/** A flavor's lines in the quota view: GPUs (not for a CPU pool, where none are quota'd or
 * held), then CPUs and memory where the queue has a quota on them. */
export function quotaLines(f: FlavorUsage): IQuotaLine[] {
  const cpuOrMemory = f.cpu_nominal != null || f.memory_mb_nominal != null;
  const lines: IQuotaLine[] = [];
  if (!(cpuOrMemory && f.nominal === 0 && f.used === 0)) {
    lines.push(quotaLine('gpu', 'GPUs', f.used, f.nominal, f.borrowed, String));
  }
  if (f.cpu_nominal != null) {
    lines.push(quotaLine('cpu', 'CPUs', f.cpus_used, f.cpu_nominal, Math.max(0, f.cpus_used - f.cpu_nominal), String));
  }
  if (f.memory_mb_nominal != null) {
    const over = Math.max(0, f.memory_mb_used - f.memory_mb_nominal);
    lines.push(quotaLine('memory', 'memory', f.memory_mb_used, f.memory_mb_nominal, over, formatMemory));
  }
  return lines;
}

function quotaLine(
  resource: Schemas['Resource'],
  label: string,
  used: number,
  nominal: number,
  borrowed: number,
  show: (n: number) => string
): IQuotaLine {
  return {
    resource,
    label,
    used,
    nominal,
    borrowed,
    usedText: `${show(used)} / ${show(nominal)}`,
    borrowedText: show(borrowed),
    description: `${show(used)} used of ${show(nominal)} nominal, ${show(borrowed)} borrowed`
  };
}

/** What a queue's waiting jobs want: "2 jobs waiting for 4 GPUs", "… for 4 GPUs · 16 CPUs"
 * (CPUs beside GPUs where `cpus`: the view shows CPU quotas), "1 job waiting for 8 CPUs". */
export function waitingWords(q: QueueUsage, cpus: boolean): string {
  if (!q.pending_jobs) {
    return 'nothing waiting';
  }
  const wants = [
    q.pending_gpus ? plural(q.pending_gpus, 'GPU') : '',
    q.pending_cpus && (cpus || !q.pending_gpus) ? plural(q.pending_cpus, 'CPU') : ''
  ].filter(Boolean);
  const jobs = `${plural(q.pending_jobs, 'job')} waiting`;
  return wants.length ? `${jobs} for ${wants.join(' · ')}` : jobs;
}

type BudgetView = Schemas['BudgetView'];

/** Dollars as the panel shows them: "$0.42", "$84", "$1,234". */
export function formatUsd(usd: number): string {
  const digits = Math.abs(usd) < 10 && usd !== Math.round(usd) ? 2 : 0;
  return `$${usd.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits })}`;
}

/** What a job cost and was expected to cost, each in the control plane's own words:
 * "16 GPU × 2.1 h = 33.6 GPU-h, 41% used, $84 ($50 idle)" and "estimated: ≈16 GPU × 2.0 h ≈ $84, …".
 * Empty when the job has neither (it has not started and no estimate was made). */
export function costWords(job: Pick<Schemas['JobView'], 'cost' | 'estimate'>): string[] {
  const words: string[] = [];
  if (job.cost?.words) {
    words.push(job.cost.words);
  }
  if (job.estimate?.words) {
    words.push(`estimated: ${job.estimate.words}`);
  }
  return words;
}

/** A job's I/O profile in the panel's I/O row: its verdict, then where its reads came from
 * ("cache 1.1 GiB at 960 MB/s · s3://md 100 MiB at 52 MB/s"), as `%cluster status` shows it. */
export function ioWords(io: Schemas['IoProfileView']): string[] {
  const sources = (io.sources ?? []).map(
    s => `${s.source} ${formatBytes(s.bytes)}${s.mb_per_s ? ` at ${Math.round(s.mb_per_s)} MB/s` : ''}`
  );
  return sources.length ? [io.verdict, sources.join(' · ')] : [io.verdict];
}

/** A desk's budget in the quota view. */
export interface IBudgetLine {
  tenant: string;
  /** "$42 / $100 per week", "3.20 / 10.0 GPU-hours per day", both joined with " · ". */
  spentText: string;
  /** Spent of the budget, 0–1 (the larger of dollars and GPU-hours; may pass 1). */
  fraction: number;
  /** "42%". */
  percentText: string;
  /** The API's warning, when a warn_at threshold is crossed. */
  warning: string | null;
  /** Spent with a hard stop: the desk's new work waits. */
  holding: boolean;
  /** For screen readers: "desk-a has spent 42% of its budget". */
  description: string;
}

const PERIOD: Record<string, string> = { day: 'per day', week: 'per week', month: 'per month' };

export function budgetLine(b: BudgetView): IBudgetLine {
  const parts: string[] = [];
  if (b.usd !== null && b.usd !== undefined) {
    parts.push(`${formatUsd(b.spent_usd)} / ${formatUsd(b.usd)}`);
  }
  if (b.gpu_hours !== null && b.gpu_hours !== undefined) {
    parts.push(`${formatGpuHours(b.spent_gpu_hours)} / ${formatGpuHours(b.gpu_hours)} GPU-hours`);
  }
  const percent = `${Math.round(b.fraction * 100)}%`;
  return {
    tenant: b.tenant,
    spentText: `${parts.join(' · ')} ${PERIOD[b.period] ?? `per ${b.period}`}`,
    fraction: b.fraction,
    percentText: percent,
    warning: b.warning ?? null,
    holding: b.holding,
    description: `${b.tenant} has spent ${percent} of its budget`
  };
}

type SweepProgress = Schemas['SweepProgress'];
type PointView = Schemas['PointView'];
type PointStatus = Schemas['PointStatus'];

/** Seconds as a clock reads them, as the notebook's progress line does: 0:42, 12:05, 1:02:05. */
export function clockDuration(seconds: number): string {
  const s = Math.max(0, Math.round(Number.isFinite(seconds) ? seconds : 0));
  const pad = (n: number) => String(n).padStart(2, '0');
  const hours = Math.floor(s / 3600);
  const minutes = Math.floor((s % 3600) / 60);
  return hours ? `${hours}:${pad(minutes)}:${pad(s % 60)}` : `${minutes}:${pad(s % 60)}`;
}

/** A sweep in the job list, in a few characters: "120/250", "120/250 · 1 failed" (done counts
 * the cached points too: both have their results). */
export function sweepShortText(p: SweepProgress): string {
  const text = `${p.done + p.cached}/${p.points}`;
  return p.failed ? `${text} · ${p.failed} failed` : text;
}

/** The parts of a sweep's bar, each a fraction of its points (0–1, together at most 1):
 * done (and cached) in one colour, failed in another. */
export interface ISweepFractions {
  done: number;
  failed: number;
}

export function sweepFractions(p: SweepProgress): ISweepFractions {
  if (!(p.points > 0)) {
    return { done: 0, failed: 0 };
  }
  const part = (n: number) => Math.min(1, Math.max(0, n / p.points));
  const done = part(p.done + p.cached);
  return { done, failed: Math.min(1 - done, part(p.failed)) };
}

/** A sweep's progress in one line, as the notebook shows it under its cell:
 * "120/250 done · 8 running · 1 failed · 3 cached · ETA 0:42"; while it waits, "waiting";
 * once it ended, how ("job succeeded"), and "· 2 retried" where points needed another try. */
export function sweepLine(p: SweepProgress, phase?: Phase): string {
  const parts = [`${p.done + p.cached}/${p.points} done`];
  const counts: [number, string][] = [
    [p.running, 'running'],
    [p.failed, 'failed'],
    [p.cached, 'cached'],
    [p.cancelled, 'cancelled'],
    [p.retried, 'retried']
  ];
  for (const [count, word] of counts) {
    if (count) {
      parts.push(`${count} ${word}`);
    }
  }
  if (phase && isTerminal(phase)) {
    parts.push(`job ${phaseLabel(phase).label}`);
  } else if (phase === 'PENDING') {
    parts.push('waiting');
  } else if (p.eta_s !== null && p.eta_s !== undefined) {
    parts.push(`ETA ${clockDuration(p.eta_s)}`);
  }
  return parts.join(' · ');
}

/** For screen readers and the bar's tooltip: "120 of 250 points done, 1 failed". */
export function sweepDescription(p: SweepProgress): string {
  const done = `${p.done + p.cached} of ${plural(p.points, 'point')} done`;
  return p.failed ? `${done}, ${p.failed} failed` : done;
}

/** One value of a point as `k=v` shows it: strings as they are, everything else as JSON. */
function paramValue(value: unknown): string {
  if (typeof value === 'string') {
    return value;
  }
  if (value === undefined) {
    return 'undefined';
  }
  return JSON.stringify(value) ?? String(value);
}

/** A point's values as text: "lr=0.001, opt=adam, layers=[2,4]", cut at `max` characters
 * with "…" (the full text is the cell's tooltip). */
export function paramsText(params: Record<string, unknown>, max = 120): string {
  const text = Object.entries(params)
    .map(([k, v]) => `${k}=${paramValue(v)}`)
    .join(', ');
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

// A Record over the generated PointStatus union: a status added to the API fails to compile here.
const POINT_TONES: Record<PointStatus, IPhaseLabel['tone']> = {
  queued: 'waiting',
  running: 'active',
  done: 'good',
  cached: 'good',
  failed: 'bad',
  cancelled: 'muted'
};

/** The tone of a point's status badge (the phase badges' colours). */
export function pointTone(status: PointStatus): IPhaseLabel['tone'] {
  return POINT_TONES[status] ?? 'muted';
}

/** A point's wall time: "0.4s", "42s", "3m 05s"; "–" before it ran. */
export function formatWall(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds) || seconds < 0) {
    return '–';
  }
  return seconds < 10 ? `${seconds.toFixed(1)}s` : formatElapsed(seconds * 1000);
}

/** The points as the table lists them: each once (its newest view, by stamp), the failed
 * ones first where there are any, each group in index order. */
export function orderPoints(points: PointView[]): PointView[] {
  const newest = new Map<number, PointView>();
  for (const p of points) {
    const seen = newest.get(p.index);
    if (!seen || p.stamp >= seen.stamp) {
      newest.set(p.index, p);
    }
  }
  const rank = (p: PointView) => (p.status === 'failed' ? 0 : 1);
  return [...newest.values()].sort((a, b) => rank(a) - rank(b) || a.index - b.index);
}

type Origin = Schemas['Origin'];

/** The run a job belongs to, in parts, as `%cluster status` says it: "dagster run 3f2a9c1e",
 * then its asset (or step), then its partition or how many ("100 partitions from 2026-01-02"). */
export function originWords(origin: Origin): string[] {
  const what = origin.asset ? `asset ${origin.asset}` : origin.step ? `step ${origin.step}` : '';
  return [`${origin.tool} run ${origin.run_id.slice(0, 8)}`, what, partitionWords(origin)].filter(Boolean);
}

/** "partition 2026-11-30", "100 partitions from 2026-01-02"; empty for an unpartitioned run. */
function partitionWords(origin: Origin): string {
  const first = origin.partitions?.[0];
  if (origin.partition_count === 1 && first) {
    return `partition ${first}`;
  }
  if (origin.partition_count > 1) {
    return `${origin.partition_count} partitions${first ? ` from ${first}` : ''}`;
  }
  return '';
}

/** "dagster run 3f2a9c1e, asset model, partition 2026-11-30": the notebook's words. */
export function originText(origin: Origin): string {
  return originWords(origin).join(', ');
}

/** An origin in a job-list row, in a few words: "dagster · model · 2026-11-30",
 * "dagster · backtest · 100 partitions" (its step, or its run, where it names no asset). */
export function originShortText(origin: Origin): string {
  const count = origin.partition_count;
  const partitions = count === 1 ? (origin.partitions?.[0] ?? '') : count > 1 ? `${count} partitions` : '';
  const what = origin.asset || origin.step || `run ${origin.run_id.slice(0, 8)}`;
  return [origin.tool, what, partitions].filter(Boolean).join(' · ');
}

/** The link to the run in the engine's UI where it is an http(s) URL; null for anything else
 * (a `javascript:` or `data:` URL, a relative one, none). */
export function originUrl(origin: Origin): string | null {
  try {
    const url = new URL(origin.url ?? '');
    return url.protocol === 'http:' || url.protocol === 'https:' ? url.href : null;
  } catch {
    return null;
  }
}
