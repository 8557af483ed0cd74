// Recorded runs, memory timelines and a finished benchmark for the Runs view's
// tests and its browser test, shaped like what `list_runs`, `run_timeline` and
// `run_benchmark` return on this Linux machine (MLX on the CPU backend).
import type { BenchCaseSummary, BenchResult, MemorySample, RunFilter, RunRecord, Summary } from '../src/lib/backend';

const MiB = 2 ** 20;
const GiB = 2 ** 30;

/** Provenance every record carries (docs/REPORT_SCHEMA.md). */
const provenance = {
  app_version: '0.1.0',
  app_commit: '3f2c1e0',
  build_profile: 'release',
  mlx_version: '0.32.2',
  mlx_rs_version: '0.25.1',
  backend: 'cpu',
  os: 'Linux 6.1 (Debian 12)',
  cpu: 'Intel Xeon, 2 cores',
  ram_bytes: 24 * GiB,
};

const tinyModel = {
  model_id: 'tiny',
  model_path: '/home/me/.local/share/ondo/models/builtin-tiny',
  model_revision: null,
  model_type: 'llama',
  quantization: 'float32',
  parameters: 2_310_000,
  weights_bytes: 9_240_000,
};

const qwenModel = {
  model_id: 'mlx-community/Qwen3-0.6B-4bit',
  model_path: '/home/me/.cache/huggingface/hub/models--mlx-community--Qwen3-0.6B-4bit/snapshots/0123456',
  model_revision: '0123456789abcdef0123456789abcdef01234567',
  model_type: 'qwen3',
  quantization: '4bit',
  parameters: 596_000_000,
  weights_bytes: 335_000_000,
};

/** A run with every schema field; timings derived from the rates given. */
export function makeRun(overrides: Partial<RunRecord> & Pick<RunRecord, 'run_id' | 'created_at'>): RunRecord {
  const base: RunRecord = {
    run_id: overrides.run_id,
    created_at: overrides.created_at,
    kind: 'chat',
    bench_id: null,
    test: null,
    repetition: null,
    warmup: false,
    conversation_id: null,
    user_agent: null,
    ...tinyModel,
    download_ms: 0,
    load_kind: 'warm',
    fresh_process: false,
    prefix_source: 'none',
    prefix_read_bytes: null,
    prefix_read_ms: null,
    loop: 'pipelined',
    load_ms: 0,
    ttft_ms: 0,
    prefill_ms: 0,
    decode_ms: 0,
    reasoning_ms: 0,
    cold_start_ms: null,
    prefill_tps: 3600,
    decode_tps: 450,
    prompt_tps: 0,
    generation_tps: 0,
    prompt_tokens: 128,
    cached_tokens: 0,
    prefill_tokens: 128,
    generated_tokens: 64,
    reasoning_tokens: 0,
    mlx_peak_bytes: 14 * MiB,
    mlx_active_bytes: 11 * MiB,
    mlx_cache_bytes: 2 * MiB,
    kv_cache_bytes: 1_572_864,
    footprint_bytes: 182 * MiB,
    pressure_start: 'normal',
    pressure_max: 'normal',
    pressure_end: 'normal',
    swap_delta_bytes: 0,
    decode_bytes_per_token: null,
    memory_bandwidth_gbps: null,
    decode_roofline_pct: null,
    prefill_step_size: 2048,
    max_kv_size: null,
    kv_bits: null,
    images: 0,
    image_tokens: null,
    image_encode_ms: null,
    max_tokens: 64,
    temperature: 0,
    top_p: 1,
    top_k: 0,
    min_p: 0,
    repetition_penalty: null,
    seed: 0,
    stop_reason: 'max_tokens',
    error: null,
    server_name: null,
    endpoint_url: null,
    endpoint_dialect: null,
    server_prompt_tokens: null,
    server_load_ms: null,
    server_prefill_ms: null,
    server_decode_ms: null,
    server_prefill_tps: null,
    server_decode_tps: null,
    batch_min_rows: null,
    batch_median_rows: null,
    batch_max_rows: null,
    admission_wait_ms: null,
    waited_for: null,
    prefill_chunks: null,
    interleaved_chunks: null,
    constraint: null,
    mask_ms_per_token: null,
    concurrency: null,
    aggregate_tps: null,
    split: null,
    split_ranks: null,
    split_backend: null,
    split_hosts: null,
    split_step_bytes: null,
    split_step_link_ms: null,
    split_prefill_bytes: null,
    split_prefill_link_ms: null,
    split_rank_step_ms: null,
    split_rank_prefill_tps: null,
    ...provenance,
  };
  const run = { ...base, ...overrides };
  // Keep the timings consistent with the rates unless a test set them.
  const prefillTps = run.prefill_tps ?? 0;
  const decodeTps = run.decode_tps ?? 0;
  const prefillMs = overrides.prefill_ms ?? (run.prefill_tokens / prefillTps) * 1000;
  const ttftMs = overrides.ttft_ms ?? prefillMs + 0.4;
  const decodeMs = overrides.decode_ms ?? ((run.generated_tokens - 1) / decodeTps) * 1000;
  run.prefill_ms = prefillMs;
  run.ttft_ms = ttftMs;
  run.decode_ms = decodeMs;
  run.prompt_tps = run.prompt_tokens / (ttftMs / 1000);
  run.generation_tps = run.generated_tokens / (decodeMs / 1000);
  return run;
}

