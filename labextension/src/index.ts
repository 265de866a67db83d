import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';

import { CellscalePanel } from './panel';

/** The cellscale side panel, in the left sidebar. */
const plugin: JupyterFrontEndPlugin<void> = {
  id: 'cellscale-labextension:panel',
  description: 'The cellscale side panel: your jobs and your desk’s, their live logs and checkpoints, and the desk’s quota.',
  autoStart: true,
  optional: [ILayoutRestorer, INotebookTracker],
  activate: (app: JupyterFrontEnd, restorer: ILayoutRestorer | null, notebooks: INotebookTracker | null) => {
    const panel = new CellscalePanel({
      attach: jobId => {
        const notebook = notebooks?.currentWidget;
        if (!notebook) {
          return 'Open a notebook first: the attach cell goes into the active one.';
        }
        NotebookActions.insertBelow(notebook.content);
        notebook.content.activeCell?.model.sharedModel.setSource(`%cluster attach ${jobId}`);
        app.shell.activateById(notebook.id);
        return `Inserted %cluster attach ${jobId} into ${notebook.title.label}; run it to follow the job there.`;
      }
    });
    app.shell.add(panel, 'left', { rank: 600 });
    restorer?.add(panel, panel.id);
    // Activated in activate() the panel is hidden again when the layout restorer runs.
    void app.restored.then(() => app.shell.activateById(panel.id));
  }
};

export default plugin;
