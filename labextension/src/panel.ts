/** The sidebar panel and the status-bar item: Lumino widgets that redraw from the model
 * when it changes and once a second for the clocks (waiting, held, reclaim deadlines).
 * The panel updates its DOM in place (morphdom, keyed by `data-key`): what did not
 * change stays the same element, so a button under the pointer or with the focus
 * survives each tick. */

import { Widget } from '@lumino/widgets';
import morphdom from 'morphdom';

import { statusText } from './format';
import { trans } from './i18n';
import { GpuModel } from './model';
import { IActions, IShow, renderPanel } from './render';

/** Match elements by the key render.ts gives them; handlers follow the new drawing. */
const MORPH = {
  getNodeKey: (node: Node) => (node as HTMLElement).dataset?.key,
  onBeforeElUpdated: (from: HTMLElement, to: HTMLElement) => {
    from.onclick = to.onclick;
    return true;
  }
};

export class GpuPanel extends Widget {
  constructor(
    readonly model: GpuModel,
    readonly actions: IActions,
    public options: IShow
  ) {
    super();
    this.id = 'jp-gpubroker-panel';
    this.addClass('jp-GpuBroker');
    model.changed.connect(this.update, this);
    this._clock = window.setInterval(
      () => this.isVisible && this.update(),
      1000
    );
  }

  protected onUpdateRequest(): void {
    const next = renderPanel(
      this.model,
      this.options,
      Date.now(),
      this.actions
    );
    const shown = this.node.firstElementChild;
    if (shown) {
      morphdom(shown, next, MORPH);
    } else {
      this.node.appendChild(next);
    }
  }

  protected onAfterShow(): void {
    this.update();
  }

  dispose(): void {
    window.clearInterval(this._clock);
    super.dispose();
  }

  private _clock: number;
}

export class GpuStatus extends Widget {
  /** `current`: the kernel of the notebook in front, whose GPU the bar speaks of. */
  constructor(
    readonly model: GpuModel,
    readonly onClick: () => void,
    readonly current: () => string | null = () => null
  ) {
    super();
    this.addClass('jp-GpuBroker-status');
    this.node.title = trans.__('GPU broker: open the GPU panel');
    this.node.onclick = onClick;
    model.changed.connect(this.update, this);
    this._clock = window.setInterval(() => this.update(), 1000);
  }

  get text(): string | null {
    const m = this.model;
    const { leases, waiting } = m.mineFor(this.current());
    const length = m.overview?.length ?? 0;
    return statusText(
      leases,
      waiting,
      l => m.utilization(l),
      Date.now(),
      length
    );
  }

  protected onUpdateRequest(): void {
    this.node.textContent = this.text ?? trans.__('GPU –');
  }

  dispose(): void {
    window.clearInterval(this._clock);
    super.dispose();
  }

  private _clock: number;
}