/** A deterministic wobble of a few percent, so repetitions differ. */
const wobble = (seed: number) => 1 + (((seed * 7919) % 13) - 6) / 100;

export const BENCH_ID = 'b-1760004000000-7f3a';
export const OLDER_BENCH_ID = 'b-1760001000000-1c9e';

/** One benchmark on the tiny model: pp128/pp512 × sync/pipelined, a warm-up
 * and three repetitions each, and one fresh-process cold start. */
function benchRuns(benchId: string, startMs: number, prefillStep: number): RunRecord[] {
  const runs: RunRecord[] = [];
  let at = startMs;
  const next = () => new Date((at += 1500)).toISOString();
  runs.push(
    makeRun({
      run_id: `r-${at}-cold`,
      created_at: next(),
      kind: 'bench_cold',
      bench_id: benchId,
      test: 'pp128+tg64',
      repetition: 0,
      load_kind: 'cold',
      fresh_process: true,
      load_ms: 41.7,
      cold_start_ms: 212.4,
      prefill_step_size: prefillStep,
      prefill_tps: 3420,
      decode_tps: 448,
    }),
  );
  for (const prompt of [128, 512]) {
    for (const loop of ['sync', 'pipelined'] as const) {
      for (let repetition = -1; repetition < 3; repetition += 1) {
        const seed = prompt + repetition * 3 + (loop === 'sync' ? 1 : 2);
        runs.push(
          makeRun({
            run_id: `r-${at}-${prompt}-${loop}-${repetition}`,
            created_at: next(),
            kind: 'bench',
            bench_id: benchId,
            test: `pp${prompt}+tg64`,
            repetition: Math.max(repetition, 0),
            warmup: repetition < 0,
            loop,
            prompt_tokens: prompt,
            prefill_tokens: prompt,
            prefill_step_size: prefillStep,
            prefill_tps: (prompt === 128 ? 3650 : 4120) * wobble(seed),
            decode_tps: (loop === 'sync' ? 381 : 462) * (prompt === 128 ? 1 : 0.96) * wobble(seed + 5),
            mlx_peak_bytes: (prompt === 128 ? 14.2 : 19.6) * MiB,
            kv_cache_bytes: (prompt + 64) * 8192,
            seed: repetition + 1,
          }),
        );
      }
    }
  }
  return runs;
}

