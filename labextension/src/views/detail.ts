/**
 * One job: phase and reason, the workflow run that submitted it (where one did), its I/O verdict
 * (once an attempt that read its datasets ended), actions
 * (cancel, attach in notebook, copy id), why it waits, a sweep's progress and (on demand) its
 * points, its attempts with their end reasons, its phase timeline, its checkpoints, its live
 * log and the exact script the backend runs. The job, its events and checkpoints are polled
 * (2 s, with backoff) until it ends; the log is live (LogPane).
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';

import {
  cancelJob,
  CheckpointView,
  EventView,
  getJob,
  jobCheckpoints,
  jobEvents,
  JobView,
  jobRender,
  Origin,
  WhoAmI
} from '../api';
import {
  aheadWords,
  attemptWords,
  checkpointsNone,
  costWords,
  eventWords,
  formatAge,
  formatBytes,
  ioWords,
  isTerminal,
  originUrl,
  originWords,
  pendingWords,
  resourceWords
} from '../format';
import { errorWords, PanelView } from '../panel-view';
import { Poller } from '../poller';
import { button, h, phaseBadge, section } from './dom';
import { LogPane } from './logs';
import { PointsPane } from './points';

export namespace JobDetailView {
  export interface IOptions {
    /** Who is looking: only a job's owner (or an admin) may cancel it. */
    whoami: () => WhoAmI | null;
    /** Insert `%cluster attach ID` into the active notebook; says what it did. */
    attach: (jobId: string) => string;
  }
}

export class JobDetailView extends PanelView {
  constructor(private readonly options: JobDetailView.IOptions) {
    super('Job');
    this.addClass('jp-cellscale-detail');
    this.hide();
  }

  get job(): JobView | null {
    return this._job;
  }

  /** Show a job (from a click in the list): everything about it, live. */
  open(job: JobView): void {
    if (this._job?.id !== job.id) {
      this.stop();
      this.logs = new LogPane(job.id, job.title);
      this.points = job.sweep || job.spec.sweep ? new PointsPane(job.id, job.title) : null;
      this.events = [];
      this.checkpoints = [];
      this._job = job;
      this.build();
    }
    this.setJob(job);
    this.show();
    this.start();
  }

  /** A newer view of the shown job (from the live list or the poller). */
  setJob(job: JobView): void {
    if (job.id !== this._job?.id) {
      return;
    }
    const ended = isTerminal(job.phase) && !isTerminal(this._job.phase);
    this._job = job;
    this.renderJob();
    if (ended) {
      void this.refresh(); // the last events and checkpoints; then the poller stops
    }
  }

  start(): void {
    if (this._job) {
      this.poller.start();
      this.logs?.start();
    }
  }

  stop(): void {
    this.poller.stop();
    this.logs?.stop();
  }

  async refresh(): Promise<void> {
    const job = this._job;
    if (!job) {
      return;
    }
    try {
      const [fresh, events, checkpoints] = await Promise.all([
        getJob(job.id),
        jobEvents(job.id),
        jobCheckpoints(job.id)
      ]);
      if (this._job?.id !== job.id) {
        return;
      }
      this.events = events;
      this.checkpoints = checkpoints;
      this.problem.replaceChildren();
      this.setJob(fresh);
      this.renderTimeline();
      this.renderCheckpoints();
      if (isTerminal(fresh.phase)) {
        this.poller.stop();
      }
    } catch (error) {
      this.showError(error, this.problem);
      throw error;
    }
  }

  dispose(): void {
    this.stop();
    super.dispose();
  }

