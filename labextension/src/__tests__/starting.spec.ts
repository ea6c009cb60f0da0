import { KernelSpec } from '@jupyterlab/services';

import { startingSize } from '../starting';

/** A kernelspec as the Lab's spec manager lists it; `config` its broker request. */
function spec(
  name: string,
  display: string,
  config?: Record<string, string | number | boolean>
): KernelSpec.ISpecModel {
  return {
    name,
    display_name: display,
    language: 'python',
    argv: [],
    resources: {},
    metadata: config
      ? {
          kernel_provisioner: {
            provisioner_name: 'gpubroker-provisioner',
            config
          }
        }
      : {}
  };
}

const SPECS = {
  python3: spec('python3', 'Python 3 (ipykernel)'),
  'gpu-1g': spec('gpu-1g', 'Python 3 (GPU: 1g.10gb)', { gpu: '1g.10gb' }),
  'gpu-2': spec('gpu-2', 'Python 3 (2 GPUs)', { gpus: 2 }),
  'gpu-2-copy': spec('gpu-2-copy', 'Python 3 (2 GPUs)', { gpus: 2 }),
  'gpu-later': spec('gpu-later', 'Python 3 (GPU on demand)', {
    gpu: '1g.10gb',
    on_demand: true
  })
};

const context = (shown: string, preferred?: string) => ({
  kernelDisplayName: shown,
  kernelPreference: { name: preferred }
});

describe('startingSize', () => {
  it('reads the kernel being started from its display name, as the session context shows it', () => {
    expect(startingSize(context('Python 3 (GPU: 1g.10gb)'), SPECS)).toBe(
      '1g.10gb'
    );
    // chosen in Lab's kernel dialog: the preference still names the notebook's old one
    expect(
      startingSize(context('Python 3 (GPU: 1g.10gb)', 'python3'), SPECS)
    ).toBe('1g.10gb');
    expect(startingSize(context('Python 3 (2 GPUs)'), SPECS)).toBe('2 GPUs');
  });

  it('falls back on the preference before the start names a kernel', () => {
    expect(startingSize(context('No Kernel', 'gpu-1g'), SPECS)).toBe('1g.10gb');
  });

  it('says nothing of kernels that do not wait for a GPU at start', () => {
    expect(
      startingSize(context('Python 3 (ipykernel)'), SPECS)
    ).toBeUndefined();
    expect(
      startingSize(context('Python 3 (GPU on demand)'), SPECS)
    ).toBeUndefined();
    expect(startingSize(context('No Kernel'), SPECS)).toBeUndefined();
  });

  it('matches any size where kernelspecs of different sizes share the name shown', () => {
    const twins = {
      ...SPECS,
      other: spec('other', 'Python 3 (2 GPUs)', { gpu: '3g.40gb' })
    };
    expect(startingSize(context('Python 3 (2 GPUs)'), twins)).toBeNull();
  });
});
