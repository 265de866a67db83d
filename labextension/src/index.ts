import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';

import { CellscalePanel } from './panel';

/** The cellscale side panel, in the left sidebar. */
const plugin: JupyterFrontEndPlugin<void> = {
  id: 'cellscale-labextension:panel',
  description: 'The cellscale side panel: who you are to the control plane, and (to come) your jobs.',
  autoStart: true,
  optional: [ILayoutRestorer],
  activate: (app: JupyterFrontEnd, restorer: ILayoutRestorer | null) => {
    const panel = new CellscalePanel();
    app.shell.add(panel, 'left', { rank: 600 });
    restorer?.add(panel, panel.id);
    // Activated in activate() the panel is hidden again when the layout restorer runs.
    void app.restored.then(() => app.shell.activateById(panel.id));
  }
};

export default plugin;
