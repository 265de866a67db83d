/** The desk's quota: per cluster queue and flavor, GPUs used of nominal and borrowed (and CPUs
 * and memory where a queue has a quota on them); GPU-hours so far; each of the user's desks'
 * budget (spent of it, its warning, whether it holds new work). */
import { BudgetView, budgets, QueueUsage, quota } from '../api';
import {
  budgetLine,
  IBudgetLine,
  IQuotaLine,
  formatGpuHours,
  quotaLines,
  quotasCpuOrMemory,
  waitingWords
} from '../format';
import { errorWords, PanelView } from '../panel-view';
import { Poller } from '../poller';
import { h } from './dom';

type FlavorUsage = QueueUsage['flavors'][number];

export class QuotaView extends PanelView {
  constructor(
    private readonly fetch: () => Promise<QueueUsage[]> = quota,
    private readonly fetchBudgets: () => Promise<BudgetView[]> = budgets
  ) {
    super('Desk quota');
    this.addClass('jp-cellscale-quota');
  }

  /** Fetch and render now; rejects after showing the error (so a poller backs off). */
  async refresh(): Promise<void> {
    try {
      // the budgets are a part of the view: when they cannot be read, the quota still shows
      const [queues, desks] = await Promise.all([
        this.fetch(),
        this.fetchBudgets().catch((error: unknown) => errorWords(error))
      ]);
      this.render(queues, desks);
    } catch (error) {
      this.showError(error);
      throw error;
    }
  }

  /** Keep it current (GPU-hours grow while jobs run) while the panel is shown. */
  readonly poller = new Poller(() => this.refresh(), 10_000);

  private render(queues: QueueUsage[], desks: BudgetView[] | string): void {
    const budgetPart =
      typeof desks === 'string'
        ? h('p', { className: 'jp-cellscale-budget-error', text: `Budgets: ${desks}` })
        : desks.length
          ? h(
              'div',
              { className: 'jp-cellscale-budgets', attrs: { role: 'group', 'aria-label': 'Budgets' } },
              ...desks.map(b => budget(budgetLine(b)))
            )
          : null;
    if (!queues.length) {
      this.body.replaceChildren(
        h('p', { className: 'jp-cellscale-empty', text: 'Your desk has no quota yet (ask an admin).' }),
        budgetPart ?? ''
      );
      return;
    }
    const resources = quotasCpuOrMemory(queues);
    this.body.replaceChildren(...queues.map(q => this.queue(q, resources)), budgetPart ?? '');
  }

  /** One queue's table; with a resource column where CPUs or memory are quota'd (`resources`). */
  private queue(q: QueueUsage, resources: boolean): HTMLElement {
    const columns = ['flavor', ...(resources ? ['resource'] : []), 'used / nominal', 'borrowed', ''];
    const table = h(
      'table',
      { className: 'jp-cellscale-table', attrs: { 'aria-label': `Quota of ${q.cluster_queue}` } },
      h('thead', {}, h('tr', {}, ...columns.map(text => h('th', { attrs: { scope: 'col' }, text })))),
      ...q.flavors.map(f => this.flavor(q.cluster_queue, f, resources))
    );
    return h(
      'div',
      { className: 'jp-cellscale-queue', dataset: { queue: q.cluster_queue } },
      h('div', {
        className: 'jp-cellscale-queue-name',
        text: q.cohort ? `${q.cluster_queue} (cohort ${q.cohort})` : q.cluster_queue
      }),
      table,
      h('p', {
        className: 'jp-cellscale-gpu-hours',
        dataset: { field: 'gpu-hours' },
        text: `${formatGpuHours(q.gpu_hours)} GPU-hours so far · ${waitingWords(q, resources)}`
      })
    );
  }

  /** A flavor's rows, a group of them: one per resource it shows, the flavor named once. */
  private flavor(queue: string, f: FlavorUsage, resources: boolean): HTMLTableSectionElement {
    const lines = quotaLines(f);
    const rows = lines.map((line, i) =>
      h(
        'tr',
        { dataset: { queue, flavor: f.flavor, resource: line.resource } },
        i === 0 && h('th', { attrs: { scope: 'rowgroup', rowspan: String(lines.length) }, text: f.flavor }),
        resources && h('td', { className: 'jp-cellscale-resource', text: line.label }),
        h('td', { className: 'jp-cellscale-used', text: line.usedText }),
        h('td', { className: 'jp-cellscale-borrowed', text: line.borrowedText }),
        h('td', {}, meter(line))
      )
    );
    return h('tbody', {}, ...rows);
  }
}

/** Used within nominal, and borrowed beyond it, on a scale of whichever is larger. */
function meter(line: IQuotaLine): HTMLElement {
  const max = Math.max(line.nominal, line.used, 1);
  return h(
    'div',
    {
      className: 'jp-cellscale-meter',
      attrs: { role: 'img', 'aria-label': line.description },
      dataset: { over: String(line.used > line.nominal) }
    },
    h('div', {
      className: 'jp-cellscale-meter-used',
      attrs: { style: `width: ${(100 * Math.min(line.used, line.nominal)) / max}%` }
    }),
    h('div', {
      className: 'jp-cellscale-meter-borrowed',
      attrs: { style: `width: ${(100 * line.borrowed) / max}%` }
    })
  );
}

/** A desk's budget: spent of it with a bar, the warning once one is crossed, and whether it
 * holds the desk's new work. */
function budget(line: IBudgetLine): HTMLElement {
  return h(
    'div',
    { className: 'jp-cellscale-budget', dataset: { tenant: line.tenant, holding: String(line.holding) } },
    h('div', { className: 'jp-cellscale-queue-name', text: `${line.tenant} budget` }),
    h(
      'div',
      {
        className: 'jp-cellscale-meter',
        attrs: { role: 'img', 'aria-label': line.description },
        dataset: { over: String(line.fraction >= 1) }
      },
      h('div', {
        className: line.fraction >= 1 ? 'jp-cellscale-meter-borrowed' : 'jp-cellscale-meter-used',
        attrs: { style: `width: ${100 * Math.min(Math.max(line.fraction, 0), 1)}%` }
      })
    ),
    h('p', {
      className: 'jp-cellscale-budget-spent',
      dataset: { field: 'budget' },
      text: `${line.spentText} · ${line.percentText}`
    }),
    line.warning && h('p', { className: 'jp-cellscale-budget-warning', text: line.warning }),
    line.holding && h('p', { className: 'jp-cellscale-budget-holding', text: 'holding new work' })
  );
}
