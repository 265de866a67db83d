/**
 * The side panel: a stack of small views, each owning one part of the DOM and its calls.
 * You (whoami), the desk's quota, the job list (live), and the chosen job's detail (live).
 * Feeds run only while the panel is shown.
 */
import { Panel, Widget } from '@lumino/widgets';

import { cellscaleIcon } from './icon';
import { PanelView } from './panel-view';
import { JobDetailView } from './views/detail';
import { button } from './views/dom';
import { JobsView } from './views/jobs';
import { QuotaView } from './views/quota';
import { WhoAmIView } from './views/whoami';

export { PanelView } from './panel-view';

export namespace CellscalePanel {
  export interface IOptions {
    /** Insert `%cluster attach ID` into the active notebook; returns what it did, in words. */
    attach: (jobId: string) => string;
  }
}

export class CellscalePanel extends Panel {
  constructor(options: CellscalePanel.IOptions) {
    super();
    this.id = 'cellscale-panel';
    this.addClass('jp-cellscale-panel');
    this.title.icon = cellscaleIcon;
    this.title.caption = 'cellscale: jobs, logs and quota';
    this.node.setAttribute('aria-label', 'cellscale');

    const header = new Widget();
    header.addClass('jp-cellscale-header');
    const name = document.createElement('h2');
    name.textContent = 'cellscale';
    header.node.append(
      name,
      button('Refresh', () => void this.refresh(), {
        title: 'Ask the control plane again',
        className: 'jp-cellscale-refresh'
      })
    );
    this.addWidget(header);

    this.whoami = new WhoAmIView();
    this.quota = new QuotaView();
    this.detail = new JobDetailView({ whoami: () => this.whoami.who, attach: options.attach });
    this.jobs = new JobsView({
      onSelect: job => {
        this.detail.open(job);
        this.detail.node.scrollIntoView({ block: 'start', behavior: 'smooth' });
      },
      onPage: page => {
        const shown = page.items.find(job => job.id === this.detail.job?.id);
        if (shown) {
          this.detail.setJob(shown);
        }
        this.quotaSoon();
      }
    });
    this.views = [this.whoami, this.quota, this.jobs, this.detail];
    this.views.forEach(view => this.addWidget(view));
  }

  /** Refresh every view now; they fail independently. */
  async refresh(): Promise<void> {
    const views = this.views.filter(view => view !== this.detail || this.detail.job);
    await Promise.all(views.map(view => view.refresh().catch(() => undefined)));
  }

  protected onAfterShow(): void {
    this.whoami.poller.start();
    this.quota.poller.start();
    this.jobs.start();
    this.detail.start();
  }

  protected onAfterHide(): void {
    this.whoami.poller.stop();
    this.quota.poller.stop();
    this.jobs.stop();
    this.detail.stop();
  }

  /** The list changed: jobs were admitted or ended, so the quota did too (once per burst). */
  private quotaSoon(): void {
    clearTimeout(this.quotaTimer);
    this.quotaTimer = setTimeout(() => void this.quota.refresh().catch(() => undefined), 500);
  }

  private readonly whoami: WhoAmIView;
  private readonly quota: QuotaView;
  private readonly jobs: JobsView;
  private readonly detail: JobDetailView;
  private readonly views: PanelView[];
  private quotaTimer: ReturnType<typeof setTimeout> | undefined;
}
