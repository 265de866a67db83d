/** Who the control plane thinks you are: user, desk, queues. */
import { WhoAmI, whoami } from '../api';
import { describeUser } from '../format';
import { PanelView } from '../panel-view';
import { Poller } from '../poller';
import { h } from './dom';

export class WhoAmIView extends PanelView {
  constructor(private readonly fetch: () => Promise<WhoAmI> = whoami) {
    super('You');
    this.addClass('jp-cellscale-whoami');
  }

  /** The last answer, or null before the first (or after a failure). */
  get who(): WhoAmI | null {
    return this._who;
  }

  /** Fetch and render now; rejects after showing the error (so the poller retries, backing off). */
  async refresh(): Promise<void> {
    try {
      this._who = await this.fetch();
      this.render(this._who);
    } catch (error) {
      this._who = null;
      this.showError(error);
      throw error;
    }
  }

  /** Asked again every minute while the panel is shown (an admin may move you to another desk). */
  readonly poller = new Poller(() => this.refresh(), 60_000);

  private render(who: WhoAmI): void {
    const rows: [string, string][] = [
      ['user', who.user + (who.admin ? ' (admin)' : '')],
      ['desk', who.tenant ?? '—'],
      ['queues', who.queues.join(', ') || '—']
    ];
    const dl = h('dl', { className: 'jp-cellscale-facts' });
    dl.title = describeUser(who);
    for (const [key, value] of rows) {
      dl.append(h('dt', { text: key }), h('dd', { dataset: { field: key }, text: value }));
    }
    this.body.replaceChildren(dl);
  }

  private _who: WhoAmI | null = null;
}
