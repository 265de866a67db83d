/**
 * A sweep's points in its detail view: its progress line and bar always (from the job itself,
 * no extra call), and, only when asked ("Show points"), a table of its points fetched from
 * the relayed points route: the failed ones first where there are any, then every point in
 * index order, PAGE at a time ("More points"). While the table is shown and the sweep runs,
 * the points that changed are fetched (since= the newest stamp seen) at most every 2 s.
 */
import { jobPoints, JobView, PointView, SweepProgress } from '../api';
import {
  formatWall,
  isTerminal,
  orderPoints,
  paramsText,
  plural,
  pointTone,
  sweepLine
} from '../format';
import { errorWords } from '../panel-view';
import { button, h, sweepBar } from './dom';

/** Points per page of the table. */
export const PAGE = 200;
/** Changed points per request while following (the route's default page). */
const CHANGES_PAGE = 1000;
/** Stamps are commit times in microseconds, not strictly in commit order: ask a little back. */
const STAMP_OVERLAP_US = 10_000_000;
const CHANGES_EVERY_MS = 2000;
/** The table's columns: heading, and the class that aligns numbers. */
const COLUMNS: [string, string][] = [
  ['#', 'jp-cellscale-num'],
  ['params', ''],
  ['status', ''],
  ['tries', 'jp-cellscale-num'],
  ['node', ''],
  ['wall', 'jp-cellscale-num'],
  ['error', '']
];
let panes = 0;

export class PointsPane {
  constructor(
    private readonly jobId: string,
    private readonly jobName: string
  ) {
    this.toggle = button('Show points', () => void this.setShown(!this.shown), {
      title: 'List this sweep’s points: their values, status, tries, node, wall time and error'
    });
    this.toggle.setAttribute('aria-expanded', 'false');
    this.more = button('More points', () => void this.loadMore(), { title: `The next ${PAGE} points` });
    this.more.hidden = true;
    this.table = h(
      'table',
      { className: 'jp-cellscale-table jp-cellscale-points', attrs: { 'aria-label': `Points of ${jobName}` } },
      h(
        'thead',
        {},
        h(
          'tr',
          {},
          ...COLUMNS.map(([text, className]) => h('th', { className, attrs: { scope: 'col' }, text }))
        )
      ),
      this.rows
    );
    this.box.hidden = true;
    this.box.append(this.info, this.problem, h('div', { className: 'jp-cellscale-pointsscroll' }, this.table), this.more);
    this.node.append(
      this.line,
      h('div', { className: 'jp-cellscale-sweepbox' }, this.bar, h('span', { className: 'jp-cellscale-actions' }, this.toggle)),
      this.box
    );
  }

  readonly node = h('div', { className: 'jp-cellscale-pointspane' });

  /** A newer view of the sweep (the list's push or the detail's poll). */
  update(job: JobView): void {
    this.job = job;
    const p = this.progress();
    this.line.textContent = p
      ? `${sweepLine(p, job.phase)} · up to ${plural(p.max_parallel, 'task')} at once`
      : 'no points counted yet';
    const bar = p ? sweepBar(p, `Points of ${this.jobName}`) : h('div');
    this.bar.replaceWith(bar);
    this.bar = bar;
    if (this.shown && this.loaded && !this.ended) {
      void this.followChanges();
    }
  }

  private progress(): SweepProgress | null {
    const job = this.job;
    if (!job) {
      return null;
    }
    if (job.sweep) {
      return job.sweep;
    }
    const spec = job.spec.sweep;
    if (!spec) {
      return null;
    }
    // not counted yet (just submitted): every point waits
    const none = { running: 0, done: 0, failed: 0, cached: 0, cancelled: 0, retried: 0, arrays: 0, eta_s: null };
    return { ...none, points: spec.points, queued: spec.points, max_parallel: spec.max_parallel };
  }

  private async setShown(shown: boolean): Promise<void> {
    this.shown = shown;
    this.box.hidden = !shown;
    this.toggle.textContent = shown ? 'Hide points' : 'Show points';
    this.toggle.setAttribute('aria-expanded', String(shown));
    if (shown) {
      await this.load();
    }
  }

  /** The first page afresh: the failed points (where there are any), then from index 0. */
  private async load(): Promise<void> {
    this.info.textContent = 'loading points…';
    this.problem.replaceChildren();
    try {
      const failed = this.progress()?.failed ? await jobPoints(this.jobId, { status: 'failed', limit: PAGE }) : null;
      const first = await jobPoints(this.jobId, { offset: 0, limit: PAGE });
      this.points = new Map();
      this.stamp = 0;
      this.ended = false;
      this.upTo = 0;
      for (const page of failed ? [failed, first] : [first]) {
        this.take(page.items, page.stamp, true);
      }
      this.upTo = first.items.length;
      this.more.hidden = first.items.length < PAGE;
      this.loaded = true;
      this.ended = !!this.job && isTerminal(this.job.phase);
      this.render();
    } catch (error) {
      this.info.textContent = '';
      this.problem.replaceChildren(h('p', { className: 'jp-cellscale-error', attrs: { role: 'alert' }, text: errorWords(error) }));
    }
  }

  private async loadMore(): Promise<void> {
    this.more.disabled = true;
    try {
      const page = await jobPoints(this.jobId, { offset: this.upTo, limit: PAGE });
      this.take(page.items, page.stamp, true);
      this.upTo += page.items.length;
      this.more.hidden = page.items.length < PAGE;
      this.render();
    } catch (error) {
      this.problem.replaceChildren(h('p', { className: 'jp-cellscale-error', attrs: { role: 'alert' }, text: errorWords(error) }));
    } finally {
      this.more.disabled = false;
    }
  }

