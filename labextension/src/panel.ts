/**
 * The side panel: a stack of small views, each owning one part of the DOM and one API call.
 * Jobs, logs and quota views join `WhoAmIView` by `addWidget` in `CellscalePanel`.
 */
import { Panel, Widget } from '@lumino/widgets';

import { ApiError, WhoAmI, whoami } from './api';
import { describeUser } from './format';
import { cellscaleIcon } from './icon';

/** One view of the panel: `refresh()` fetches and renders; errors are shown in place. */
export abstract class PanelView extends Widget {
  constructor(title: string) {
    super();
    this.addClass('jp-cellscale-view');
    const heading = document.createElement('h3');
    heading.className = 'jp-cellscale-view-title';
    heading.textContent = title;
    this.body = document.createElement('div');
    this.body.className = 'jp-cellscale-view-body';
    this.node.append(heading, this.body);
  }

  abstract refresh(): Promise<void>;

  protected showError(error: unknown): void {
    const p = document.createElement('p');
    p.className = 'jp-cellscale-error';
    p.textContent =
      error instanceof ApiError
        ? `${error.message} (HTTP ${error.status})`
        : `cannot reach cellscale: ${(error as Error)?.message ?? error}`;
    this.body.replaceChildren(p);
  }

  protected readonly body: HTMLDivElement;
}

/** Who the control plane thinks you are: user, desk, queues. */
export class WhoAmIView extends PanelView {
  constructor(private readonly fetch: () => Promise<WhoAmI> = whoami) {
    super('You');
    this.addClass('jp-cellscale-whoami');
  }

  async refresh(): Promise<void> {
    try {
      this.render(await this.fetch());
    } catch (error) {
      this.showError(error);
    }
  }

  private render(who: WhoAmI): void {
    const rows: [string, string][] = [
      ['user', who.user + (who.admin ? ' (admin)' : '')],
      ['desk', who.tenant ?? '—'],
      ['queues', who.queues.join(', ') || '—']
    ];
    const dl = document.createElement('dl');
    dl.className = 'jp-cellscale-facts';
    dl.title = describeUser(who);
    for (const [key, value] of rows) {
      const dt = document.createElement('dt');
      dt.textContent = key;
      const dd = document.createElement('dd');
      dd.textContent = value;
      dd.dataset.field = key;
      dl.append(dt, dd);
    }
    this.body.replaceChildren(dl);
  }
}

export class CellscalePanel extends Panel {
  constructor() {
    super();
    this.id = 'cellscale-panel';
    this.addClass('jp-cellscale-panel');
    this.title.icon = cellscaleIcon;
    this.title.caption = 'cellscale';

    const header = new Widget();
    header.addClass('jp-cellscale-header');
    const name = document.createElement('h2');
    name.textContent = 'cellscale';
    const refresh = document.createElement('button');
    refresh.className = 'jp-cellscale-refresh jp-mod-styled';
    refresh.textContent = 'Refresh';
    refresh.title = 'Ask the control plane again';
    refresh.addEventListener('click', () => void this.refresh());
    header.node.append(name, refresh);
    this.addWidget(header);

    this.views = [new WhoAmIView()];
    this.views.forEach(view => this.addWidget(view));
  }

  /** Refresh every view; they fail independently. */
  async refresh(): Promise<void> {
    await Promise.all(this.views.map(view => view.refresh()));
  }

  protected onAfterShow(): void {
    if (!this.loaded) {
      this.loaded = true;
      void this.refresh();
    }
  }

  private readonly views: PanelView[];
  private loaded = false;
}
