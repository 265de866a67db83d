import { LabIcon } from '@jupyterlab/ui-components';

// A notebook cell fanned out onto a 2 x 2 gang of GPUs. `jp-icon3` lets the theme recolour it.
const svgstr = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <rect x="2" y="3" width="8" height="18" rx="1.5"/>
    <rect x="13" y="3" width="4" height="8" rx="1"/>
    <rect x="18.5" y="3" width="4" height="8" rx="1"/>
    <rect x="13" y="13" width="4" height="8" rx="1"/>
    <rect x="18.5" y="13" width="4" height="8" rx="1"/>
  </g>
</svg>`;

export const cellscaleIcon = new LabIcon({ name: 'cellscale:icon', svgstr });
