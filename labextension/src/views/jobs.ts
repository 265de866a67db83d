/**
 * My jobs or my desk's jobs, live: a scope toggle, a phase filter, a name search, and one
 * row per job (phase badge, title, elapsed time, GPUs, CPUs and memory; the owner in the desk scope;
 * the workflow run that submitted it, where one did).
 * Live through the relay's job-list websocket; polled with backoff while it is down.
 */
import { JobPage, JobQuery, JobView, listJobs, Phase, socketUrl } from '../api';
import {
  elapsedBetween,
  isTerminal,
  originShortText,
  originText,
  phaseLabel,
  resourceWords,
  sweepShortText
} from '../format';
import { FeedState, LiveFeed } from '../live';
import { PanelView } from '../panel-view';
import { button, h, phaseBadge, sweepBar } from './dom';

const PHASES: Phase[] = ['PENDING', 'ADMITTED', 'STARTING', 'RUNNING', 'RECOVERING', 'SUCCEEDED', 'FAILED', 'CANCELLED'];
const LIMIT = 50;

export namespace JobsView {
  export interface IOptions {
    /** A row was chosen. */
    onSelect: (job: JobView) => void;
    /** A new list arrived (live or polled). */
    onPage?: (page: JobPage) => void;
  }
}

export class JobsView extends PanelView {
  constructor(private readonly options: JobsView.IOptions) {
    super('Jobs');
    this.addClass('jp-cellscale-jobs');

    this.mine = button('Mine', () => this.setScope('mine'), { title: 'Jobs you submitted' });
    this.desk = button('Desk', () => this.setScope('tenant'), { title: "Every job of your desk's members" });
    const scope = h('div', { className: 'jp-cellscale-scope', attrs: { role: 'group', 'aria-label': 'Whose jobs' } }, this.mine, this.desk);

    this.phase = h('select', { className: 'jp-cellscale-select', attrs: { 'aria-label': 'Filter jobs by phase' } });
    this.phase.append(h('option', { attrs: { value: '' }, text: 'all phases' }));
    for (const p of PHASES) {
      this.phase.append(h('option', { attrs: { value: p }, text: phaseLabel(p).label }));
    }
    this.phase.addEventListener('change', () => this.restart());

    this.search = h('input', {
      className: 'jp-cellscale-search',
      attrs: { type: 'search', placeholder: 'search by name', 'aria-label': 'Search jobs by name' }
    });
    this.search.addEventListener('input', () => {
      clearTimeout(this.searchTimer);
      this.searchTimer = setTimeout(() => this.restart(), 300);
    });

    this.status = h('p', { className: 'jp-cellscale-feed', attrs: { role: 'status' } });
    this.list = h('ul', { className: 'jp-cellscale-joblist', attrs: { 'aria-label': 'Jobs' } });
    this.body.append(
      h('div', { className: 'jp-cellscale-filters' }, scope, this.phase, this.search),
      this.status,
      this.list
    );
    this.feed = new LiveFeed({
      url: () => socketUrl('/api/jobs/ws', this.query()),
      receive: page => this.render(page as JobPage),
      poll: async () => {
        this.render(await listJobs(this.query()));
        return false;
      },
      onState: (state, detail) => this.showState(state, detail)
    });
    this.setPressed();
  }

  get selectedId(): string | null {
    return this._selected;
  }

  /** Mark a job as the chosen one (e.g. after it was shown by id). */
  select(id: string | null): void {
    this._selected = id;
    for (const row of this.list.querySelectorAll<HTMLButtonElement>('button[data-job]')) {
      row.setAttribute('aria-current', String(row.dataset.job === id));
    }
  }

  /** One immediate fetch (the Refresh button), whatever the feed is doing. */
  async refresh(): Promise<void> {
    try {
      this.render(await listJobs(this.query()));
    } catch (error) {
      this.showError(error, this.list);
    }
  }

  start(): void {
    this.feed.start();
    if (this.ticker === undefined) {
      this.ticker = setInterval(() => this.tick(), 1000);
    }
  }

  stop(): void {
    this.feed.stop();
    clearInterval(this.ticker);
    this.ticker = undefined;
  }

  dispose(): void {
    this.stop();
    super.dispose();
  }

  private query(): JobQuery {
    return {
      scope: this.scope,
      phase: (this.phase.value || null) as Phase | null,
      name: this.search.value.trim() || null,
      limit: LIMIT
    };
  }

  private setScope(scope: 'mine' | 'tenant'): void {
    if (scope !== this.scope) {
      this.scope = scope;
      this.setPressed();
      this.restart();
    }
  }

