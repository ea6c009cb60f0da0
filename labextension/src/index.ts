/** The JupyterLab front of the GPU broker: a sidebar panel (GPU icon; a command and the
 * palette open it, the layout restorer keeps it open across reloads), a status-bar item,
 * notifications on grant, reclaim warning ("Keep it", or "Extend 1 hour" for a time
 * limit) and reclaim, and for a notebook whose GPU kernel waits in the queue, a
 * notification with its position and Cancel. Its words go through the translator. */

import {
  ILabShell,
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, Notification } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { ITranslator } from '@jupyterlab/translation';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import gpuSvg from '../style/icons/gpu.svg';
import { BrokerClient } from './client';
import {
  clock,
  etaText,
  extendCaption,
  extendLabel,
  EXTEND_S,
  limitWarningText,
  sizeText
} from './format';
import { trans, useTranslator } from './i18n';
import { follow, GpuModel, IKernelInfo, INotice } from './model';
import { GpuPanel, GpuStatus } from './panel';
import { IShow } from './render';
import { startingSize } from './starting';

const PLUGIN_ID = 'jupyter-gpubroker:plugin';

/** The command that opens the panel (the palette's, the status bar's). */
export const OPEN_PANEL = 'jupyter-gpubroker:open-panel';

export const gpuIcon = new LabIcon({
  name: 'jupyter-gpubroker:gpu',
  svgstr: gpuSvg
});

interface ISettings extends IShow {
  apiUrl: string;
  notifications: boolean;
  historyLength: number;
}