/** Chats on the tiny model and on Qwen3 0.6B, and the popover's test run. */
const chatRuns: RunRecord[] = [
  makeRun({
    run_id: 'r-1760000000000-a1',
    created_at: '2025-10-09T09:00:00Z',
    kind: 'run',
    load_kind: 'cold',
    load_ms: 38.2,
    prompt_tokens: 12,
    prefill_tokens: 12,
    generated_tokens: 32,
    prefill_tps: 1426.9,
    decode_tps: 468.3,
    prefill_step_size: 512,
    mlx_peak_bytes: 12.5 * MiB,
  }),
  makeRun({
    run_id: 'r-1760000060000-a2',
    created_at: '2025-10-09T09:01:00Z',
    kind: 'chat',
    conversation_id: 'c-1',
    ...qwenModel,
    load_kind: 'cold',
    load_ms: 1840,
    prompt_tokens: 34,
    prefill_tokens: 34,
    generated_tokens: 118,
    prefill_tps: 612.4,
    decode_tps: 41.8,
    prefill_step_size: 512,
    mlx_peak_bytes: 512 * MiB,
    kv_cache_bytes: 16_842_752,
    footprint_bytes: 640 * MiB,
    pressure_max: 'warning',
    stop_reason: 'eos',
  }),
  makeRun({
    run_id: 'r-1760000120000-a3',
    created_at: '2025-10-09T09:02:00Z',
    kind: 'chat',
    conversation_id: 'c-1',
    ...qwenModel,
    prompt_tokens: 171,
    cached_tokens: 152,
    prefill_tokens: 19,
    generated_tokens: 86,
    prefill_tps: 590.2,
    decode_tps: 40.9,
    prefill_step_size: 512,
    mlx_peak_bytes: 530 * MiB,
    kv_cache_bytes: 28_311_552,
    footprint_bytes: 652 * MiB,
    stop_reason: 'eos',
  }),
  makeRun({
    run_id: 'r-1760000180000-a4',
    created_at: '2025-10-09T09:03:00Z',
    kind: 'chat',
    conversation_id: 'c-2',
    load_kind: 'cold',
    load_ms: 15,
    prompt_tokens: 12,
    prefill_tokens: 12,
    generated_tokens: 16,
    prefill_tps: 3790.4,
    decode_tps: 382.7,
    loop: 'sync',
    prefill_step_size: 512,
    max_kv_size: 4096,
  }),
];

/** Every recorded run, oldest first (as `list_runs` answers), warm-ups included. */
export const allRuns: RunRecord[] = [
  ...chatRuns,
  ...benchRuns(OLDER_BENCH_ID, Date.parse('2025-10-09T09:30:00Z'), 512),
  ...benchRuns(BENCH_ID, Date.parse('2025-10-09T10:00:00Z'), 2048),
];

/** A run's memory timeline: the load raises used memory, the KV cache grows
 * while decoding, and pressure touches `warning` when `pressured`. */
export function makeTimeline(run: Pick<RunRecord, 'ttft_ms' | 'decode_ms' | 'mlx_peak_bytes'>, pressured = false): MemorySample[] {
  const total = (run.ttft_ms ?? 0) + (run.decode_ms ?? 0);
  const count = 24;
  return Array.from({ length: count }, (_, index) => {
    const t = (total * index) / (count - 1);
    const growth = index / (count - 1);
    const level = pressured && index >= 10 && index < 16 ? 'warning' : 'normal';
    return {
      t_ms: Math.round(t * 100) / 100,
      level,
      used_bytes: Math.round(14.2 * GiB + growth * run.mlx_peak_bytes * 2 + (level === 'warning' ? 2 * GiB : 0)),
      app_bytes: Math.round(8.1 * GiB + growth * run.mlx_peak_bytes),
      wired_bytes: Math.round(2.6 * GiB),
      compressed_bytes: Math.round((level === 'warning' ? 1.4 : 0.6) * GiB),
      swap_used_bytes: 512 * MiB,
      footprint_bytes: Math.round(170 * MiB + growth * run.mlx_peak_bytes),
    };
  });
}

