/** format.ts against the table of cases wire/text.py is tested against too
 * (tests/wire/formatter_cases.json): the two formatters of sizes, durations, memory and
 * ETAs say the same words, row by row, by the table's clock (its `timezone`, which
 * jest.config.js sets). */

import { duration, etaText, leaseSize, mib, sizeText } from '../format';
import CASES from '../../../tests/wire/formatter_cases.json';

describe('the words shared with wire/text.py', () => {
  it.each(CASES.sizes)('size: $case', ({ request, text }) => {
    expect(sizeText(request)).toBe(text);
  });

  it.each(CASES.lease_sizes)('lease size: $case', ({ lease, text }) => {
    expect(leaseSize(lease)).toBe(text);
  });

  it.each(CASES.durations)('duration: $case', ({ seconds, text }) => {
    expect(duration(seconds)).toBe(text);
  });

  it.each(CASES.memory)('memory: $case', ({ mib: m, text }) => {
    expect(mib(m)).toBe(text);
  });

  it.each(CASES.etas)('ETA: $case', ({ estimate, text }) => {
    expect(etaText(estimate, Date.parse(CASES.now))).toBe(text);
  });
});