const DEFAULTS: ISettings = {
  apiUrl: '',
  devices: true,
  queue: true,
  leases: true,
  sparklines: true,
  notifications: true,
  historyLength: 60
};

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'GPUs, MIG slices, the queue and my leases of the GPU broker.',
  autoStart: true,
  requires: [ITranslator],
  optional: [
    ILabShell,
    IStatusBar,
    ISettingRegistry,
    INotebookTracker,
    ICommandPalette,
    ILayoutRestorer
  ],
  activate: async (
    app: JupyterFrontEnd,
    translator: ITranslator,
    labShell: ILabShell | null,
    statusBar: IStatusBar | null,
    settingRegistry: ISettingRegistry | null,
    notebooks: INotebookTracker | null,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null
  ) => {
    useTranslator(translator);
    const client = new BrokerClient(app.serviceManager.serverSettings);
    const settings: ISettings = { ...DEFAULTS };
    const model = new GpuModel(settings.historyLength);
    const fail = (what: string) => (e: Error) =>
      Notification.error(trans.__('%1: %2', what, e.message), {
        autoClose: 8000
      });
    // A warning's notification by lease: it goes once the warning is withdrawn (an
    // extension, the GPU used again), the lease ends, or a newer warning replaces it.
    const warnings = new Map<string, string>();
    const unwarn = (leaseId: string) => {
      const id = warnings.get(leaseId);
      if (id !== undefined) {
        Notification.dismiss(id);
        warnings.delete(leaseId);
      }
    };
    // what an action changes comes back as events: no fetch after it
    const actions = {
      cancel: (id: string) =>
        client.cancel(id).then(() => undefined, fail(trans.__('Cancel'))),
      release: (id: string) =>
        client.release(id).then(() => undefined, fail(trans.__('Release'))),
      // refused: the broker's sentence says why (and when the GPU is needed)
      extend: (id: string) =>
        client.extend(id, EXTEND_S).then(() => unwarn(id), fail(extendLabel()))
    };

    const panel = new GpuPanel(model, actions, settings);
    panel.title.icon = gpuIcon;
    panel.title.caption = trans.__('GPUs and the GPU queue');
    app.shell.add(panel, 'left', { rank: 900 });
    // open after a reload if it was open before (the sidebars' idiom: one widget)
    restorer?.add(panel, 'jupyter-gpubroker:panel');

    app.commands.addCommand(OPEN_PANEL, {
      label: trans.__('Open the GPU Panel'),
      caption: trans.__('GPUs, MIG slices, the GPU queue and my GPUs'),
      icon: args => (args.isPalette ? undefined : gpuIcon),
      execute: () => app.shell.activateById(panel.id),
      describedBy: { args: { type: 'object', properties: {} } }
    });
    palette?.addItem({ command: OPEN_PANEL, category: trans.__('GPU Broker') });

    if (statusBar) {
      const status = new GpuStatus(
        model,
        () => void app.commands.execute(OPEN_PANEL),
        () =>
          notebooks?.currentWidget?.sessionContext.session?.kernel?.id ?? null
      );
      statusBar.registerStatusItem('jupyter-gpubroker:status', {
        item: status,
        align: 'left',
        rank: 5
      });
    }

    // Which notebook each running kernel belongs to; and each kernel seen (its notebook
    // and kernelspec), to say which notebook a reclaim shut down and start it again.
    const sessions = app.serviceManager.sessions;
    const seen = new Map<string, { path: string; name: string }>();
    const onSessions = () => {
      const kernels = new Map<string, IKernelInfo>();
      for (const s of sessions.running()) {
        if (s.kernel) {
          kernels.set(s.kernel.id, { path: s.path });
          seen.set(s.kernel.id, { path: s.path, name: s.kernel.name });
        }
      }
      model.setKernels(kernels);
    };
    sessions.runningChanged.connect(onSessions);
    onSessions();

    // Notifications: grant, reclaim warning with "Keep it" (a time limit's with "Extend
    // 1 hour"), reclaim; a grant's notice goes once its lease ends.
    const grants = new Map<string, string>(); // lease id -> its notification
    model.notice.connect((_, n: INotice) => {
      if (n.kind === 'ended' || n.kind === 'cleared') {
        unwarn(n.leaseId);
      }
      if (n.kind === 'ended') {
        const id = grants.get(n.leaseId);
        if (id !== undefined) {
          Notification.dismiss(id);
          grants.delete(n.leaseId);
        }
        return;
      }
      if (n.kind === 'cleared') {
        return;
      }
      if (!settings.notifications) {
        return;
      }
      if (n.kind === 'granted') {
        grants.set(
          n.leaseId,
          Notification.success(n.message, { autoClose: 6000 })
        );
      } else if (n.kind === 'reclaimed') {
        const kernel = n.holder ? seen.get(n.holder) : undefined;
        const notebook = kernel
          ? notebooks?.find(nb => nb.context.path === kernel.path)
          : undefined;
        if (notebook && kernel && n.shutDown) {
          reclaimedKernel(notebook, kernel.name, n.message);
        } else {
          Notification.warning(trans.__('GPU reclaimed: %1', n.message), {
            autoClose: false
          });
        }
      } else if (n.kind === 'outside' || n.kind === 'promise') {
        Notification.warning(n.message, { autoClose: false });
      } else {
        unwarn(n.leaseId); // a newer warning of the same lease
        const limit = n.cause === 'time_limit' ? n.endsAt : null; // its end
        const text = limit
          ? limitWarningText(limit, n.deadline, Date.now())
          : n.deadline
            ? trans.__(
                'Your GPU will be reclaimed at %1: %2',
                clock(n.deadline),
                n.message
              )
            : trans.__('Your GPU will be reclaimed: %1', n.message);
        const action = limit
          ? {
              label: extendLabel(),
              caption: extendCaption(),
              callback: (event: MouseEvent) => {
                event.preventDefault(); // it goes once extended, stays if refused
                void actions.extend(n.leaseId);
              }
            }
          : {
              label: trans.__('Keep it'),
              caption: trans.__('Count this as activity: the GPU stays yours'),
              callback: () =>
                void client
                  .keep(n.leaseId)
                  .then(() => undefined, fail(trans.__('Keep it')))
            };
        warnings.set(
          n.leaseId,
          Notification.warning(text, { autoClose: false, actions: [action] })
        );
      }
    });

    // A notebook whose GPU kernel waits in the queue: where it stands, with Cancel.
    const waitingShown = new Map<string, string>(); // request id -> notification id
    const onWaiting = () => {
      if (!notebooks) {
        return;
      }
      const specs = app.serviceManager.kernelspecs.specs?.kernelspecs ?? {};
      const starting: Array<{ path: string; size: string | null }> = [];
      notebooks.forEach(nb => {
        const state = nb.sessionContext.kernelDisplayStatus;
        if (state !== 'initializing' && state !== 'starting') {
          return;
        }
        const size = startingSize(nb.sessionContext, specs);
        if (size !== undefined) {
          starting.push({ path: nb.context.path, size });
        }
      });
      const seen = new Set<string>();
      for (const w of model.waitingNotebooks(starting)) {
        const r = w.request;
        seen.add(r.id);
        // a quota's hold says when it starts: no ETA from the queue then
        const text = trans.__(
          '%1 waits for a GPU (%2): %3; %4',
          w.path,
          sizeText(r),
          r.place ?? trans.__('in the queue'),
          r.held_back ?? etaText(r, Date.now())
        );
        const known = waitingShown.get(r.id);
        if (known) {
          Notification.update({
            id: known,
            message: text,
            type: 'in-progress'
          });
          continue;
        }
        const id = Notification.emit(text, 'in-progress', {
          autoClose: false,
          actions: [
            {
              label: trans.__('Cancel'),
              caption: trans.__("Withdraw this kernel's GPU request"),
              callback: () => actions.cancel(r.id)
            }
          ]
        });
        waitingShown.set(r.id, id);
      }
      for (const [requestId, id] of waitingShown) {
        if (!seen.has(requestId)) {
          Notification.dismiss(id);
          waitingShown.delete(requestId);
        }
      }
    };
    model.changed.connect(onWaiting);

    // The picture comes from the event stream alone (a snapshot first, then events);
    // while the broker does not answer, it tries again and the panel says why it waits.
    // Its controller is kept: a new broker address (the `apiUrl` setting) ends the stream
    // and follows the new broker's from its own snapshot.
    let stream: AbortController | null = null;
    const followBroker = () => {
      stream?.abort();
      stream = new AbortController();
      void follow(model, client, stream.signal);
    };

    // Settings.
    if (settingRegistry) {
      try {
        const loaded = await settingRegistry.load(PLUGIN_ID);
        const apply = () => {
          Object.assign(settings, loaded.composite as unknown as ISettings);
          if (client.apiUrl !== settings.apiUrl) {
            client.apiUrl = settings.apiUrl;
            if (stream) {
              followBroker();
            }
          }
          panel.options = settings;
          panel.update();
        };
        loaded.changed.connect(apply);
        apply();
      } catch (e) {
        console.warn('jupyter-gpubroker: settings not loaded', e);
      }
    }
    labShell?.currentChanged.connect(onWaiting);

    client.onUnavailable = why => (model.away = why);
    followBroker();
  }
};

