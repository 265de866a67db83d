/** The desk's quota: per cluster queue and flavor, GPUs used of nominal and borrowed; GPU-hours so far. */
import { QueueUsage, quota } from '../api';
import { formatGpuHours, plural } from '../format';
import { PanelView } from '../panel-view';
import { Poller } from '../poller';
import { h } from './dom';

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
    this.body.replaceChildren(...queues.map(q => this.queue(q)));
  }

  private queue(q: QueueUsage): HTMLElement {
    const rows = q.flavors.map(f => {
      const over = f.used > f.nominal;
      const max = Math.max(f.nominal, f.used, 1);
      const label = `${f.used} used of ${f.nominal} nominal, ${f.borrowed} borrowed`;
      const bar = h(
        'div',
        { className: 'jp-cellscale-meter', attrs: { role: 'img', 'aria-label': label }, dataset: { over: String(over) } },
        h('div', {
          className: 'jp-cellscale-meter-used',
          attrs: { style: `width: ${(100 * Math.min(f.used, f.nominal)) / max}%` }
        }),
        h('div', {
          className: 'jp-cellscale-meter-borrowed',
          attrs: { style: `width: ${(100 * f.borrowed) / max}%` }
        })
      );
      return h(
        'tr',
        { dataset: { queue: q.cluster_queue, flavor: f.flavor } },
        h('th', { attrs: { scope: 'row' }, text: f.flavor }),
        h('td', { className: 'jp-cellscale-used', text: `${f.used} / ${f.nominal}` }),
        h('td', { className: 'jp-cellscale-borrowed', text: String(f.borrowed) }),
        h('td', {}, bar)
      );
    });
    const table = h(
      'table',
      { className: 'jp-cellscale-table', attrs: { 'aria-label': `Quota of ${q.cluster_queue}` } },
      h(
        'thead',
        {},
        h(
          'tr',
          {},
          h('th', { attrs: { scope: 'col' }, text: 'flavor' }),
          h('th', { attrs: { scope: 'col' }, text: 'used / nominal' }),
          h('th', { attrs: { scope: 'col' }, text: 'borrowed' }),
          h('th', { attrs: { scope: 'col' }, text: '' })
        )
      ),
      h('tbody', {}, ...rows)
    );
    const waiting = q.pending_jobs
      ? `${plural(q.pending_jobs, 'job')} waiting for ${plural(q.pending_gpus, 'GPU')}`
      : 'nothing waiting';
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
        text: `${formatGpuHours(q.gpu_hours)} GPU-hours so far · ${waiting}`
      })
    );
  }
}