function summary(measured: (number | null)[]): Summary {
  const samples = measured.filter((value): value is number => value !== null);
  const sorted = [...samples].sort((a, b) => a - b);
  const mean = samples.reduce((sum, value) => sum + value, 0) / samples.length;
  const variance = samples.reduce((sum, value) => sum + (value - mean) ** 2, 0) / Math.max(samples.length - 1, 1);
  return {
    median: sorted[Math.floor(sorted.length / 2)] ?? Number.NaN,
    min: sorted[0] ?? Number.NaN,
    max: sorted.at(-1) ?? Number.NaN,
    mean,
    stddev: Math.sqrt(variance),
    samples,
  };
}

/** The summary `run_benchmark` answers for the runs of `benchId`. */
export function benchResultFor(runs: RunRecord[], benchId: string): BenchResult {
  const measured = runs.filter((run) => run.bench_id === benchId && run.kind === 'bench' && !run.warmup);
  const cases: BenchCaseSummary[] = [];
  for (const prompt of [128, 512]) {
    for (const loop of ['sync', 'pipelined'] as const) {
      const group = measured.filter((run) => run.prompt_tokens === prompt && run.loop === loop);
      if (group.length === 0) continue;
      const first = group[0] as RunRecord;
      cases.push({
        case: {
          test: `pp${prompt}+tg64`,
          prompt_tokens: prompt,
          loop,
          prefill_step_size: first.prefill_step_size,
          max_kv_size: first.max_kv_size,
        },
        ttft_ms: summary(group.map((run) => run.ttft_ms)),
        prefill_tps: summary(group.map((run) => run.prefill_tps)),
        decode_tps: summary(group.map((run) => run.decode_tps)),
        mlx_peak_bytes: summary(group.map((run) => run.mlx_peak_bytes)),
        decode_roofline_pct: null,
        anatomy: null,
      });
    }
  }
  const cold = runs.filter((run) => run.bench_id === benchId && run.kind === 'bench_cold');
  return {
    bench_id: benchId,
    runs: runs.filter((run) => run.bench_id === benchId).length,
    cases,
    cold_start_ms: cold.length > 0 ? summary(cold.map((run) => (run.cold_start_ms as number) ?? 0)) : null,
    memory_bandwidth_gbps: null,
    warnings: ['Fewer than 5 repetitions: no standard deviation is reported.'],
  };
}

export const benchResult: BenchResult = benchResultFor(allRuns, BENCH_ID);

/** The runs a fresh benchmark adds (the mock backend records them). */
export function newBenchRuns(benchId: string, startMs: number): RunRecord[] {
  return benchRuns(benchId, startMs, 2048);
}

/** What `list_runs` and `export_runs` select from `runs` (oldest first), as
 * `RunFilter::select` in src-tauri/src/runs.rs does: the history's query
 * (model, kind, bench, warm-ups, the newest `last`), then the settings. */
export function selectRuns(runs: readonly RunRecord[], filter: RunFilter): RunRecord[] {
  const queried = runs.filter(
    (run) =>
      (!filter.model_id || run.model_id === filter.model_id) &&
      (!filter.kind || run.kind === filter.kind) &&
      (!filter.bench_id || run.bench_id === filter.bench_id) &&
      (filter.include_warmup === true || !run.warmup),
  );
  return queried
    .slice(-(filter.last ?? queried.length))
    .filter(
      (run) =>
        (!filter.loop || run.loop === filter.loop) &&
        ((filter.prefill_step_size ?? null) === null || run.prefill_step_size === filter.prefill_step_size) &&
        ((filter.max_kv_size ?? null) === null || (run.max_kv_size ?? 0) === filter.max_kv_size),
    );
}
