/** A few DOM helpers for the views: elements built with text content only (never HTML strings). */
import type { Phase, SweepProgress } from '../api';
import { phaseLabel, sweepDescription, sweepFractions } from '../format';

type Child = Node | string | null | undefined | false;

export interface IProps {
  className?: string;
  /** Attributes, e.g. aria-label, role, type. */
  attrs?: Record<string, string>;
  dataset?: Record<string, string>;
  text?: string;
}

/** An element with props and children (strings become text nodes). */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  props: IProps = {},
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  if (props.className) {
    el.className = props.className;
  }
  for (const [name, value] of Object.entries(props.attrs ?? {})) {
    el.setAttribute(name, value);
  }
  Object.assign(el.dataset, props.dataset ?? {});
  if (props.text !== undefined) {
    el.textContent = props.text;
  }
  for (const child of children) {
    if (child !== null && child !== undefined && child !== false) {
      el.append(child);
    }
  }
  return el;
}

/** A JupyterLab-styled button with a visible label and an accessible name. */
export function button(
  label: string,
  onClick: () => void,
  options: { ariaLabel?: string; title?: string; className?: string } = {}
): HTMLButtonElement {
  const b = h('button', {
    className: `jp-mod-styled jp-cellscale-button ${options.className ?? ''}`.trim(),
    attrs: { type: 'button' },
    text: label
  });
  if (options.ariaLabel) {
    b.setAttribute('aria-label', options.ariaLabel);
  }
  if (options.title) {
    b.title = options.title;
  }
  b.addEventListener('click', onClick);
  return b;
}

/** The phase badge: plain words, a tone for colour, the raw phase for tests and tools. */
export function phaseBadge(phase: Phase): HTMLSpanElement {
  const { label, tone } = phaseLabel(phase);
  return h('span', {
    className: `jp-cellscale-badge jp-cellscale-tone-${tone}`,
    dataset: { phase },
    text: label
  });
}

/**
 * A sweep's bar: its points done (and cached) in one colour, failed in another. With a
 * `label` it is a progressbar for assistive technology (the detail view); without, it is
 * decoration beside text that says the same (a job-list row, whose text is its name).
 */
export function sweepBar(p: SweepProgress, label?: string): HTMLDivElement {
  const { done, failed } = sweepFractions(p);
  const finished = p.done + p.cached;
  const attrs: Record<string, string> = label
    ? {
        role: 'progressbar',
        'aria-label': label,
        'aria-valuemin': '0',
        'aria-valuemax': String(p.points),
        'aria-valuenow': String(finished),
        'aria-valuetext': sweepDescription(p)
      }
    : { 'aria-hidden': 'true' };
  return h(
    'div',
    {
      className: 'jp-cellscale-meter jp-cellscale-sweepbar',
      attrs: { ...attrs, title: sweepDescription(p) },
      dataset: { done: String(finished), failed: String(p.failed), points: String(p.points) }
    },
    h('div', { className: 'jp-cellscale-meter-done', attrs: { style: `width: ${100 * done}%` } }),
    h('div', { className: 'jp-cellscale-meter-failed', attrs: { style: `width: ${100 * failed}%` } })
  );
}

/** A titled section inside a view. */
export function section(title: string, className: string, ...children: Child[]): HTMLElement {
  const id = `jp-cellscale-${className}-${++sections}`;
  return h(
    'section',
    { className: `jp-cellscale-section jp-cellscale-section-${className}`, attrs: { 'aria-labelledby': id } },
    h('h4', { className: 'jp-cellscale-section-title', attrs: { id }, text: title }),
    ...children
  );
}

let sections = 0;
