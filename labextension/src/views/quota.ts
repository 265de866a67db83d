/** The desk's quota: per cluster queue and flavor, GPUs used of nominal and borrowed (and CPUs
 * and memory where a queue has a quota on them); GPU-hours so far. */
import { QueueUsage, quota } from '../api';
import { IQuotaLine, formatGpuHours, quotaLines, quotasCpuOrMemory, waitingWords } from '../format';
import { PanelView } from '../panel-view';
import { Poller } from '../poller';
import { h } from './dom';

type FlavorUsage = QueueUsage['flavors'][number];

export class QuotaView extends PanelView {
  constructor(private readonly fetch: () => Promise<QueueUsage[]> = quota) {
    super('Desk quota');
    this.addClass('jp-cellscale-quota');
  }

  /** Fetch and render now; rejects after showing the error (so a poller backs off). */
  async refresh(): Promise<void> {
    try {
      this.render(await this.fetch());
    } catch (error) {
      this.showError(error);
      throw error;
    }
  }

  /** Keep it current (GPU-hours grow while jobs run) while the panel is shown. */
  readonly poller = new Poller(() => this.refresh(), 10_000);

  private render(queues: QueueUsage[]): void {
    if (!queues.length) {
      this.body.replaceChildren(
        h('p', { className: 'jp-cellscale-empty', text: 'Your desk has no quota yet (ask an admin).' })
      );
      return;
    }
    const resources = quotasCpuOrMemory(queues);
    this.body.replaceChildren(...queues.map(q => this.queue(q, resources)));
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
