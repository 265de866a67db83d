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
