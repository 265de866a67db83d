/**
 * A job's live log: follow or pause, one rank or all, jump to the first error.
 * Live through the relay's log websocket (resumed from the last byte offset after a drop);
 * read slice by slice with backoff while the socket is down.
 */
import { LogChunk, logChunk, socketUrl } from '../api';
import { LiveFeed } from '../live';
import { filterByRank, firstErrorLine, isErrorLine, LogBuffer, rankOf, ranksIn } from '../logs';
import { button, h } from './dom';

export class LogPane {
  constructor(private readonly jobId: string, jobName: string) {
    this.follow = button('Follow', () => this.setFollow(!this.following), {
      title: 'Keep the newest line in view'
    });
    this.rank = h('select', { className: 'jp-cellscale-select', attrs: { 'aria-label': 'Show the lines of one rank' } });
    this.rank.append(h('option', { attrs: { value: '' }, text: 'all ranks' }));
    this.rank.addEventListener('change', () => this.renderAll());
    this.jump = button('First error', () => this.jumpToError(), {
      title: 'Scroll to the first line with a Traceback or an Error'
    });
    this.jump.disabled = true;
    this.status = h('span', { className: 'jp-cellscale-feed', attrs: { role: 'status' } });
    // role=log is a live region by default; with lines arriving many times a second that would
    // drown a screen reader, so it stays quiet (aria-live=off) and is read when focused
    this.output = h('div', {
      className: 'jp-cellscale-log',
      attrs: { role: 'log', 'aria-live': 'off', 'aria-label': `Log of ${jobName}`, tabindex: '0' }
    });
    this.node = h(
      'div',
      { className: 'jp-cellscale-logpane' },
      h('div', { className: 'jp-cellscale-toolbar' }, this.follow, this.rank, this.jump, this.status),
      this.output
    );
    this.output.addEventListener('scroll', () => {
      const atBottom = this.output.scrollHeight - this.output.scrollTop - this.output.clientHeight < 8;
      if (this.following && !atBottom) {
        this.setFollow(false); // the reader scrolled up: stop pulling the view down
      }
    });
    this.feed = new LiveFeed({
      url: () => socketUrl(`/api/jobs/${this.jobId}/logs/ws`, { offset: this.buffer.nextOffset }),
      receive: chunk => this.add(chunk as LogChunk),
      poll: async () => {
        const chunk = await logChunk(this.jobId, this.buffer.nextOffset);
        this.add(chunk);
        return chunk.complete;
      },
      onState: (state, detail) => {
        const words = {
          connecting: 'connecting…',
          live: 'live',
          polling: `reconnecting${detail ? ` (${detail})` : ''}`,
          finished: 'complete',
          stopped: 'paused'
        };
        this.status.textContent = words[state];
        this.status.dataset.state = state;
        this.showEmpty();
      }
    });
    this.setFollow(true);
    this.showEmpty();
  }

  readonly node: HTMLElement;

  get lines(): readonly string[] {
    return this.buffer.lines;
  }

  start(): void {
    if (!this.buffer.complete) {
      this.feed.start();
    }
  }

  stop(): void {
    if (this.feed.state !== 'finished') {
      this.feed.stop();
    }
  }

  private add(chunk: LogChunk): void {
    const dropped = this.buffer.dropped;
    const added = this.buffer.append(chunk);
    if (this.buffer.dropped !== dropped) {
      this.renderAll();
      return;
    }
    this.updateRanks(added);
    const rank = this.selectedRank();
    const shown = filterByRank(added, rank);
    if (shown.length) {
      this.output.querySelector('.jp-cellscale-empty')?.remove();
      this.output.append(...shown.map(line => this.line(line)));
      this.scrollIfFollowing();
    }
    this.jump.disabled = firstErrorLine(this.buffer.lines) < 0;
  }

  private renderAll(): void {
    this.updateRanks(this.buffer.lines);
    const shown = filterByRank(this.buffer.lines, this.selectedRank());
    this.output.replaceChildren(...shown.map(line => this.line(line)));
    this.showEmpty();
    this.jump.disabled = firstErrorLine(shown) < 0;
    this.scrollIfFollowing();
  }

  private showEmpty(): void {
    if (this.output.childElementCount === 0 || this.output.querySelector('.jp-cellscale-empty')) {
      const words = this.buffer.lines.length
        ? 'No lines from this rank.'
        : this.feed.state === 'finished'
          ? 'The job wrote no output.'
          : 'No output yet.';
      this.output.replaceChildren(h('div', { className: 'jp-cellscale-empty', text: words }));
    }
  }

  private line(text: string): HTMLDivElement {
    const rank = rankOf(text);
    return h('div', {
      className: isErrorLine(text) ? 'jp-cellscale-logline jp-mod-error' : 'jp-cellscale-logline',
      dataset: rank === null ? {} : { rank: String(rank) },
      text
    });
  }

  private updateRanks(lines: readonly string[]): void {
    for (const rank of ranksIn(lines)) {
      if (!this.ranks.has(rank)) {
        this.ranks.add(rank);
        const options = [...this.rank.options].slice(1);
        const next = options.find(o => Number(o.value) > rank) ?? null;
        this.rank.insertBefore(h('option', { attrs: { value: String(rank) }, text: `rank ${rank}` }), next);
      }
    }
  }

  private selectedRank(): number | null {
    return this.rank.value === '' ? null : Number(this.rank.value);
  }

  private jumpToError(): void {
    const lines = [...this.output.querySelectorAll<HTMLDivElement>('.jp-cellscale-logline')];
    const index = firstErrorLine(lines.map(l => l.textContent ?? ''));
    if (index < 0) {
      return;
    }
    this.setFollow(false);
    const target = lines[index];
    this.output.querySelector('.jp-mod-current')?.classList.remove('jp-mod-current');
    target.classList.add('jp-mod-current');
    target.tabIndex = -1;
    target.scrollIntoView({ block: 'center' });
    target.focus();
  }

  private setFollow(on: boolean): void {
    this.following = on;
    this.follow.setAttribute('aria-pressed', String(on));
    this.follow.textContent = on ? 'Following' : 'Follow';
    this.scrollIfFollowing();
  }

  private scrollIfFollowing(): void {
    if (this.following) {
      this.output.scrollTop = this.output.scrollHeight;
    }
  }

  private readonly buffer = new LogBuffer();
  private readonly ranks = new Set<number>();
  private readonly follow: HTMLButtonElement;
  private readonly rank: HTMLSelectElement;
  private readonly jump: HTMLButtonElement;
  private readonly status: HTMLSpanElement;
  private readonly output: HTMLDivElement;
  private readonly feed: LiveFeed;
  private following = true;
}
