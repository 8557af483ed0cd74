import { describe, expect, it } from 'vitest';
import type { SplitStatus } from './backend';
import { splitHeadline, splitHosts } from './split';

describe('split helpers', () => {
  it('reads the machines one a line, or apart by spaces or commas, blanks left out', () => {
    expect(splitHosts('localhost\n  studio-2.local \n\n')).toEqual(['localhost', 'studio-2.local']);
    expect(splitHosts('localhost, studio-2.local studio-3.local')).toEqual([
      'localhost',
      'studio-2.local',
      'studio-3.local',
    ]);
    expect(splitHosts('  \n')).toEqual([]);
  });

  it('says where the split is, with what the machines said last while they start', () => {
    const status: SplitStatus = {
      ask: { model: 'm', hosts: ['localhost', 'studio-2'], split: 'pipeline' },
      state: { state: 'starting' },
      lines: ['rank 1 (studio-2): loading its share'],
    };
    expect(splitHeadline(status)).toBe('Starting m by layers over 2 machines (localhost, studio-2): rank 1 (studio-2): loading its share');
    expect(splitHeadline({ ...status, lines: [] })).toBe('Starting m by layers over 2 machines (localhost, studio-2)…');
    expect(splitHeadline({ ...status, state: { state: 'lost', reason: 'rank 1 stopped' } })).toBe(
      'Lost m by layers over 2 machines (localhost, studio-2)',
    );
  });
});