  private build(): void {
    const job = this._job!;
    this.heading.textContent = `Job ${job.title}`;
    this.cancel = button('Cancel job', () => void this.confirmCancel(), {
      ariaLabel: `Cancel job ${job.title}`,
      className: 'jp-cellscale-danger'
    });
    const attach = button('Attach in notebook', () => this.say(this.options.attach(job.id)), {
      title: `Insert %cluster attach ${job.id} into the active notebook`
    });
    const copy = button('Copy id', () => void this.copyId(), { ariaLabel: `Copy job id ${job.id}` });
    this.script = h('pre', { className: 'jp-cellscale-script', attrs: { tabindex: '0', 'aria-label': 'Backend script' } });
    const scriptBox = h('details', { className: 'jp-cellscale-scriptbox' }, h('summary', { text: 'Backend script, as run' }), this.script);
    scriptBox.addEventListener('toggle', () => {
      if (scriptBox.open) {
        void this.loadScript();
      }
    });
    this.body.replaceChildren(
      this.summary,
      // from the spec, which never changes: built once, so its link keeps focus while the job updates
      ...(job.spec.origin ? [originFacts(job.spec.origin)] : []),
      this.io,
      h('div', { className: 'jp-cellscale-actions', attrs: { role: 'group', 'aria-label': 'Job actions' } }, this.cancel, attach, copy),
      this.notice,
      this.problem,
      this.pending,
      ...(this.points ? [section('Points', 'points', this.points.node)] : []),
      section('Logs', 'logs', this.logs!.node),
      section('Checkpoints', 'checkpoints', this.ckpts),
      section('Attempts', 'attempts', this.attempts),
      section('Timeline', 'timeline', this.timeline),
      scriptBox
    );
    this.notice.textContent = '';
    this.renderTimeline();
    this.renderCheckpoints();
  }

  private renderJob(): void {
    const job = this._job!;
    const who = this.options.whoami();
    this.summary.replaceChildren(
      phaseBadge(job.phase),
      h('code', { className: 'jp-cellscale-jobid', text: job.id }),
      h('span', {
        className: 'jp-cellscale-jobmeta',
        text: `${job.owner} · ${job.queue} · ${resourceWords(job)} · ${job.spec.launcher ?? 'torchrun'}`
      }),
      // what it cost so far (the ledger) and, beside it, what it was estimated to cost
      h(
        'p',
        { className: 'jp-cellscale-cost', dataset: { field: 'cost' } },
        ...costWords(job).map((text, i) =>
          h('span', {
            className: i === 0 && job.cost ? 'jp-cellscale-cost-actual' : 'jp-cellscale-cost-estimate',
            text: i ? ` · ${text}` : text
          })
        )
      ),
      // a waiting job's reason is the first line of "Why it waits" below
      h('p', { className: 'jp-cellscale-reason', text: job.pending ? '' : (job.reason ?? '') })
    );
    this.renderIo(job);
    this.points?.update(job);
    const mayCancel = !!who && (who.admin || who.user === job.owner);
    this.cancel.disabled = isTerminal(job.phase) || job.cancel_requested || !mayCancel;
    this.cancel.title = !mayCancel
      ? `only ${job.owner} (or an admin) can cancel it`
      : job.cancel_requested
        ? 'cancel requested'
        : '';
    if (job.pending) {
      this.pending.hidden = false;
      const ahead = job.pending.ahead ?? [];
      this.pending.replaceChildren(
        h('h4', { className: 'jp-cellscale-section-title', text: 'Why it waits' }),
        ...pendingWords(job.pending).map(text => h('p', { text }))
      );
      if (ahead.length) {
        this.pending.append(
          h('ul', { attrs: { 'aria-label': 'Jobs ahead of it' } }, ...ahead.map(a => h('li', { text: aheadWords(a) })))
        );
      }
    } else {
      this.pending.hidden = true;
      this.pending.replaceChildren();
    }
    this.attempts.replaceChildren(
      ...(job.attempts.length
        ? job.attempts.map(a => h('li', { dataset: { attempt: String(a.number), state: a.state }, text: attemptWords(a) }))
        : [h('li', { className: 'jp-cellscale-empty', text: 'none yet' })])
    );
  }

  /** "I/O: not I/O-bound: 1% of step time in reads (92% from the node cache)", and where the reads
   * came from: once an attempt that read through cellscale.datasets has ended. */
  private renderIo(job: JobView): void {
    const io = job.io;
    this.io.hidden = !io;
    this.io.replaceChildren(
      ...(io ? [h('dt', { text: 'I/O' }), ...ioWords(io).map(text => h('dd', { dataset: { field: 'io' }, text }))] : [])
    );
  }

  private renderTimeline(): void {
    this.timeline.replaceChildren(
      ...(this.events.length
        ? this.events.map(e =>
            h(
              'li',
              { dataset: { kind: e.kind } },
              h('time', { attrs: { datetime: e.at }, text: new Date(e.at).toLocaleTimeString() }),
              ` ${eventWords(e)}`
            )
          )
        : [h('li', { className: 'jp-cellscale-empty', text: 'loading…' })])
    );
  }

