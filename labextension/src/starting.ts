/** Which GPU size a starting notebook's kernel asks for, read through the session
 * context's public API: until its kernel runs (a GPU kernel may wait in the queue), the
 * context names the kernelspec being started by its display name only. */

import { ISessionContext } from '@jupyterlab/apputils';
import { KernelSpec } from '@jupyterlab/services';

import { sizeText } from './format';

type Specs = KernelSpec.ISpecModels['kernelspecs'];

/** The size a GPU kernelspec asks for (as `sizeText` writes it), or undefined when the
 * kernelspec does not start through the broker's provisioner. */
export function specSize(
  spec: KernelSpec.ISpecModel | undefined
): string | undefined {
  const p = (spec?.metadata as any)?.kernel_provisioner;
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

/** The size the kernel a session context starts asks for: undefined for no GPU
 * kernelspec, null where kernelspecs of different sizes share its display name (it may
 * then be any of them). `kernelDisplayName` names the kernel being started (a name the
 * specs lack is given as it is); before the start begins, it says "No Kernel" and the
 * preference names the kernel to come. */
export function startingSize(
  context: Pick<ISessionContext, 'kernelDisplayName' | 'kernelPreference'>,
  specs: Specs
): string | null | undefined {
  const shown = context.kernelDisplayName;
  let named = Object.values(specs).filter(s => s?.display_name === shown);
  if (!named.length && specs[shown]) {
    named = [specs[shown]];
  }
  const preferred = context.kernelPreference.name;
  if (!named.length && preferred && specs[preferred]) {
    named = [specs[preferred]];
  }
  const sizes = new Set(named.map(specSize));
  if (sizes.size > 1) {
    return null;
  }
  return sizes.values().next().value;
}
