import { describe, expect, it } from 'vitest';
import { allRuns, BENCH_ID, benchResult, makeRun, makeTimeline, OLDER_BENCH_ID } from '../../test/fixtures-runs';
import type { BenchResult } from '../lib/backend';
import {
  benchCaseRows,
  coldWarmColumns,
  coldWarmSummary,
  concurrencyColumns,
  concurrencySides,
  concurrencySummary,
  DEFAULT_BENCH_FORM,
  detailRows,
  DEFAULT_SORT,
  exportedMessage,
  filterOptions,
  latestBenchId,
  median,
  moveSelection,
  nextSort,
  NO_FILTER,
  parseNumberList,
  plannedRuns,
  pressureSegments,
  runCells,
  selectsEveryRun,
  shortModelName,
  sortRuns,
  speedColumns,
  speedSummary,
  timelineColumns,
  timelineSummary,
  toRunFilter,
  validateBenchForm,
  prefixCell,
  imagesCell,
} from './runs';

describe('filters', () => {
  it('finds the newest benchmark', () => {
    expect(latestBenchId(allRuns)).toBe(BENCH_ID);
    expect(latestBenchId(allRuns.filter((run) => run.kind === 'chat'))).toBeNull();
  });

  it('sends the backend the whole filter, with "latest" resolved to a bench id', () => {
    const state = { ...NO_FILTER, model: 'tiny', kind: 'bench', bench: 'latest', loop: 'sync', includeWarmup: true };
    expect(toRunFilter(state, BENCH_ID)).toEqual({
      last: 500,
      model_id: 'tiny',
      kind: 'bench',
      bench_id: BENCH_ID,
      include_warmup: true,
      loop: 'sync',
      prefill_step_size: null,
      max_kv_size: null,
      prefix_source: null,
    });
    expect(toRunFilter(NO_FILTER, BENCH_ID)).toEqual({
      last: 500,
      model_id: null,
      kind: null,
      bench_id: null,
      include_warmup: false,
      loop: null,
      prefill_step_size: null,
      max_kv_size: null,
      prefix_source: null,
    });
    expect(toRunFilter({ ...NO_FILTER, prefix: 'disk' }, BENCH_ID)).toMatchObject({ prefix_source: 'disk' });
  });

  it('sends a setting as its field; unbounded KV as 0', () => {
    const step = toRunFilter({ ...NO_FILTER, setting: 'prefill_step_size=512' }, null);
    expect(step).toMatchObject({ prefill_step_size: 512, max_kv_size: null });
    const bounded = toRunFilter({ ...NO_FILTER, setting: 'max_kv_size=4096' }, null);
    expect(bounded).toMatchObject({ prefill_step_size: null, max_kv_size: 4096 });
    const unbounded = toRunFilter({ ...NO_FILTER, setting: 'max_kv_size=none' }, null);
    expect(unbounded).toMatchObject({ prefill_step_size: null, max_kv_size: 0 });
    // Values the filter never offers are left out rather than sent.
    expect(toRunFilter({ ...NO_FILTER, setting: 'prefill_step_size=none', loop: 'fast' }, null)).toMatchObject({
      loop: null,
      prefill_step_size: null,
      max_kv_size: null,
    });
  });

  it('keeps nothing for "latest" before any benchmark is recorded', () => {
    expect(toRunFilter({ ...NO_FILTER, bench: 'latest' }, null)).toBeNull();
    expect(toRunFilter({ ...NO_FILTER, bench: OLDER_BENCH_ID }, null)?.bench_id).toBe(OLDER_BENCH_ID);
  });

  it('knows when the unfiltered listing serves the table too', () => {
    expect(selectsEveryRun({ last: 500, include_warmup: true })).toBe(true);
    expect(selectsEveryRun(toRunFilter({ ...NO_FILTER, includeWarmup: true }, null)!)).toBe(true);
    // Warm-ups are left out by default, so the backend is asked.
    expect(selectsEveryRun(toRunFilter(NO_FILTER, null)!)).toBe(false);
    expect(selectsEveryRun({ last: 500, include_warmup: true, loop: 'sync' })).toBe(false);
    expect(selectsEveryRun({ last: 500, include_warmup: true, max_kv_size: 0 })).toBe(false);
    expect(selectsEveryRun({ last: 20, include_warmup: true })).toBe(false);
  });

  it('says what an export wrote, from the backend\'s answer', () => {
    expect(exportedMessage({ runs: 3, bytes: 48_213, path: '/home/me/ondo-runs.md' })).toBe(
      'Saved 3 runs to /home/me/ondo-runs.md (47.1 KiB)',
    );
    expect(exportedMessage({ runs: 1, bytes: 900, path: '/tmp/r.csv' })).toMatch(/^Saved 1 run to \/tmp\/r\.csv \(/);
  });

  it('offers requests to the local server as their own kind', () => {
    const apiRun = makeRun({
      run_id: 'r-api',
      created_at: '2025-10-09T11:00:00Z',
      kind: 'api',
      user_agent: 'OpenAI/Python 3.57.0',
    });
    const options = filterOptions([...allRuns, apiRun]);
    expect(options.kinds.map((option) => option.value)).toEqual(['chat', 'run', 'bench', 'bench_cold', 'api']);
    expect(options.kinds.at(-1)?.label).toBe('API request');
  });

  it('offers only the values present, newest benchmark first', () => {
    const options = filterOptions(allRuns);
    expect(options.models.map((option) => option.label)).toEqual(['Qwen3-0.6B-4bit', 'tiny (speed test)']);
    expect(options.kinds.map((option) => option.value)).toEqual(['chat', 'run', 'bench', 'bench_cold']);
    expect(options.benches.map((option) => option.value)).toEqual([BENCH_ID, OLDER_BENCH_ID]);
    expect(options.loops.map((option) => option.value)).toEqual(['pipelined', 'sync']);
    expect(options.settings.map((option) => option.value)).toEqual([
      'prefill_step_size=512',
      'prefill_step_size=2048',
      'max_kv_size=4096',
      'max_kv_size=none',
    ]);
  });
});

describe('table', () => {
  const runs = allRuns.filter((run) => !run.warmup);

  it('sorts newest first by default', () => {
    const sorted = sortRuns(runs, DEFAULT_SORT);
    expect(sorted[0]?.created_at).toBe(runs.at(-1)?.created_at);
    expect(sorted.at(-1)?.created_at).toBe('2025-10-09T09:00:00Z');
  });

  it('sorts by a number either way, and by text', () => {
    const fastest = sortRuns(runs, { key: 'decode_tps', direction: 'descending' });
    const rates = fastest.map((run) => run.decode_tps ?? 0);
    expect(rates).toEqual([...rates].sort((a, b) => b - a));
    expect(sortRuns(runs, { key: 'decode_tps', direction: 'ascending' })[0]?.model_id).toBe(
      'mlx-community/Qwen3-0.6B-4bit',
    );
    const byModel = sortRuns(runs, { key: 'model_id', direction: 'ascending' });
    expect(byModel[0]?.model_id).toBe('mlx-community/Qwen3-0.6B-4bit');
    // Unbounded KV sorts as the largest; pressure by severity.
    expect(sortRuns(runs, { key: 'max_kv_size', direction: 'ascending' })[0]?.max_kv_size).toBe(4096);
    expect(sortRuns(runs, { key: 'pressure_max', direction: 'descending' })[0]?.pressure_max).toBe('warning');
    // Warm runs (no load) sort below every cold one.
    expect(sortRuns(runs, { key: 'load_ms', direction: 'descending' })[0]?.load_ms).toBe(1840);
  });

  it('flips the same column; a new number column starts largest first', () => {
    expect(nextSort(DEFAULT_SORT, 'created_at')).toEqual({ key: 'created_at', direction: 'ascending' });
    expect(nextSort(DEFAULT_SORT, 'decode_tps')).toEqual({ key: 'decode_tps', direction: 'descending' });
    expect(nextSort(DEFAULT_SORT, 'model_id')).toEqual({ key: 'model_id', direction: 'ascending' });
  });

  it('formats a row: cold with load time, cached tokens, unbounded KV', () => {
    const warmChat = allRuns.find((run) => run.run_id === 'r-1760000120000-a3');
    const cells = runCells(warmChat!);
    expect(cells.model).toBe('Qwen3-0.6B-4bit');
    expect(cells.start).toBe('warm');
    expect(cells.prompt).toBe('171 (152 cached)');
    expect(cells.decode).toBe('40.9 tok/s');
    expect(cells.peak).toBe('530 MiB');
    expect(cells.maxKv).toBe('unbounded');
    const cold = runCells(allRuns[0]!);
    expect(cold.start).toBe('cold 38.2 ms');
    expect(cold.kind).toBe('test run');
    expect(shortModelName('/Users/me/models/My-Model/')).toBe('My-Model');
  });

  it("charts each side's aggregate decode against streams at once, one round counted once", () => {
    const stream = (n: number, side: string | null, streams: number, repetition: number, aggregate: number, warmup = false) =>
      makeRun({
        run_id: `r-17600009${String(n).padStart(5, '0')}-c`,
        created_at: `2025-10-09T10:00:${String(n).padStart(2, '0')}Z`,
        kind: side === null ? 'bench' : 'endpoint',
        bench_id: 'b-1760000900000',
        test: `pp64+tg64 x${streams}`,
        repetition,
        warmup,
        server_name: side,
        concurrency: streams,
        aggregate_tps: aggregate,
      });
    const runs = [
      stream(1, null, 1, 0, 100),
      stream(2, 'mlx', 1, 0, 80),
      stream(3, null, 1, 1, 120),
      // Two streams of one round carry the same aggregate: counted once.
      stream(4, null, 2, 0, 180),
      stream(5, null, 2, 0, 180),
      stream(6, null, 2, 1, 200),
      stream(7, 'mlx', 2, 0, 90),
      stream(8, 'mlx', 2, 0, 90),
      stream(9, 'mlx', 2, 1, 1000, true),
      ...allRuns,
    ];
    expect(concurrencySides(runs)).toEqual(['ondo', 'mlx']);
    expect(concurrencyColumns(runs)).toEqual([
      [1, 2],
      [110, 190],
      [80, 90],
    ]);
    expect(concurrencySummary(runs)).toBe(
      'Aggregate decode in all streams: ondo 110 tok/s at 1 stream, 190 tok/s at 2; mlx 80.0 tok/s at 1 stream, 90.0 tok/s at 2.',
    );
    expect(concurrencySides(allRuns)).toEqual([]);
  });

  it('says what batch a run shared, what it waited for, and when it had the engine alone', () => {
    const base = allRuns[0]!;
    expect(Object.fromEntries(detailRows(base))['Batch']).toBe('none: it had the engine to itself');
    const shared = { ...base, batch_min_rows: 2, batch_median_rows: 5, batch_max_rows: 8, admission_wait_ms: 312.5, waited_for: 'memory', prefill_chunks: 3, interleaved_chunks: 2 };
    expect(Object.fromEntries(detailRows(shared))['Batch']).toBe(
      "2–8 sequences (median 5) · waited 313 ms for memory · 2 of 3 prefill chunks between others' steps",
    );
    const alone = { ...base, batch_min_rows: 1, batch_median_rows: 1, batch_max_rows: 1, admission_wait_ms: 0.2, waited_for: null, prefill_chunks: 1, interleaved_chunks: 0 };
    expect(Object.fromEntries(detailRows(alone))['Batch']).toBe('alone');
  });

  it('says what grammar a run was held to and what its masks cost, and nothing for free text', () => {
    const base = allRuns[0]!;
    expect(Object.fromEntries(detailRows(base))['Held to']).toBeUndefined();
    const held = { ...base, constraint: 'json_schema', mask_ms_per_token: 0.1234 };
    expect(Object.fromEntries(detailRows(held))['Held to']).toBe('json schema · mask 0.123 ms per token');
  });

  it("shows another program's server by its name, with dashes for what a client cannot see", () => {
    const served = makeRun({
      run_id: 'r-1760000500000-e1',
      created_at: '2025-10-09T09:08:20Z',
      kind: 'endpoint',
      bench_id: BENCH_ID,
      test: 'pp128+tg64',
      model_id: 'llama3.2:1b',
      server_name: 'ollama 0.12.3',
      endpoint_url: 'http://127.0.0.1:11434/api/generate',
      endpoint_dialect: 'ollama',
      ttft_ms: 182.4,
      decode_ms: 1400,
      decode_tps: 45,
      prefill_tps: Number.NaN,
      prompt_tokens: 128,
      server_prompt_tokens: 131,
      mlx_peak_bytes: 0,
      server_load_ms: 2.5,
      server_prefill_tps: 1650,
      server_decode_tps: 46.2,
    });
    const cells = runCells(served);
    expect(cells.kind).toBe('ollama 0.12.3 (server)');
    expect(cells.model).toBe('llama3.2:1b');
    expect(cells.ttft).toBe('182 ms');
    expect(cells.decode).toBe('45.0 tok/s');
    expect([cells.start, cells.prefill, cells.peak, cells.loop, cells.step, cells.maxKv]).toEqual(['—', '—', '—', '—', '—', '—']);

    const details = Object.fromEntries(detailRows(served));
    expect(details['Server']).toBe('ollama 0.12.3 · ollama · http://127.0.0.1:11434/api/generate');
    expect(details['Prompt']).toBe('128 tok sent, 131 as the server counted, 0 cached');
    expect(details['Server’s own']).toBe('load 2.50 ms · prefill 1,650 tok/s · decode 46.2 tok/s');
    expect(details['TTFT']).toBe('182 ms at the client');
    expect(details['MLX peak']).toBeUndefined();
    expect(details['Loop']).toBeUndefined();
    // Ondo's own runs keep their rows.
    expect(Object.fromEntries(detailRows(allRuns[0]!))['Loop']).toBe(allRuns[0]!.loop);

    const options = filterOptions([...allRuns, served]);
    expect(options.kinds.at(-1)).toEqual({ value: 'endpoint', label: 'other server' });
  });

  it('moves the selection with arrow keys, Home and End, within bounds', () => {
    expect(moveSelection(0, 5, 'ArrowDown')).toBe(1);
    expect(moveSelection(4, 5, 'ArrowDown')).toBe(4);
    expect(moveSelection(0, 5, 'ArrowUp')).toBe(0);
    expect(moveSelection(2, 5, 'End')).toBe(4);
    expect(moveSelection(2, 5, 'Home')).toBe(0);
    expect(moveSelection(2, 5, 'x')).toBeNull();
    expect(moveSelection(0, 0, 'ArrowDown')).toBeNull();
  });
});

describe('benchmark form', () => {
  it('turns the defaults into the request the backend expects', () => {
    const result = validateBenchForm(DEFAULT_BENCH_FORM);
    expect(result).toEqual({
      ok: true,
      request: {
        model: 'tiny',
        // The core's defaults (BenchShape::default), as `ondo bench` has them.
        shape: {
          prompt_tokens: [128],
          generate_tokens: 128,
          repetitions: 5,
          warmup: 1,
          loops: ['sync', 'pipelined'],
          prefill_step_size: 2048,
          max_kv_size: null,
          vary: null,
          kv_bits: null,
          kv_group_size: 64,
          quantized_kv_start: 5000,
          cold_repetitions: 3,
        },
      },
    });
    if (result.ok) expect(plannedRuns(result.request)).toBe(1 * 2 * 6 + 3);
  });

  it('quantizes the KV cache from the first token, and not a bounded one', () => {
    const result = validateBenchForm({ ...DEFAULT_BENCH_FORM, kvBits: '4' });
    expect(result.ok).toBe(true);
    if (result.ok) {
      expect(result.request.shape.kv_bits).toBe(4);
      expect(result.request.shape.quantized_kv_start).toBe(0);
    }
    const bounded = validateBenchForm({ ...DEFAULT_BENCH_FORM, kvBits: '8', maxKvSize: '1024' });
    expect(bounded.ok).toBe(false);
    if (!bounded.ok) expect(bounded.errors.kvBits).toMatch(/stays in floats/);
  });

  it('says what is wrong with each field', () => {
    const result = validateBenchForm({
      ...DEFAULT_BENCH_FORM,
      promptLengths: '128, abc',
      generateTokens: '0',
      repetitions: '',
      sync: false,
      pipelined: false,
      maxKvSize: '-1',
      vary: 'max_kv_size',
      varyValues: ' ',
    });
    expect(result.ok).toBe(false);
    if (result.ok) return;
    expect(result.errors.promptLengths).toMatch(/“abc” is not a valid prompt length/);
    expect(result.errors.generateTokens).toBe('Tokens to generate must be from 2 to 8,192.');
    expect(result.errors.repetitions).toBe('Enter repetitions.');
    expect(result.errors.loops).toBe('Choose at least one loop shape.');
    expect(result.errors.maxKvSize).toBe('Max KV size must be a whole number.');
    expect(result.errors.varyValues).toMatch(/at least one max KV size/);
    expect(result.errors.warmup).toBeUndefined();
  });

  it('varies one setting over a list of values', () => {
    const result = validateBenchForm({ ...DEFAULT_BENCH_FORM, vary: 'prefill_step_size', varyValues: '256 512, 512' });
    expect(result.ok && result.request.shape.vary).toEqual({ setting: 'prefill_step_size', values: [256, 512] });
    expect(parseNumberList('1,,2', 'n', 1, 5)).toEqual([1, 2]);
    expect(parseNumberList('9', 'n', 1, 5)).toMatch(/from 1 to 5/);
  });
});

describe('benchmark summary', () => {
  it('gives each case its median and range, and the pipelined/sync ratio on the pipelined row', () => {
    const rows = benchCaseRows(benchResult);
    expect(rows.map((row) => `${row.test} ${row.loop}`)).toEqual([
      'pp128+tg64 sync',
      'pp128+tg64 pipelined',
      'pp512+tg64 sync',
      'pp512+tg64 pipelined',
    ]);
    expect(rows[0]?.pipelinedOverSync).toBeNull();
    const sync = benchResult.cases[0]!.decode_tps.median!;
    const pipelined = benchResult.cases[1]!.decode_tps.median!;
    expect(rows[1]?.pipelinedOverSync).toBe(`${(pipelined / sync).toFixed(2)}×`);
    expect(pipelined / sync).toBeGreaterThan(1.1);
    expect(rows[1]?.decodeRange).toMatch(/^\d+ tok\/s – \d+ tok\/s$/);
    expect(rows[0]?.settings).toBe('step 2,048 · KV unbounded');
  });

  it('shows no ratio when only one loop ran', () => {
    const onlyPipelined: BenchResult = { ...benchResult, cases: benchResult.cases.filter((c) => c.case.loop === 'pipelined') };
    expect(benchCaseRows(onlyPipelined).every((row) => row.pipelinedOverSync === null)).toBe(true);
  });
});

describe('charts', () => {
  const runs = [
    makeRun({ run_id: 'b', created_at: '2025-10-09T10:00:02Z', prefill_tps: 4000, decode_tps: 400, load_kind: 'warm' }),
    makeRun({ run_id: 'a', created_at: '2025-10-09T10:00:01Z', prefill_tps: 3000, decode_tps: 0, load_kind: 'cold', load_ms: 40 }),
  ];

  it('plots runs oldest first, leaving rates that were not measured out', () => {
    expect(speedColumns(runs)).toEqual([[1, 2], [3000, 4000], [null, 400]]);
    const [x, load, ttft] = coldWarmColumns(runs);
    expect(x).toEqual([1, 2]);
    expect(load).toEqual([40, null]);
    expect(ttft?.every((value) => value !== null && value > 0)).toBe(true);
  });

  it('describes the charts in words', () => {
    expect(speedSummary(runs)).toBe('2 runs: median prefill 3,500 tok/s, median decode 400 tok/s. Prefill processes tokens 8.8× faster than decode.');
    expect(coldWarmSummary(runs)).toMatch(/^1 cold start, median load 40\.0 ms; 1 warm\. Median time to first token/);
    expect(speedSummary([])).toBe('No runs to chart.');
    expect(median([3, 1, 2, 10])).toBe(2.5);
  });

  it('merges pressure levels into bands and says when pressure rose', () => {
    const samples = makeTimeline({ ttft_ms: 10, decode_ms: 220, mlx_peak_bytes: 20 * 2 ** 20 }, true);
    const bands = pressureSegments(samples);
    expect(bands.map((band) => band.level)).toEqual(['normal', 'warning', 'normal']);
    expect(bands[0]?.from_ms).toBe(0);
    expect(bands[1]?.from_ms).toBe(bands[0]?.to_ms);
    expect(bands[2]?.to_ms).toBe(samples.at(-1)?.t_ms);
    expect(timelineColumns(samples)).toHaveLength(6);
    expect(timelineSummary(samples)).toMatch(/^24 samples over 230 ms: used memory peaked at .* GiB, Ondo's footprint at .* MiB; pressure reached warning at/);
    expect(timelineSummary(makeTimeline({ ttft_ms: 1, decode_ms: 9, mlx_peak_bytes: 0 }))).toMatch(/pressure normal throughout\.$/);
    expect(timelineSummary([])).toBe('No memory samples were recorded for this run.');
  });
});

describe('prefix source', () => {
  it('offers the sources present, and says where a prefix came from and what reading it took', () => {
    const fromDisk = makeRun({
      run_id: 'disk',
      created_at: '2026-12-04T10:00:00Z',
      cached_tokens: 900,
      prefix_source: 'disk',
      prefix_read_bytes: 3 * 2 ** 20,
      prefix_read_ms: 12.5,
    });
    const runs = [fromDisk, makeRun({ run_id: 'none', created_at: '2026-12-04T10:00:01Z' })];
    expect(filterOptions(runs).prefixes).toEqual([
      { value: 'none', label: 'all prefilled' },
      { value: 'disk', label: 'read from disk' },
    ]);
    expect(prefixCell(fromDisk)).toBe('disk 12.5 ms');
    expect(prefixCell(runs[1]!)).toBe('none');
    expect(detailRows(fromDisk)).toContainEqual(['Prefix', 'read from disk: 3.00 MiB in 12.5 ms']);
  });
});

describe('split runs', () => {
  it('says how a model split over machines ran and what a decode step moved, and nothing for one process', () => {
    const split = makeRun({
      run_id: 'split',
      created_at: '2026-12-05T10:00:00Z',
      split: 'tensor',
      split_ranks: 2,
      split_backend: 'ring',
      split_hosts: 'studio-1, studio-2',
      split_step_bytes: 229_376,
      split_step_link_ms: 1.75,
    });
    const alone = makeRun({ run_id: 'alone', created_at: '2026-12-05T10:00:01Z' });
    expect(detailRows(split)).toContainEqual([
      'Split',
      'by heads over 2 ranks (ring: studio-1, studio-2) · 224 KiB a decode step, about 1.75 ms on the links',
    ]);
    // With each rank's share timed alone: by layers the turns add up.
    const timed = makeRun({
      run_id: 'timed',
      created_at: '2026-12-05T10:00:02Z',
      split: 'pipeline',
      split_ranks: 2,
      split_backend: 'ring',
      split_hosts: 'studio-1, studio-2',
      split_step_bytes: 8_192,
      split_step_link_ms: 0.5,
      split_rank_step_ms: '3.000, 2.500',
      split_prefill_bytes: 1_048_576,
      split_prefill_link_ms: 4.25,
      prefill_tokens: 128,
      prefill_ms: 40,
      decode_tps: 125,
    });
    expect(detailRows(timed)).toContainEqual([
      'Split',
      'by layers over 2 ranks (ring: studio-1, studio-2) · 8.00 KiB a decode step, about 0.50 ms on the links · computed alone 3.00 ms (rank 0), 2.50 ms (rank 1): 5.50 ms; a step took 8.00 ms',
    ]);
    expect(detailRows(timed)).toContainEqual([
      'Split prefill',
      '1.00 MiB from a rank over 128 tokens, about 4.25 ms on the links of the 40.0 ms prefill',
    ]);
    expect(detailRows(split).map(([term]) => term)).not.toContain('Split prefill');
    expect(detailRows(alone).map(([term]) => term)).not.toContain('Split');
    // A request's client, where the server recorded one.
    const fromApp = makeRun({ run_id: 'from-app', created_at: '2026-12-05T10:00:03Z', user_agent: 'Ondo app 0.1.0 (chat)' });
    expect(detailRows(fromApp)).toContainEqual(['Client', 'Ondo app 0.1.0 (chat)']);
    expect(detailRows(alone).map(([term]) => term)).not.toContain('Client');
  });
});

describe('images', () => {
  it('shows how many images a prompt showed and what encoding them took, or that the cache held them', () => {
    const encoded = makeRun({
      run_id: 'seen',
      created_at: '2026-12-04T11:00:00Z',
      images: 2,
      image_tokens: 512,
      image_encode_ms: 80,
    });
    const reused = makeRun({
      run_id: 'reused',
      created_at: '2026-12-04T11:00:01Z',
      images: 1,
      image_tokens: 256,
      image_encode_ms: 0,
    });
    const text = makeRun({ run_id: 'text', created_at: '2026-12-04T11:00:02Z' });
    expect(imagesCell(encoded)).toBe('2 · 80.0 ms');
    expect(imagesCell(text)).toBe('–');
    expect(runCells(reused).images).toBe('1 · cached');
    expect(detailRows(encoded)).toContainEqual(['Images', '2 images, 512 tok, encoded in 80.0 ms before the prefill']);
    expect(detailRows(reused)).toContainEqual(['Images', '1 image, 256 tok, reused from the cache (nothing encoded)']);
    expect(detailRows(text).map(([term]) => term)).not.toContain('Images');
    expect(sortRuns([text, encoded, reused], { key: 'images', direction: 'descending' }).map((run) => run.run_id)).toEqual([
      'seen',
      'reused',
      'text',
    ]);
  });
});
