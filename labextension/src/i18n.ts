/** The panel's words go through JupyterLab's translator, as core extensions' do
 * (`trans.__`): bound when the plugin starts; English (the words wire/text.py writes)
 * until then and in the tests. */

import {
  ITranslator,
  nullTranslator,
  TranslationBundle
} from '@jupyterlab/translation';

/** The gettext domain of a language pack's strings: the Python package's name. */
export const DOMAIN = 'jupyter_gpubroker';

export let trans: TranslationBundle = nullTranslator.load(DOMAIN);

export function useTranslator(translator: ITranslator): void {
  trans = translator.load(DOMAIN);
}