  private setPressed(): void {
    this.mine.setAttribute('aria-pressed', String(this.scope === 'mine'));
    this.desk.setAttribute('aria-pressed', String(this.scope === 'tenant'));
    this.toggleClass('jp-mod-desk', this.scope === 'tenant');
  }

  private restart(): void {
    this.feed.stop();
    this.last = '';
    this.feed.start();
  }

  private showState(state: FeedState, detail?: string): void {
    const words: Record<FeedState, string> = {
      connecting: 'connecting…',
      live: 'live',
      polling: `reconnecting; updated by polling${detail ? ` (${detail})` : ''}`,
      finished: 'list closed by the server',
      stopped: 'paused while the panel is hidden'
    };
    this.status.textContent = words[state];
    this.status.dataset.state = state;
  }

  private render(page: JobPage): void {
    const text = JSON.stringify(page);
    if (text === this.last) {
      return;
    }
    this.last = text;
    this.jobs = page.items;
    this.list.replaceChildren(...page.items.map(job => this.row(job)));
    if (!page.items.length) {
      this.list.append(h('li', { className: 'jp-cellscale-empty', text: this.emptyWords() }));
    } else if (page.next_cursor) {
      this.list.append(h('li', { className: 'jp-cellscale-more', text: `the newest ${LIMIT} are shown; search by name for others` }));
    }
    this.options.onPage?.(page);
  }

  private emptyWords(): string {
    const filtered = this.phase.value || this.search.value.trim();
    return filtered
      ? 'No job matches.'
      : this.scope === 'mine'
        ? 'No jobs yet: run a cell with %%cluster on top.'
        : 'Your desk has no jobs yet.';
  }

  private row(job: JobView): HTMLLIElement {
    // no aria-label: the row's text (phase, name, elapsed, id, resources, owner, origin) is its accessible name
    const elapsed = h('span', { className: 'jp-cellscale-elapsed', text: this.elapsed(job) });
    const row = h(
      'button',
      {
        className: 'jp-cellscale-jobrow',
        attrs: { type: 'button', 'aria-current': String(job.id === this._selected) },
        dataset: { job: job.id, phase: job.phase }
      },
      phaseBadge(job.phase),
      h('span', { className: 'jp-cellscale-jobname', attrs: { title: job.title }, text: job.title }),
      elapsed,
      h('span', {
        className: 'jp-cellscale-jobmeta',
        text: [job.id, resourceWords(job), this.scope === 'tenant' ? job.owner : '']
          .filter(Boolean)
          .join(' · ')
      }),
      // a workflow's job: its tool, asset and partitions in a few words, the whole origin on hover
      job.spec.origin &&
        h('span', {
          className: 'jp-cellscale-origin',
          attrs: { title: originText(job.spec.origin) },
          dataset: { field: 'origin' },
          text: originShortText(job.spec.origin)
        }),
      // a sweep is one row: its points done (and failed) of all, the points themselves only
      // in its detail view, on demand
      job.sweep &&
        h(
          'span',
          { className: 'jp-cellscale-sweep', dataset: { field: 'sweep' } },
          sweepBar(job.sweep),
          h('span', { className: 'jp-cellscale-sweeptext', text: sweepShortText(job.sweep) })
        )
    );
    row.title = job.reason ?? '';
    row.addEventListener('click', () => {
      this.select(job.id);
      this.options.onSelect(job);
    });
    return h('li', {}, row);
  }

  /** Waiting since submit while pending; running time once it started; total once it ended. */
  private elapsed(job: JobView): string {
    return job.started_at
      ? elapsedBetween(job.started_at, job.finished_at)
      : isTerminal(job.phase)
        ? elapsedBetween(job.created_at, job.finished_at)
        : `waiting ${elapsedBetween(job.created_at, null)}`;
  }

  private tick(): void {
    for (const job of this.jobs) {
      if (!isTerminal(job.phase)) {
        const span = this.list.querySelector(`button[data-job="${job.id}"] .jp-cellscale-elapsed`);
        if (span) {
          span.textContent = this.elapsed(job);
        }
      }
    }
  }

  private readonly mine: HTMLButtonElement;
  private readonly desk: HTMLButtonElement;
  private readonly phase: HTMLSelectElement;
  private readonly search: HTMLInputElement;
  private readonly status: HTMLParagraphElement;
  private readonly list: HTMLUListElement;
  private readonly feed: LiveFeed;
  private scope: 'mine' | 'tenant' = 'mine';
  private jobs: JobView[] = [];
  private last = '';
  private _selected: string | null = null;
  private searchTimer: ReturnType<typeof setTimeout> | undefined;
  private ticker: ReturnType<typeof setInterval> | undefined;
}
