/** The sidebar panel and the status-bar item: Lumino widgets that redraw from the model
 * when it changes and once a second for the clocks (waiting, held, reclaim deadlines). */

import { Widget } from '@lumino/widgets';

import { statusText } from './format';
import { GpuModel } from './model';
import { IActions, IShow, renderPanel } from './render';

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
    this.node.replaceChildren(
      renderPanel(this.model, this.options, Date.now(), this.actions)
    );
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
  constructor(
    readonly model: GpuModel,
    readonly onClick: () => void
  ) {
    super();
    this.addClass('jp-GpuBroker-status');
    this.node.title = 'GPU broker: open the GPU panel';
    this.node.onclick = onClick;
    model.changed.connect(this.update, this);
    this._clock = window.setInterval(() => this.update(), 1000);
  }

  get text(): string | null {
    const m = this.model;
    return statusText(m.leases, m.waiting, l => m.utilization(l), Date.now());
  }

  protected onUpdateRequest(): void {
    this.node.textContent = this.text ?? 'GPU –';
  }

  dispose(): void {
    window.clearInterval(this._clock);
    super.dispose();
  }

  private _clock: number;
}