/** A notebook whose kernel a reclaim shut down: says so in the notebook (a bar above its
 * cells) and in a notification, each with the button that starts its kernel again (a GPU
 * kernel asks for its GPU again and waits in the queue like any request); the bar goes
 * once a kernel runs there again. */
function reclaimedKernel(
  notebook: NotebookPanel,
  kernelName: string,
  why: string
): void {
  const text = trans.__(
    'Its GPU was reclaimed (%1), and its kernel shut down: its variables are gone. Start the kernel again: it asks for its GPU again and waits in the queue like any request.',
    why
  );
  const label = trans.__('Start the kernel again');
  let toast = '';
  const bar = new Widget();
  bar.addClass('jp-GpuBroker-reclaimed');
  bar.node.setAttribute('role', 'alert');
  const start = async () => {
    bar.dispose();
    Notification.dismiss(toast);
    const context = notebook.sessionContext;
    if (context.session) {
      // the server ends the reclaimed kernel's session, maybe not yet seen here: end it
      // first, so that the start makes a new one rather than change a gone one's kernel
      await context.shutdown().catch(() => undefined);
    }
    await context.changeKernel({ name: kernelName });
  };
  const said = document.createElement('span');
  said.textContent = text;
  const button = document.createElement('button');
  button.className = 'jp-mod-styled jp-mod-accept';
  button.textContent = label;
  button.onclick = () => void start();
  bar.node.append(said, button);
  notebook.contentHeader.addWidget(bar);
  const gone = (_: unknown, change: { newValue: unknown }) => {
    if (change.newValue) {
      bar.dispose(); // a kernel runs there again, however it was started
      notebook.sessionContext.kernelChanged.disconnect(gone);
    }
  };
  notebook.sessionContext.kernelChanged.connect(gone);
  // a toast shows 140 characters: the reclaim's cause, not its evidence
  toast = Notification.warning(
    trans.__(
      '%1: its GPU was reclaimed (%2) and its kernel shut down; start it again to get a GPU back.',
      notebook.context.path,
      why.split(':')[0]
    ),
    {
      autoClose: false,
      actions: [
        {
          label,
          caption: trans.__('Start its kernel again'),
          callback: () => void start()
        }
      ]
    }
  );
}

export default plugin;
