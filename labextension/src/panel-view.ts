import { Widget } from '@lumino/widgets';

import { ApiError } from './api';
import { h } from './views/dom';

/** One view of the panel: a titled part that fetches, renders and shows its own errors. */
export abstract class PanelView extends Widget {
  constructor(title: string) {
    super();
    this.addClass('jp-cellscale-view');
    const id = `jp-cellscale-view-${++views}`;
    this.heading = h('h3', { className: 'jp-cellscale-view-title', attrs: { id }, text: title });
    this.body = h('div', { className: 'jp-cellscale-view-body' });
    this.node.setAttribute('role', 'region');
    this.node.setAttribute('aria-labelledby', id);
    this.node.append(this.heading, this.body);
  }

  abstract refresh(): Promise<void>;

  /** The error in place of the body (or in `where`), in words. */
  protected showError(error: unknown, where: HTMLElement = this.body): void {
    where.replaceChildren(h('p', { className: 'jp-cellscale-error', attrs: { role: 'alert' }, text: errorWords(error) }));
  }

  protected readonly heading: HTMLHeadingElement;
  protected readonly body: HTMLDivElement;
}

/** What went wrong, for a person: the control plane's reason and status, or that it is unreachable. */
export function errorWords(error: unknown): string {
  return error instanceof ApiError
    ? `${error.message} (HTTP ${error.status})`
    : `cannot reach cellscale: ${(error as Error)?.message ?? error}`;
}

let views = 0;