  private renderCheckpoints(): void {
    this.ckpts.replaceChildren(
      ...(this.checkpoints.length
        ? this.checkpoints.map(c =>
            h(
              'li',
              { dataset: { step: String(c.step) }, attrs: { title: c.url } },
              h('span', { className: 'jp-cellscale-step', text: `step ${c.step}` }),
              ` · ${formatBytes(c.size_bytes)} · ${formatAge(c.committed_at)} · attempt ${c.attempt}`
            )
          )
        : [h('li', { className: 'jp-cellscale-empty', text: checkpointsNone(this._job!) })])
    );
  }

  private async loadScript(): Promise<void> {
    const job = this._job!;
    if (!job.attempts.length) {
      // the script is written when an attempt starts (a dry run is %%cluster --dry-run)
      this.script.textContent = 'It has not started yet: the backend script is written when it starts.';
      return;
    }
    this.script.textContent = 'loading…';
    try {
      const view = await jobRender(job.id);
      this.script.textContent = view.script;
    } catch (error) {
      this.script.textContent = errorWords(error);
    }
  }

  private async confirmCancel(): Promise<void> {
    const job = this._job!;
    const answer = await showDialog({
      title: `Cancel ${job.title}?`,
      body: `${job.id} stops on every node; its checkpoints are kept.`,
      buttons: [Dialog.cancelButton({ label: 'Keep running' }), Dialog.warnButton({ label: 'Cancel job' })]
    });
    if (!answer.button.accept) {
      return;
    }
    try {
      this.setJob(await cancelJob(job.id));
      this.say(`Cancel requested for ${job.id}.`);
      this.poller.start();
    } catch (error) {
      this.say(`Could not cancel: ${errorWords(error)}`);
    }
  }

  private async copyId(): Promise<void> {
    const id = this._job!.id;
    try {
      await navigator.clipboard.writeText(id);
      this.say(`Copied ${id}.`);
    } catch {
      this.say(`Could not copy (the browser refused); the id is ${id}.`);
    }
  }

  private say(text: string): void {
    this.notice.textContent = text;
  }

  private readonly poller = new Poller(() => this.refresh(), 2000);
  private readonly summary = h('div', { className: 'jp-cellscale-summary' });
  private readonly io = h('dl', { className: 'jp-cellscale-facts jp-cellscale-io', attrs: { 'aria-label': 'I/O profile' } });
  private readonly notice = h('p', { className: 'jp-cellscale-notice', attrs: { role: 'status' } });
  private readonly problem = h('div', { className: 'jp-cellscale-problem' });
  private readonly pending = h('div', { className: 'jp-cellscale-pending', attrs: { role: 'note' } });
  private readonly attempts = h('ol', { className: 'jp-cellscale-attempts', attrs: { 'aria-label': 'Attempts' } });
  private readonly timeline = h('ol', { className: 'jp-cellscale-timeline', attrs: { 'aria-label': 'Timeline' } });
  private readonly ckpts = h('ul', { className: 'jp-cellscale-ckptlist', attrs: { 'aria-label': 'Checkpoints' } });
  private cancel!: HTMLButtonElement;
  private script!: HTMLPreElement;
  private logs: LogPane | null = null;
  private points: PointsPane | null = null;
  private _job: JobView | null = null;
  private events: EventView[] = [];
  private checkpoints: CheckpointView[] = [];
}

/** "From: dagster run 3f2a9c1e, asset model, partition 2026-11-30", the run a link to the
 * engine's UI (a new tab) where its URL is http(s). */
function originFacts(origin: Origin): HTMLDListElement {
  const [run, ...rest] = originWords(origin);
  const href = originUrl(origin);
  const link =
    href &&
    h('a', {
      attrs: { href, target: '_blank', rel: 'noopener noreferrer', title: `${origin.tool} run ${origin.run_id}` },
      text: run
    });
  return h(
    'dl',
    { className: 'jp-cellscale-facts jp-cellscale-from' },
    h('dt', { text: 'From' }),
    h('dd', { dataset: { field: 'origin' } }, link || run, rest.length ? `, ${rest.join(', ')}` : '')
  );
}
