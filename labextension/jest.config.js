const jestJupyterLab = require('@jupyterlab/testutils/lib/jest-config');

// The clock the tests read time by: the zone of the texts in the table of cases shared
// with wire/text.py's tests (set here: a test file's `process.env` is its own copy).
process.env.TZ = require('../tests/wire/formatter_cases.json').timezone;

const esModules = [
  '@codemirror',
  '@jupyter/ydoc',
  '@jupyterlab/',
  'lib0',
  'nanoid',
  'y-protocols',
  'yjs'
].join('|');

module.exports = {
  ...jestJupyterLab(__dirname),
  automock: false,
  reporters: ['default'],
  testRegex: 'src/.*/.*.spec.ts[x]?$',
  transformIgnorePatterns: [`/node_modules/(?!${esModules}).+`]
};
