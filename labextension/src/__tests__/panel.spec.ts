import { Widget } from '@lumino/widgets';

import { GpuModel } from '../model';
import { GpuPanel } from '../panel';
import { entry, lease, overview, queued } from './fixtures';

const SHOW = { devices: true, queue: true, leases: true, sparklines: true };

/** The panel, attached, on a model with my lease and my waiting request. */
function shown() {
  const model = new GpuModel();
  const mine = queued('r-mine', 1);
  model.setOverview(
    overview({
      leases: [lease('l-00', 'MIG-0-0'), lease('l-01', 'MIG-0-1')],
      queue: [entry(mine)],
      requests: [mine],
      length: 1
    })
  );
  model.connected = true;
  const calls: string[] = [];
  const panel = new GpuPanel(
    model,
    {
      cancel: id => calls.push(`cancel ${id}`),
      release: id => calls.push(`release ${id}`),
      extend: id => calls.push(`extend ${id}`)
    },
    SHOW
  );
  Widget.attach(panel, document.body);
  const draw = () => panel.processMessage(Widget.Msg.UpdateRequest);
  draw();
  return { model, panel, calls, draw };
}

describe('GpuPanel', () => {
  it('keeps the elements a tick does not change: a button under the pointer survives', () => {
    const { panel, draw } = shown();
    const release = panel.node.querySelector(
      '.jp-GpuBroker-lease[data-key="l-01"] .jp-GpuBroker-release'
    ) as HTMLButtonElement & { hovered?: boolean };
    const cancel = panel.node.querySelector('.jp-GpuBroker-cancel');
    release.hovered = true;
    draw();
    draw();
    const now = panel.node.querySelector(
      '.jp-GpuBroker-lease[data-key="l-01"] .jp-GpuBroker-release'
    ) as HTMLButtonElement & { hovered?: boolean };
    expect(now).toBe(release);
    expect(now.hovered).toBe(true);
    expect(panel.node.querySelector('.jp-GpuBroker-cancel')).toBe(cancel);
    panel.dispose();
  });

  it("keeps a lease's element when another lease before it ends, and its button acts on it", () => {
    const { model, panel, calls, draw } = shown();
    const box = panel.node.querySelector('[data-key="l-01"]');
    model.overview!.leases.shift();
    model.setOverview(model.overview!);
    draw();
    expect(panel.node.querySelectorAll('.jp-GpuBroker-lease').length).toBe(1);
    expect(panel.node.querySelector('[data-key="l-01"]')).toBe(box);
    (
      panel.node.querySelector('.jp-GpuBroker-release') as HTMLButtonElement
    ).click();
    expect(calls).toEqual(['release l-01']);
    panel.dispose();
  });
});
