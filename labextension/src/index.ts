/** The JupyterLab front of the GPU broker: a sidebar panel (GPU icon), a status-bar item,
 * notifications on grant, reclaim warning ("Keep it", or "Extend 1 hour" for a time
 * limit) and reclaim, and for a notebook whose GPU kernel waits in the queue, a
 * notification with its position and Cancel. */

import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';

import gpuSvg from '../style/icons/gpu.svg';
import { BrokerClient } from './client';
import {
  etaText,
  EXTEND_CAPTION,
  EXTEND_LABEL,
  EXTEND_S,
  limitWarningText,
  sizeText
} from './format';
import { follow, GpuModel, IKernelInfo, INotice } from './model';
import { GpuPanel, GpuStatus } from './panel';
import { IShow } from './render';

const PLUGIN_ID = 'jupyter-gpubroker:plugin';

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

/** The size a GPU kernelspec asks for (as `sizeText` writes it), or undefined when the
 * kernelspec does not start through the broker's provisioner. */
function specSize(spec: any): string | null | undefined {
  const p = spec?.metadata?.kernel_provisioner;
  if (p?.provisioner_name !== 'gpubroker-provisioner' || p.config?.on_demand) {
    return undefined;
  }
  const c = p.config ?? {};
  return sizeText({
    profile: c.gpu,
    gpus: c.gpus,
    min_memory_gb: c.min_memory_gb
  });
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'GPUs, MIG slices, the queue and my leases of the GPU broker.',
  autoStart: true,
  optional: [ILabShell, IStatusBar, ISettingRegistry, INotebookTracker],
  activate: async (
    app: JupyterFrontEnd,
    labShell: ILabShell | null,
    statusBar: IStatusBar | null,
    settingRegistry: ISettingRegistry | null,
    notebooks: INotebookTracker | null
  ) => {
    const client = new BrokerClient(app.serviceManager.serverSettings);
    const settings: ISettings = { ...DEFAULTS };
    const model = new GpuModel(settings.historyLength);
    const fail = (what: string) => (e: Error) =>
      Notification.error(`${what}: ${e.message}`, { autoClose: 8000 });
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
        client.cancel(id).then(() => undefined, fail('Cancel')),
      release: (id: string) =>
        client.release(id).then(() => undefined, fail('Release')),
      // refused: the broker's sentence says why (and when the GPU is needed)
      extend: (id: string) =>
        client.extend(id, EXTEND_S).then(() => unwarn(id), fail(EXTEND_LABEL))
    };

    const panel = new GpuPanel(model, actions, settings);
    panel.title.icon = gpuIcon;
    panel.title.caption = 'GPUs and the GPU queue';
    app.shell.add(panel, 'left', { rank: 900 });

    if (statusBar) {
      const status = new GpuStatus(model, () =>
        app.shell.activateById(panel.id)
      );
      statusBar.registerStatusItem('jupyter-gpubroker:status', {
        item: status,
        align: 'left',
        rank: 5
      });
    }

    // Which notebook each running kernel belongs to.
    const sessions = app.serviceManager.sessions;
    const onSessions = () => {
      const kernels = new Map<string, IKernelInfo>();
      for (const s of sessions.running()) {
        if (s.kernel) {
          kernels.set(s.kernel.id, { path: s.path });
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
        Notification.warning(`GPU reclaimed: ${n.message}`, {
          autoClose: false
        });
      } else if (n.kind === 'outside' || n.kind === 'promise') {
        Notification.warning(n.message, { autoClose: false });
      } else {
        unwarn(n.leaseId); // a newer warning of the same lease
        const limit = n.cause === 'time_limit' ? n.endsAt : null; // its end
        const when = n.deadline
          ? ` at ${new Date(n.deadline).toLocaleTimeString()}`
          : '';
        const text = limit
          ? limitWarningText(limit, n.deadline, Date.now())
          : `Your GPU will be reclaimed${when}: ${n.message}`;
        const action = limit
          ? {
              label: EXTEND_LABEL,
              caption: EXTEND_CAPTION,
              callback: (event: MouseEvent) => {
                event.preventDefault(); // it goes once extended, stays if refused
                void actions.extend(n.leaseId);
              }
            }
          : {
              label: 'Keep it',
              caption: 'Count this as activity: the GPU stays yours',
              callback: () =>
                void client
                  .keep(n.leaseId)
                  .then(() => undefined, fail('Keep it'))
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
        const sc = nb.sessionContext as any;
        const state = sc.kernelDisplayStatus;
        if (state !== 'initializing' && state !== 'starting') {
          return;
        }
        const name = sc._pendingKernelName || sc.kernelPreference?.name;
        const size = specSize(specs[name]);
        if (size !== undefined) {
          starting.push({ path: nb.context.path, size });
        }
      });
      const seen = new Set<string>();
      for (const w of model.waitingNotebooks(starting)) {
        const r = w.request;
        seen.add(r.id);
        const text =
          `${w.path} waits for a GPU (${sizeText(r)}): ` +
          `${r.place ?? 'in the queue'}; ${etaText(r, Date.now())}`;
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
              label: 'Cancel',
              caption: "Withdraw this kernel's GPU request",
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

    // Settings.
    if (settingRegistry) {
      try {
        const loaded = await settingRegistry.load(PLUGIN_ID);
        const apply = () => {
          Object.assign(settings, loaded.composite as unknown as ISettings);
          client.apiUrl = settings.apiUrl;
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

    // The picture comes from the event stream alone (a snapshot first, then events);
    // while the broker does not answer, it tries again and the panel says why it waits.
    client.onUnavailable = why => (model.away = why);
    void follow(model, client, new AbortController().signal);
  }
};

export default plugin;