  /** The points that changed since the newest stamp seen: those the table shows (or newly
   * failed ones, which go to the top); once the sweep has ended, one last time. */
  private async followChanges(): Promise<void> {
    const now = Date.now();
    const ending = !!this.job && isTerminal(this.job.phase);
    if (this.following || (!ending && now - this.followed < CHANGES_EVERY_MS)) {
      return;
    }
    this.following = true;
    this.followed = now;
    try {
      const since = Math.max(0, this.stamp - STAMP_OVERLAP_US);
      for (let offset = 0; ; offset += CHANGES_PAGE) {
        const page = await jobPoints(this.jobId, { since, offset, limit: CHANGES_PAGE });
        this.take(page.items, page.stamp, false);
        if (page.items.length < CHANGES_PAGE || offset >= 4 * CHANGES_PAGE) {
          break;
        }
      }
      this.ended = ending;
      this.problem.replaceChildren();
      this.render();
    } catch (error) {
      this.problem.replaceChildren(h('p', { className: 'jp-cellscale-error', attrs: { role: 'alert' }, text: errorWords(error) }));
    } finally {
      this.following = false;
    }
  }

  private take(items: PointView[], stamp: number, listed: boolean): void {
    for (const p of items) {
      const shown = listed || p.index < this.upTo || this.points.has(p.index) || p.status === 'failed';
      const seen = this.points.get(p.index);
      if (shown && (!seen || p.stamp >= seen.stamp)) {
        this.points.set(p.index, p);
      }
    }
    this.stamp = Math.max(this.stamp, stamp);
  }

  private render(): void {
    const ordered = orderPoints([...this.points.values()]);
    this.rows.replaceChildren(...([] as HTMLTableRowElement[]).concat(...ordered.map(p => this.row(p))));
    const total = this.progress()?.points ?? ordered.length;
    const failed = ordered.filter(p => p.status === 'failed').length;
    this.info.textContent =
      `${ordered.length} of ${plural(total, 'point')} shown` + (failed ? `; the ${failed} failed first` : '');
  }

  /** A point's row; a failed one's traceback in a full-width row below it, on demand. */
  private row(p: PointView): HTMLTableRowElement[] {
    const cells = [
      h('td', { className: 'jp-cellscale-num', text: String(p.index) }),
      h('td', { className: 'jp-cellscale-params', attrs: { title: paramsText(p.params, Infinity) }, text: paramsText(p.params) }),
      h('td', {}, h('span', { className: `jp-cellscale-badge jp-cellscale-tone-${pointTone(p.status)}`, text: p.status })),
      h('td', { className: 'jp-cellscale-num', text: String(p.tries) }),
      h('td', { text: p.node ?? '–' }),
      h('td', { className: 'jp-cellscale-num', text: formatWall(p.wall_s) }),
      h('td', { className: 'jp-cellscale-pointerror', attrs: { title: p.fault ?? '' } }, p.error ?? '')
    ];
    const row = h('tr', { dataset: { index: String(p.index), status: p.status } }, ...cells);
    if (!p.traceback) {
      return [row];
    }
    const id = `jp-cellscale-traceback-${this.uid}-${p.index}`;
    const open = this.openTracebacks.has(p.index);
    const below = h(
      'tr',
      { className: 'jp-cellscale-tracebackrow', attrs: { id }, dataset: { tracebackOf: String(p.index) } },
      h(
        'td',
        { attrs: { colspan: String(COLUMNS.length) } },
        h('pre', {
          className: 'jp-cellscale-traceback',
          attrs: { tabindex: '0', 'aria-label': `Traceback of point ${p.index}` },
          text: p.traceback
        })
      )
    );
    below.hidden = !open;
    const toggle = button('traceback', () => {
      const now = below.hidden;
      below.hidden = !now;
      toggle.setAttribute('aria-expanded', String(now));
      if (now) {
        this.openTracebacks.add(p.index);
      } else {
        this.openTracebacks.delete(p.index);
      }
    }, { ariaLabel: `Traceback of point ${p.index}`, className: 'jp-cellscale-linkbutton' });
    toggle.setAttribute('aria-expanded', String(open));
    toggle.setAttribute('aria-controls', id);
    cells[cells.length - 1].append(' ', toggle);
    return [row, below];
  }

  private readonly line = h('p', { className: 'jp-cellscale-sweepline', dataset: { field: 'sweep' } });
  private bar: HTMLElement = h('div');
  private readonly toggle: HTMLButtonElement;
  private readonly more: HTMLButtonElement;
  private readonly box = h('div', { className: 'jp-cellscale-pointsbox' });
  private readonly info = h('p', { className: 'jp-cellscale-pointsinfo', attrs: { role: 'status' } });
  private readonly problem = h('div', { className: 'jp-cellscale-problem' });
  private readonly rows = h('tbody');
  private readonly table: HTMLTableElement;
  private job: JobView | null = null;
  private points = new Map<number, PointView>();
  /** Points 0..upTo-1 are listed (the pages loaded in index order). */
  private upTo = 0;
  private stamp = 0;
  private shown = false;
  private loaded = false;
  private ended = false;
  private following = false;
  private followed = 0;
  private readonly openTracebacks = new Set<number>();
  private readonly uid = ++panes;
}
