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

/** Why a job waits, in plain sentences for the panel (the control plane's words first). */
export function pendingWords(pending: PendingView, now: Date = new Date()): string[] {
  const words = [pending.message];
  words.push(
    pending.position === 1
      ? 'It is next in its queue.'
      : `It is number ${pending.position} in its queue.`
  );
  if (pending.needs > 0) {
    const flavor = pending.flavor ? ` ${pending.flavor}` : '';
    words.push(
      `It needs ${plural(pending.needs, 'GPU')}${flavor}; ${pending.available} ${pending.available === 1 ? 'is' : 'are'} free for it now.`
    );
  }
  words.push(
    pending.estimated_start
      ? `Estimated start: ${formatUntil(pending.estimated_start, now)} (if every job ahead runs to its time limit).`
      : 'Estimated start: unknown.'
  );
  return words;
}

/** One job in the way of a waiting one: "cs-… (desk-b): 2 GPUs, borrowing". */
export function aheadWords(ahead: NonNullable<PendingView['ahead']>[number]): string {
  return `${ahead.job_id} (${ahead.cluster_queue}): ${plural(ahead.gpus, 'GPU')}, ${ahead.why}`;
}

/** An attempt in one line: "#1 on local · succeeded after 42s", "#2 on slurm · failed: NodeFailure (exit 1) on node3". */
export function attemptWords(attempt: AttemptView, now: Date = new Date()): string {
  const state = attempt.state.toLowerCase();
  let text = `#${attempt.number} on ${attempt.backend} · ${state}`;
  if (attempt.end_reason && attempt.end_reason.toLowerCase() !== state) {
    text += `: ${attempt.end_reason}`;
  }
  if (attempt.exit_code !== null && attempt.exit_code !== 0) {
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

/** GPUs a job asked for: nodes × GPUs per node (the spec's defaults where it left them out). */
export function jobGpus(job: Schemas['JobView']): number {
  const resources = job.spec.resources;
  return (resources?.nodes ?? 1) * (resources?.gpus_per_node ?? 0);
}
