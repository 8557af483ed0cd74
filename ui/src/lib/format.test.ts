import { describe, expect, it } from 'vitest';
import { demoRun, doctorReport } from '../../test/fixtures';
import {
  formatBytes,
  formatChecks,
  formatContext,
  formatEta,
  formatMemory,
  formatMs,
  formatParameters,
  formatRunMemory,
  formatSpeed,
  formatTimings,
  formatTps,
} from './format';

describe('formatBytes', () => {
  // The cases of the core's human_bytes (src/units.rs): one rule for both.
  const KiB = 2 ** 10;
  const MiB = 2 ** 20;
  const GiB = 2 ** 30;
  it.each([
    [0, '0 B'],
    [1023, '1023 B'],
    [1024, '1.00 KiB'],
    [1152, '1.13 KiB'],
    [12 * KiB, '12.0 KiB'],
    [10_234, '9.99 KiB'],
    [10_235, '10.0 KiB'],
    [102_348, '99.9 KiB'],
    [102_349, '100 KiB'],
    [512 * MiB, '512 MiB'],
    [1_932_735_283, '1.80 GiB'],
    [GiB - 1, '1.00 GiB'],
    [16 * GiB, '16.0 GiB'],
    [2048 * GiB, '2.00 TiB'],
  ])('writes %d bytes as the core does: %s', (bytes, text) => {
    expect(formatBytes(bytes)).toBe(text);
  });

  it('grows the figure of the largest unit and keeps MiB below 1023.5', () => {
    expect(formatBytes(5000 * 2 ** 40)).toBe('5000 TiB');
    expect(formatBytes(1023 * MiB + 400 * KiB)).toBe('1023 MiB');
  });

  it('shows a dash for impossible sizes', () => {
    expect(formatBytes(-1)).toBe('—');
    expect(formatBytes(Number.NaN)).toBe('—');
  });
});

describe('formatMs', () => {
  it('keeps about three significant digits', () => {
    expect(formatMs(0.4211)).toBe('0.42 ms');
    expect(formatMs(8.934)).toBe('8.93 ms');
    expect(formatMs(41.66)).toBe('41.7 ms');
    expect(formatMs(412.4)).toBe('412 ms');
  });

  it('switches to seconds at one second', () => {
    expect(formatMs(999.4)).toBe('999 ms');
    expect(formatMs(1000)).toBe('1.00 s');
    expect(formatMs(12_345)).toBe('12.3 s');
  });

  it('shows a dash for values that are not durations', () => {
    expect(formatMs(Number.POSITIVE_INFINITY)).toBe('—');
    expect(formatMs(-3)).toBe('—');
  });
});

describe('formatTps', () => {
  it('rounds by magnitude and groups thousands', () => {
    expect(formatTps(0.734)).toBe('0.73 tok/s');
    expect(formatTps(46.25)).toBe('46.3 tok/s');
    expect(formatTps(1426.9)).toBe('1,427 tok/s');
  });

  it('shows a dash when the rate could not be measured', () => {
    // decode_tps of a one-token answer is 0/0.
    expect(formatTps(Number.NaN)).toBe('—');
    expect(formatTps(0)).toBe('—');
  });
});

describe('formatTimings', () => {
  it('lists load, prefill and decode in order with their numbers', () => {
    expect(formatTimings(demoRun)).toEqual([
      { stage: 'Load', measures: 'cold start', time: '41.7 ms', tokens: '', speed: '' },
      {
        stage: 'Prefill',
        measures: 'to first token',
        time: '8.93 ms',
        tokens: '12 prompt',
        speed: '1,427 tok/s',
      },
      {
        stage: 'Decode',
        measures: 'after first token, pipelined loop',
        time: '66.2 ms',
        tokens: '32 generated',
        speed: '468 tok/s',
      },
    ]);
  });
});

describe('formatTimings of a warm run', () => {
  it('says the model was already loaded', () => {
    const [load] = formatTimings({ ...demoRun, load_kind: 'warm', load_ms: 0 });
    expect(load).toMatchObject({ stage: 'Load', measures: 'warm, already loaded', time: '0.00 ms' });
  });
});

describe('formatRunMemory', () => {
  it('shows MLX peak and KV cache sizes', () => {
    expect(formatRunMemory(demoRun)).toBe('MLX peak 12.5 MiB · KV cache 352 KiB');
  });
});

describe('formatMemory', () => {
  it('says how much is free and how full memory is', () => {
    const memory = formatMemory(doctorReport);
    expect(memory.text).toBe('20.0 GiB free of 24.0 GiB');
    expect(memory.usedFraction).toBeCloseTo(1 / 6, 6);
  });

  it('never reports more free than total', () => {
    const memory = formatMemory({ total_memory_bytes: 8 * 2 ** 30, available_memory_bytes: 9 * 2 ** 30 });
    expect(memory.usedFraction).toBe(0);
    expect(memory.text).toBe('8.00 GiB free of 8.00 GiB');
  });

  it('admits when the total is unknown', () => {
    expect(formatMemory({ total_memory_bytes: 0, available_memory_bytes: 0 }).text).toBe('Memory unknown');
  });
});

describe('formatChecks', () => {
  it('says all passed, or how many failed', () => {
    expect(formatChecks(doctorReport)).toBe('all 3 checks passed');
    const oneFailed = { checks: [...doctorReport.checks, { name: 'x', passed: false, detail: '' }] };
    expect(formatChecks(oneFailed)).toBe('1 of 4 checks failed');
    expect(formatChecks({ checks: doctorReport.checks.slice(0, 1) })).toBe('1 check passed');
    expect(formatChecks({ checks: [] })).toBe('no checks ran');
  });
});

describe('download and model facts', () => {
  it('shows speed in decimal MB/s', () => {
    expect(formatSpeed(12_500_000)).toBe('12.5 MB/s');
    expect(formatSpeed(250_000_000)).toBe('250 MB/s');
    expect(formatSpeed(0)).toBe('—');
  });

  it('shows time left in seconds, minutes or hours', () => {
    expect(formatEta(18.4)).toBe('19 s left');
    expect(formatEta(185)).toBe('3 min 5 s left');
    expect(formatEta(4320)).toBe('1 h 12 min left');
    expect(formatEta(null)).toBeNull();
  });

  it('writes parameters and contexts as model cards do', () => {
    expect(formatParameters(600_000_000)).toBe('600M');
    expect(formatParameters(3_210_000_000)).toBe('3.2B');
    expect(formatParameters(null)).toBe('—');
    expect(formatContext(4096)).toBe('4K');
    expect(formatContext(40_960)).toBe('40K');
    expect(formatContext(1000)).toBe('1,000');
  });
});
