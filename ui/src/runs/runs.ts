//! The Runs view's decisions, without a window: the filter the backend
//! applies (to the table and the export alike), how the table sorts, what the
//! filters offer, the benchmark form's validation, the per-case summary, and
//! the numbers and sentences behind the charts.
import type {
  BenchCaseSummary,
  BenchRequest,
  BenchResult,
  Exported,
  MemorySample,
  RunFilter,
  RunRecord,
} from '../lib/backend';
import { formatBytes, formatCount, formatMs, formatTps, modelName } from '../lib/format';
import { BENCH_LIMITS, DEFAULT_BENCH_SHAPE } from '../lib/bindings';

/** How many of the newest runs the view lists (and exports). */
export const RUNS_SHOWN = 500;

// ---------------------------------------------------------------- filters

/** The filter controls as the user set them; '' means "any". */
export interface RunsFilterState {
  model: string;
  kind: string;
  /** '', 'latest' (the newest benchmark), or a bench id. */
  bench: string;
  loop: string;
  /** '', `prefill_step_size=N`, `max_kv_size=N` or `max_kv_size=none`. */
  setting: string;
  /** '', 'none', 'memory' or 'disk': where the cached prompt came from. */
  prefix: string;
  includeWarmup: boolean;
}

export const NO_FILTER: RunsFilterState = {
  model: '',
  kind: '',
  bench: '',
  loop: '',
  setting: '',
  prefix: '',
  includeWarmup: false,
};

export const KIND_ORDER = ['chat', 'run', 'bench', 'bench_cold', 'endpoint', 'api', 'embed'] as const;

/** A record's bench id; null for chat and test runs. */
export function benchIdOf(run: RunRecord): string | null {
  return run.bench_id === '' ? null : run.bench_id;
}

/** The bench id of the newest benchmark run among `runs`; null when none. */
export function latestBenchId(runs: readonly RunRecord[]): string | null {
  let latest: RunRecord | null = null;
  for (const run of runs) {
    if (benchIdOf(run) !== null && (latest === null || run.created_at > latest.created_at)) latest = run;
  }
  return latest === null ? null : benchIdOf(latest);
}

/** The bench id the filter means, with 'latest' resolved; null: any. */
export function resolvedBenchId(state: RunsFilterState, latest: string | null): string | null {
  if (state.bench === '') return null;
  if (state.bench === 'latest') return latest;
  return state.bench;
}

/** A setting filter's value: which setting and which value (null: unbounded). */
export function parseSettingFilter(
  setting: string,
): { name: 'prefill_step_size' | 'max_kv_size'; value: number | null } | null {
  const [name, raw] = setting.split('=');
  if (name !== 'prefill_step_size' && name !== 'max_kv_size') return null;
  if (raw === 'none') return name === 'max_kv_size' ? { name, value: null } : null;
  const value = Number(raw);
  return Number.isInteger(value) ? { name, value } : null;
}

/** The whole filter as the backend applies it (`list_runs`, `export_runs`),
 * so the table and an export cover the same runs. Null when it keeps no run
 * at all: the newest benchmark asked for before any was recorded, which a
 * RunFilter cannot say (its null bench id means any). */
export function toRunFilter(state: RunsFilterState, latest: string | null, last = RUNS_SHOWN): RunFilter | null {
  if (state.bench === 'latest' && latest === null) return null;
  const setting = parseSettingFilter(state.setting);
  return {
    last,
    model_id: state.model === '' ? null : state.model,
    kind: state.kind === '' ? null : state.kind,
    bench_id: resolvedBenchId(state, latest),
    include_warmup: state.includeWarmup,
    loop: state.loop === 'sync' || state.loop === 'pipelined' ? state.loop : null,
    prefill_step_size: setting?.name === 'prefill_step_size' ? setting.value : null,
    // The backend reads 0 as "only unbounded runs".
    max_kv_size: setting?.name === 'max_kv_size' ? (setting.value ?? 0) : null,
    prefix_source: state.prefix === 'none' || state.prefix === 'memory' || state.prefix === 'disk' ? state.prefix : null,
  };
}

/** Every run the view lists, warm-ups included: what the filters offer. */
export const EVERY_RUN: RunFilter = { last: RUNS_SHOWN, include_warmup: true };

/** Whether `filter` selects what EVERY_RUN does: then that one listing serves
 * the table too. */
export function selectsEveryRun(filter: RunFilter): boolean {
  return (
    filter.last === EVERY_RUN.last &&
    filter.include_warmup === true &&
    !filter.model_id &&
    !filter.kind &&
    !filter.bench_id &&
    !filter.loop &&
    (filter.prefill_step_size ?? null) === null &&
    (filter.max_kv_size ?? null) === null &&
    (filter.prefix_source ?? null) === null
  );
}

/** The export's answer in words: "Saved 3 runs to PATH (47.1 KiB)". */
export function exportedMessage(exported: Exported): string {
  const noun = exported.runs === 1 ? 'run' : 'runs';
  return `Saved ${formatCount(exported.runs)} ${noun} to ${exported.path} (${formatBytes(exported.bytes)})`;
}

export interface FilterOption {
  value: string;
  label: string;
}

/** What each filter offers: only values present among `runs`. */
export interface FilterOptions {
  models: FilterOption[];
  kinds: FilterOption[];
  /** Newest benchmark first. */
  benches: FilterOption[];
  loops: FilterOption[];
  settings: FilterOption[];
  prefixes: FilterOption[];
}

/** Where a run's cached prompt came from, in words. */
export const PREFIX_LABELS: Record<string, string> = {
  none: 'all prefilled',
  memory: 'cached in memory',
  disk: 'read from disk',
};

const unique = <T>(values: Iterable<T>): T[] => [...new Set(values)];

export function filterOptions(runs: readonly RunRecord[]): FilterOptions {
  const models = unique(runs.map((run) => run.model_id)).sort();
  const known: readonly string[] = KIND_ORDER;
  const kinds = [
    ...known.filter((kind) => runs.some((run) => run.kind === kind)),
    ...unique(runs.map((run) => run.kind))
      .filter((kind) => !known.includes(kind))
      .sort(),
  ];
  const newestOfBench = new Map<string, string>();
  for (const run of runs) {
    const id = benchIdOf(run);
    if (id !== null && run.created_at > (newestOfBench.get(id) ?? '')) newestOfBench.set(id, run.created_at);
  }
  const benches = [...newestOfBench.entries()].sort((a, b) => b[1].localeCompare(a[1])).map(([id]) => id);
  const loops = unique(runs.map((run) => run.loop)).sort();
  const prefixes = ['none', 'memory', 'disk'].filter((source) => runs.some((run) => run.prefix_source === source));
  const steps = unique(runs.map((run) => run.prefill_step_size)).sort((a, b) => a - b);
  const kvs = unique(runs.map((run) => run.max_kv_size)).sort((a, b) => (a ?? Infinity) - (b ?? Infinity));
  return {
    models: models.map((id) => ({ value: id, label: shortModelName(id) })),
    kinds: kinds.map((kind) => ({ value: kind, label: kindLabel(kind) })),
    benches: benches.map((id) => ({ value: id, label: id })),
    loops: loops.map((loop) => ({ value: loop, label: loop })),
    prefixes: prefixes.map((source) => ({ value: source, label: PREFIX_LABELS[source] ?? source })),
    settings: [
      ...steps.map((step) => ({ value: `prefill_step_size=${step}`, label: `prefill step ${formatCount(step)}` })),
      ...kvs.map((kv) => ({
        value: `max_kv_size=${kv ?? 'none'}`,
        label: kv === null ? 'max KV unbounded' : `max KV ${formatCount(kv)}`,
      })),
    ],
  };
}

// ---------------------------------------------------------------- table

export type SortKey =
  | 'created_at'
  | 'model_id'
  | 'kind'
  | 'load_ms'
  | 'prompt_tokens'
  | 'ttft_ms'
  | 'prefill_tps'
  | 'generated_tokens'
  | 'decode_tps'
  | 'mlx_peak_bytes'
  | 'loop'
  | 'prefill_step_size'
  | 'max_kv_size'
  | 'prefix_source'
  | 'images'
  | 'pressure_max';

export type SortDirection = 'ascending' | 'descending';

export interface SortState {
  key: SortKey;
  direction: SortDirection;
}

/** Newest first. */
export const DEFAULT_SORT: SortState = { key: 'created_at', direction: 'descending' };

export interface Column {
  key: SortKey;
  label: string;
  /** What the column measures, for the header's tooltip and screen readers. */
  description: string;
  numeric: boolean;
}

export const COLUMNS: readonly Column[] = [
  { key: 'created_at', label: 'When', description: 'when the request was made', numeric: false },
  { key: 'model_id', label: 'Model', description: 'model', numeric: false },
  {
    key: 'kind',
    label: 'Kind',
    description: 'chat, test run, benchmark, fresh-process cold start, or another program’s server',
    numeric: false,
  },
  { key: 'load_ms', label: 'Start', description: 'cold (with load time) or warm', numeric: true },
  { key: 'prompt_tokens', label: 'Prompt', description: 'prompt tokens (cached tokens)', numeric: true },
  { key: 'ttft_ms', label: 'TTFT', description: 'time to first token, after load', numeric: true },
  { key: 'prefill_tps', label: 'Prefill', description: 'prefill tokens per second', numeric: true },
  { key: 'generated_tokens', label: 'Gen', description: 'generated tokens', numeric: true },
  { key: 'decode_tps', label: 'Decode', description: 'decode tokens per second', numeric: true },
  { key: 'mlx_peak_bytes', label: 'Peak', description: "MLX's peak memory", numeric: true },
  { key: 'loop', label: 'Loop', description: 'decode loop shape', numeric: false },
  { key: 'prefill_step_size', label: 'Step', description: 'prefill step size', numeric: true },
  { key: 'max_kv_size', label: 'Max KV', description: 'rotating KV cache size', numeric: true },
  {
    key: 'prefix_source',
    label: 'Prefix',
    description: 'where the cached prompt came from: none, the conversation in memory, or a prompt cache read from disk',
    numeric: false,
  },
  {
    key: 'images',
    label: 'Images',
    description: 'images the prompt showed, and encoding them (inside TTFT; 0 ms: their tokens came from the cache)',
    numeric: true,
  },
  { key: 'pressure_max', label: 'Pressure', description: 'highest memory pressure during the run', numeric: false },
];

const PRESSURE_RANK: Record<string, number> = { unknown: 0, normal: 1, warning: 2, critical: 3 };

function sortValue(run: RunRecord, key: SortKey): number | string {
  switch (key) {
    case 'created_at':
    case 'model_id':
    case 'kind':
    case 'loop':
    case 'prefix_source':
      return run[key] ?? 'none';
    case 'pressure_max':
      return PRESSURE_RANK[run.pressure_max] ?? 0;
    case 'max_kv_size':
      // Unbounded is the largest cache.
      return run.max_kv_size ?? Infinity;
    case 'load_ms':
      return run.load_kind === 'warm' ? 0 : (run.load_ms ?? -Infinity);
    case 'images':
      return run.images ?? 0;
    default: {
      const value = run[key];
      return value !== null && Number.isFinite(value) ? value : -Infinity;
    }
  }
}

/** Runs sorted by one column; ties newest first. */
export function sortRuns(runs: readonly RunRecord[], sort: SortState): RunRecord[] {
  const sign = sort.direction === 'ascending' ? 1 : -1;
  return [...runs].sort((a, b) => {
    const x = sortValue(a, sort.key);
    const y = sortValue(b, sort.key);
    const order =
      typeof x === 'number' && typeof y === 'number'
        ? x === y
          ? 0
          : x < y
            ? -1
            : 1
        : String(x).localeCompare(String(y));
    return order !== 0 ? sign * order : b.created_at.localeCompare(a.created_at);
  });
}

/** Clicking a header: the same column flips; a new one starts with its most
 * useful end (numbers largest first, text A to Z). */
export function nextSort(current: SortState, key: SortKey): SortState {
  if (current.key === key) {
    return { key, direction: current.direction === 'ascending' ? 'descending' : 'ascending' };
  }
  const numeric = key === 'created_at' || (COLUMNS.find((column) => column.key === key)?.numeric ?? false);
  return { key, direction: numeric ? 'descending' : 'ascending' };
}

/** `org/name` and folders to the last part; the tiny model says what it is. */
export function shortModelName(modelId: string): string {
  if (modelId === 'tiny') return 'tiny (speed test)';
  return modelName(modelId.replace(/\/+$/, ''));
}

export function kindLabel(kind: string): string {
  switch (kind) {
    case 'bench_cold':
      return 'bench (cold process)';
    case 'run':
      return 'test run';
    case 'endpoint':
      return 'other server';
    case 'api':
      return 'API request';
    case 'embed':
      return 'embeddings';
    default:
      return kind;
  }
}

/** A run's kind as its row says it: a server's runs by the server's name. */
export function runKindLabel(run: Pick<RunRecord, 'kind' | 'server_name'>): string {
  if (run.kind === 'endpoint' && run.server_name !== null) return `${run.server_name} (server)`;
  return kindLabel(run.kind);
}

/** A server's run: timed by Ondo as its client, which cannot see the
 * server's load, its prefill alone, its memory or its loop. */
export function isEndpointRun(run: Pick<RunRecord, 'kind'>): boolean {
  return run.kind === 'endpoint';
}

const whenFormat = new Intl.DateTimeFormat('en-GB', {
  day: 'numeric',
  month: 'short',
  hour: '2-digit',
  minute: '2-digit',
  second: '2-digit',
});

/** "9 Oct, 10:00:05" in local time; the ISO text when it does not parse. */
export function formatWhen(createdAt: string): string {
  const date = new Date(createdAt);
  return Number.isNaN(date.getTime()) ? createdAt : whenFormat.format(date);
}

/** One table row's cells, formatted. */
export interface RunCells {
  when: string;
  model: string;
  kind: string;
  start: string;
  prompt: string;
  ttft: string;
  prefill: string;
  generated: string;
  decode: string;
  peak: string;
  loop: string;
  step: string;
  maxKv: string;
  prefix: string;
  images: string;
  pressure: string;
}

export function runCells(run: RunRecord): RunCells {
  if (isEndpointRun(run)) {
    const unseen = '—';
    return {
      ...ondoRunCells(run),
      start: unseen,
      prefill: unseen,
      peak: unseen,
      loop: unseen,
      step: unseen,
      maxKv: unseen,
    };
  }
  return ondoRunCells(run);
}

/** "1 · 41.0 ms" (images, encoding them), "1 · cached" (their tokens came
 * from the conversation's cache), or "–" for text. */
export function imagesCell(run: RunRecord): string {
  const images = run.images ?? 0;
  const encodeMs = run.image_encode_ms ?? null;
  if (images === 0) return '–';
  if (encodeMs === null) return formatCount(images);
  return `${formatCount(images)} · ${encodeMs === 0 ? 'cached' : formatMs(encodeMs)}`;
}

/** "disk 12 ms", "memory" or "none". */
export function prefixCell(run: RunRecord): string {
  return run.prefix_source === 'disk' && run.prefix_read_ms !== null
    ? `disk ${formatMs(run.prefix_read_ms)}`
    : (run.prefix_source ?? 'none');
}

function ondoRunCells(run: RunRecord): RunCells {
  return {
    when: formatWhen(run.created_at),
    model: shortModelName(run.model_id),
    kind: runKindLabel(run),
    start: run.load_kind === 'cold' ? `cold ${formatMs(run.load_ms)}` : 'warm',
    prompt:
      run.cached_tokens > 0
        ? `${formatCount(run.prompt_tokens)} (${formatCount(run.cached_tokens)} cached)`
        : formatCount(run.prompt_tokens),
    ttft: formatMs(run.ttft_ms),
    prefill: formatTps(run.prefill_tps),
    generated: formatCount(run.generated_tokens),
    decode: formatTps(run.decode_tps),
    peak: formatBytes(run.mlx_peak_bytes),
    loop: run.loop,
    step: formatCount(run.prefill_step_size),
    maxKv: run.max_kv_size === null ? 'unbounded' : formatCount(run.max_kv_size),
    prefix: prefixCell(run),
    images: imagesCell(run),
    pressure: run.pressure_max,
  };
}

/** The selected run's details, as term and value. */
/** Where the cached prompt came from, with what reading it from disk took. */
function prefixDetail(run: RunRecord): string {
  if (run.prefix_source !== 'disk') return PREFIX_LABELS[run.prefix_source ?? 'none'] ?? 'all prefilled';
  const bytes = run.prefix_read_bytes === null ? '' : ` ${formatBytes(run.prefix_read_bytes)}`;
  const ms = run.prefix_read_ms === null ? '' : ` in ${formatMs(run.prefix_read_ms)}`;
  return `read from disk:${bytes}${ms}`;
}

/** "2 images, 512 tok, encoded in 80.0 ms before the prefill" (or their
 * tokens reused from the conversation's cache). */
function imagesDetail(run: RunRecord): string {
  const images = run.images ?? 0;
  const imageTokens = run.image_tokens ?? null;
  const encodeMs = run.image_encode_ms ?? null;
  const count = `${formatCount(images)} image${images === 1 ? '' : 's'}`;
  const tokens = imageTokens === null ? '' : `, ${formatCount(imageTokens)} tok`;
  const encoded =
    encodeMs === 0
      ? ', reused from the cache (nothing encoded)'
      : encodeMs === null
        ? ''
        : `, encoded in ${formatMs(encodeMs)} before the prefill`;
  return `${count}${tokens}${encoded}`;
}

/**
 * How a model split over several machines ran: by layers or by heads, over
 * which hosts and link, and what each decode step moved between them.
 */
export function splitDetail(run: RunRecord): string | null {
  const how = run.split ?? null;
  if (how === null) return null;
  const ranks = run.split_ranks ?? 0;
  const by = how === 'tensor' ? 'by heads' : how === 'pipeline' ? 'by layers' : how;
  const over = `${by} over ${formatCount(ranks)} ranks (${run.split_backend ?? '?'}: ${run.split_hosts ?? '?'})`;
  const bytes = run.split_step_bytes ?? null;
  const linkMs = run.split_step_link_ms ?? null;
  if (bytes === null) return over;
  const time = linkMs === null ? '' : `, about ${formatMs(linkMs)} on the links`;
  return `${over} · ${formatBytes(bytes)} a decode step${time}${splitCompute(run, how)}`;
}

/**
 * What each rank's share of a decode step took computed alone (timed when
 * it loaded), beside the step the run measured: by layers the ranks take
 * turns, so their times add up; by heads they work at once.
 */
function splitCompute(run: RunRecord, how: string): string {
  const ranks = (run.split_rank_step_ms ?? '')
    .split(',')
    .map((part) => Number.parseFloat(part))
    .filter((ms) => Number.isFinite(ms));
  if (ranks.length === 0) return '';
  const each = ranks.map((ms, rank) => `${formatMs(ms)} (rank ${rank})`).join(', ');
  const tps = run.decode_tps ?? 0;
  const step = tps > 0 ? `; a step took ${formatMs(1000 / tps)}` : '';
  const together = how === 'tensor' ? Math.max(...ranks) : ranks.reduce((sum, ms) => sum + ms, 0);
  return ` · computed alone ${each}: ${formatMs(together)}${step}`;
}

/**
 * What a split run's prefill moved between the ranks: the most bytes any
 * rank sent over its chunks and their time on the links (estimated from the
 * link timed when the ranks joined), beside the prefill's own time.
 */
export function splitPrefillDetail(run: RunRecord): string | null {
  const bytes = run.split_prefill_bytes ?? null;
  const linkMs = run.split_prefill_link_ms ?? null;
  if (run.split == null || bytes === null || linkMs === null) return null;
  return `${formatBytes(bytes)} from a rank over ${formatCount(run.prefill_tokens)} tokens, about ${formatMs(linkMs)} on the links of the ${formatMs(run.prefill_ms)} prefill`;
}

export function detailRows(run: RunRecord): [string, string][] {
  const kind: [string, string] = ['Kind', `${runKindLabel(run)}${run.warmup ? ' (warm-up)' : ''}`];
  const bench: [string, string][] =
    run.bench_id !== null ? [['Benchmark', `${run.bench_id}${run.test !== null ? ` · ${run.test}` : ''}`]] : [];
  if (isEndpointRun(run)) {
    const own: string[] = [];
    if (run.server_load_ms !== null) own.push(`load ${formatMs(run.server_load_ms)}`);
    if (run.server_prefill_tps !== null) own.push(`prefill ${formatTps(run.server_prefill_tps)}`);
    if (run.server_decode_tps !== null) own.push(`decode ${formatTps(run.server_decode_tps)}`);
    const counted = run.server_prompt_tokens === null ? 'not counted by the server' : `${formatCount(run.server_prompt_tokens)} as the server counted`;
    return [
      ['Model', run.model_id],
      kind,
      ...bench,
      ['Server', [run.server_name, run.endpoint_dialect, run.endpoint_url].filter((part) => part !== null).join(' · ')],
      ['TTFT', `${formatMs(run.ttft_ms)} at the client`],
      ['Decode', `${formatCount(run.generated_tokens)} tok in ${formatMs(run.decode_ms)} · ${formatTps(run.decode_tps)} at the client`],
      ['Prompt', `${formatCount(run.prompt_tokens)} tok sent, ${counted}, ${formatCount(run.cached_tokens)} cached`],
      ['Server’s own', own.length > 0 ? own.join(' · ') : 'not reported'],
      ['Pressure', `${run.pressure_max} at most`],
      ['Stopped', run.stop_reason],
    ];
  }
  return [
    ['Model', run.model_id],
    kind,
    ...bench,
    ['Start', run.load_kind === 'cold' ? `cold, load ${formatMs(run.load_ms)}` : 'warm (already loaded)'],
    ...(run.cold_start_ms !== null ? ([['Cold start', `${formatMs(run.cold_start_ms)} from process start`]] as [string, string][]) : []),
    ['Prefill', `${formatCount(run.prefill_tokens)} tok in ${formatMs(run.prefill_ms)} · ${formatTps(run.prefill_tps)}`],
    ['TTFT', formatMs(run.ttft_ms)],
    ['Decode', `${formatCount(run.generated_tokens)} tok in ${formatMs(run.decode_ms)} · ${formatTps(run.decode_tps)}`],
    ['Prompt', `${formatCount(run.prompt_tokens)} tok, ${formatCount(run.cached_tokens)} cached`],
    ['Prefix', prefixDetail(run)],
    // Which program sent a request to the local server (the app's own chat
    // with a split model among them).
    ...(run.user_agent ? ([['Client', run.user_agent]] as [string, string][]) : []),
    ...((run.images ?? 0) > 0 ? ([['Images', imagesDetail(run)]] as [string, string][]) : []),
    ...(splitDetail(run) !== null ? ([['Split', splitDetail(run) as string]] as [string, string][]) : []),
    ...(splitPrefillDetail(run) !== null
      ? ([['Split prefill', splitPrefillDetail(run) as string]] as [string, string][])
      : []),
    ['Loop', run.loop],
    ['Batch', batchLabel(run)],
    ...(run.constraint !== null
      ? ([['Held to', `${run.constraint.replace(/_/g, ' ')} · mask ${run.mask_ms_per_token === null ? '–' : `${run.mask_ms_per_token.toFixed(3)} ms`} per token`]] as [string, string][])
      : []),
    ['Prefill step', formatCount(run.prefill_step_size)],
    ['Max KV', run.max_kv_size === null ? 'unbounded' : formatCount(run.max_kv_size)],
    ['MLX peak', formatBytes(run.mlx_peak_bytes)],
    ['KV cache', run.kv_bits === null ? formatBytes(run.kv_cache_bytes) : `${formatBytes(run.kv_cache_bytes)} in ${run.kv_bits} bits`],
    ['Pressure', `${run.pressure_max} at most`],
    ['Stopped', run.stop_reason],
  ];
}

/**
 * How a run shared the engine's batch, in words: the sequences in the
 * forward passes it was in, its wait to be let in and what for, and the
 * prefill chunks it ran between the others' steps.
 */
export function batchLabel(run: RunRecord): string {
  if (run.batch_max_rows === null) return 'none: it had the engine to itself';
  const min = run.batch_min_rows ?? run.batch_max_rows;
  const median = run.batch_median_rows ?? run.batch_max_rows;
  const parts = [
    run.batch_max_rows <= 1
      ? 'alone'
      : min === run.batch_max_rows
        ? `${run.batch_max_rows} sequences`
        : `${min}–${run.batch_max_rows} sequences (median ${median})`,
  ];
  if (run.admission_wait_ms !== null && run.admission_wait_ms >= 1) {
    const why = run.waited_for === null ? '' : ` for ${run.waited_for.replace(/_/g, ' ')}`;
    parts.push(`waited ${formatMs(run.admission_wait_ms)}${why}`);
  }
  if (run.interleaved_chunks !== null && run.interleaved_chunks > 0) {
    parts.push(`${run.interleaved_chunks} of ${run.prefill_chunks ?? run.interleaved_chunks} prefill chunks between others' steps`);
  }
  return parts.join(' · ');
}

/** The next row a key moves the selection to; null: the key is not ours. */
export function moveSelection(index: number, count: number, key: string): number | null {
  if (count === 0) return null;
  switch (key) {
    case 'ArrowDown':
      return Math.min(index + 1, count - 1);
    case 'ArrowUp':
      return Math.max(index - 1, 0);
    case 'Home':
      return 0;
    case 'End':
      return count - 1;
    case 'PageDown':
      return Math.min(index + 10, count - 1);
    case 'PageUp':
      return Math.max(index - 10, 0);
    default:
      return null;
  }
}

// ---------------------------------------------------------------- statistics

export function median(values: readonly number[]): number {
  const sorted = values.filter(Number.isFinite).sort((a, b) => a - b);
  if (sorted.length === 0) return Number.NaN;
  const middle = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? (sorted[middle] as number) : ((sorted[middle - 1] as number) + (sorted[middle] as number)) / 2;
}

// ---------------------------------------------------------------- benchmark form

/** The Benchmark dialog's fields, as typed. */
export interface BenchForm {
  model: string;
  promptLengths: string;
  generateTokens: string;
  repetitions: string;
  warmup: string;
  sync: boolean;
  pipelined: boolean;
  prefillStepSize: string;
  maxKvSize: string;
  /** '' (float), '4' or '8': the KV cache's bits on every run. */
  kvBits: '' | '4' | '8';
  vary: 'none' | 'prefill_step_size' | 'max_kv_size';
  varyValues: string;
  coldRepetitions: string;
}

/** The dialog starts from the core's defaults (BenchShape::default), the
 * same `ondo bench` uses. */
export const DEFAULT_BENCH_FORM: BenchForm = {
  model: 'tiny',
  promptLengths: DEFAULT_BENCH_SHAPE.prompt_tokens.join(', '),
  generateTokens: String(DEFAULT_BENCH_SHAPE.generate_tokens),
  repetitions: String(DEFAULT_BENCH_SHAPE.repetitions),
  warmup: String(DEFAULT_BENCH_SHAPE.warmup),
  sync: DEFAULT_BENCH_SHAPE.loops.includes('sync'),
  pipelined: DEFAULT_BENCH_SHAPE.loops.includes('pipelined'),
  prefillStepSize: String(DEFAULT_BENCH_SHAPE.prefill_step_size),
  maxKvSize: '',
  kvBits: '',
  vary: 'none',
  varyValues: '',
  coldRepetitions: String(DEFAULT_BENCH_SHAPE.cold_repetitions),
};

export type BenchFormErrors = Partial<Record<keyof BenchForm | 'loops', string>>;

export type BenchValidation = { ok: true; request: BenchRequest } | { ok: false; errors: BenchFormErrors };

/** A whole number in [min, max] from a text field; an error sentence otherwise. */
function wholeNumber(text: string, what: string, min: number, max: number): number | string {
  const trimmed = text.trim();
  if (trimmed === '') return `Enter ${what}.`;
  const value = Number(trimmed);
  if (!/^\d+$/.test(trimmed) || !Number.isSafeInteger(value)) return `${capitalise(what)} must be a whole number.`;
  if (value < min || value > max) return `${capitalise(what)} must be from ${formatCount(min)} to ${formatCount(max)}.`;
  return value;
}

function capitalise(text: string): string {
  return text.charAt(0).toUpperCase() + text.slice(1);
}

/** "128, 512" to [128, 512]; an error sentence when any item is not a whole
 * number in range or the list is empty. Duplicates are dropped. */
export function parseNumberList(text: string, what: string, min: number, max: number): number[] | string {
  const items = text
    .split(/[,\s]+/)
    .map((item) => item.trim())
    .filter((item) => item !== '');
  if (items.length === 0) return `Enter at least one ${what}, separated by commas.`;
  const values: number[] = [];
  for (const item of items) {
    const value = wholeNumber(item, what, min, max);
    if (typeof value === 'string') return `“${item}” is not a valid ${what}: use whole numbers from ${formatCount(min)} to ${formatCount(max)}.`;
    if (!values.includes(value)) values.push(value);
  }
  return values;
}

/** The dialog's fields to a request, or one sentence per field that is wrong. */
export function validateBenchForm(form: BenchForm): BenchValidation {
  const errors: BenchFormErrors = {};
  const take = <T>(field: keyof BenchFormErrors, value: T | string): T | null => {
    if (typeof value === 'string') {
      errors[field] = value;
      return null;
    }
    return value;
  };
  const model = form.model.trim();
  if (model === '') errors.model = 'Choose a model.';
  const limits = BENCH_LIMITS;
  const prompts = take('promptLengths', parseNumberList(form.promptLengths, 'prompt length', ...limits.prompt_tokens));
  const generate = take(
    'generateTokens',
    wholeNumber(form.generateTokens, 'tokens to generate', ...limits.generate_tokens),
  );
  const repetitions = take('repetitions', wholeNumber(form.repetitions, 'repetitions', ...limits.repetitions));
  const warmup = take('warmup', wholeNumber(form.warmup, 'warm-ups', ...limits.warmup));
  const step = take(
    'prefillStepSize',
    wholeNumber(form.prefillStepSize, 'prefill step size', ...limits.prefill_step_size),
  );
  const maxKv =
    form.maxKvSize.trim() === ''
      ? null
      : take('maxKvSize', wholeNumber(form.maxKvSize, 'max KV size', ...limits.max_kv_size));
  const cold = take('coldRepetitions', wholeNumber(form.coldRepetitions, 'cold starts', ...limits.cold_repetitions));
  if (form.kvBits !== '' && (form.maxKvSize.trim() !== '' || form.vary !== 'none')) {
    errors.kvBits = 'A bounded KV cache stays in floats: clear Max KV size (and Vary) or choose float.';
  }
  const loops: ('sync' | 'pipelined')[] = [];
  if (form.sync) loops.push('sync');
  if (form.pipelined) loops.push('pipelined');
  if (loops.length === 0) errors.loops = 'Choose at least one loop shape.';
  let vary: BenchRequest['shape']['vary'] = null;
  if (form.vary !== 'none') {
    const values = take(
      'varyValues',
      form.vary === 'prefill_step_size'
        ? parseNumberList(form.varyValues, 'prefill step size', ...limits.prefill_step_size)
        : parseNumberList(form.varyValues, 'max KV size', ...limits.max_kv_size),
    );
    if (values !== null) vary = { setting: form.vary, values };
  }
  if (Object.keys(errors).length > 0) return { ok: false, errors };
  return {
    ok: true,
    request: {
      model,
      shape: {
        prompt_tokens: prompts as number[],
        generate_tokens: generate as number,
        repetitions: repetitions as number,
        warmup: warmup as number,
        loops,
        prefill_step_size: step as number,
        max_kv_size: maxKv,
        vary,
        kv_bits: form.kvBits === '' ? null : Number(form.kvBits),
        kv_group_size: DEFAULT_BENCH_SHAPE.kv_group_size,
        // From the first token: mlx-lm's default start (5000 positions)
        // would leave a benchmark's short prompts in floats.
        quantized_kv_start: form.kvBits === '' ? DEFAULT_BENCH_SHAPE.quantized_kv_start : 0,
        cold_repetitions: cold as number,
      },
    },
  };
}

/** How many runs a request makes (warm-ups and cold starts included). */
export function plannedRuns({ shape }: BenchRequest): number {
  const values = shape.vary?.values.length ?? 1;
  const cases = shape.prompt_tokens.length * shape.loops.length * values;
  return cases * (shape.repetitions + shape.warmup) + shape.cold_repetitions;
}

// ---------------------------------------------------------------- benchmark summary

/** One row of the finished benchmark's table. */
export interface BenchCaseRow {
  key: string;
  test: string;
  loop: 'sync' | 'pipelined';
  settings: string;
  decodeMedian: string;
  decodeRange: string;
  prefillMedian: string;
  prefillRange: string;
  /** Pipelined decode median over sync's, on the pipelined row of a pair. */
  pipelinedOverSync: string | null;
}

function caseShape(summary: BenchCaseSummary): string {
  const c = summary.case;
  return `${c.test}|${c.prompt_tokens}|${c.prefill_step_size}|${c.max_kv_size ?? 'none'}`;
}

function range(values: { min: number | null; max: number | null }): string {
  return `${formatTps(values.min)} – ${formatTps(values.max)}`;
}

export function benchCaseRows(result: BenchResult): BenchCaseRow[] {
  return result.cases.map((summary, index) => {
    const c = summary.case;
    let ratio: string | null = null;
    if (c.loop === 'pipelined') {
      const sync = result.cases.find((other) => other.case.loop === 'sync' && caseShape(other) === caseShape(summary));
      const pipelinedTps = summary.decode_tps.median;
      const syncTps = sync?.decode_tps.median ?? null;
      if (syncTps !== null && pipelinedTps !== null && syncTps > 0 && pipelinedTps > 0) {
        ratio = `${(pipelinedTps / syncTps).toFixed(2)}×`;
      }
    }
    return {
      key: `${caseShape(summary)}|${c.loop}|${index}`,
      test: c.test,
      loop: c.loop,
      settings: `step ${formatCount(c.prefill_step_size)} · KV ${c.max_kv_size === null ? 'unbounded' : formatCount(c.max_kv_size)}`,
      decodeMedian: formatTps(summary.decode_tps.median),
      decodeRange: range(summary.decode_tps),
      prefillMedian: formatTps(summary.prefill_tps.median),
      prefillRange: range(summary.prefill_tps),
      pipelinedOverSync: ratio,
    };
  });
}

// ---------------------------------------------------------------- charts

/** uPlot's columns: x first, then one array per series (null: no point). */
export type ChartColumns = [number[], ...(number | null)[][]];

const positive = (value: number | null): number | null =>
  value !== null && Number.isFinite(value) && value > 0 ? value : null;

/** A measured value, or nothing to count (null comes from NaN or infinity). */
const measured = (value: number | null): value is number => value !== null && Number.isFinite(value);

/** A sample's time; null (a non-finite time) counts as the run's start. */
const sampleTime = (sample: MemorySample): number => sample.t_ms ?? 0;

/** Runs in the order they happened, for the charts over run index. */
export function chronological(runs: readonly RunRecord[]): RunRecord[] {
  return [...runs].sort((a, b) => a.created_at.localeCompare(b.created_at));
}

/** Prefill and decode tok/s per run (x: 1-based run index, oldest first). */
export function speedColumns(runs: readonly RunRecord[]): ChartColumns {
  const ordered = chronological(runs);
  return [
    ordered.map((_, index) => index + 1),
    ordered.map((run) => positive(run.prefill_tps)),
    ordered.map((run) => positive(run.decode_tps)),
  ];
}

/** The side a concurrency benchmark's stream ran on: Ondo's engine, or the
 * server by its name. */
function concurrencySide(run: RunRecord): string {
  return run.server_name ?? 'ondo';
}

/** The sides of the concurrency benchmarks among `runs`, in the order they
 * first ran. */
export function concurrencySides(runs: readonly RunRecord[]): string[] {
  const sides: string[] = [];
  for (const run of chronological(runs)) {
    if (run.concurrency === null || run.aggregate_tps === null || run.warmup) continue;
    const side = concurrencySide(run);
    if (!sides.includes(side)) sides.push(side);
  }
  return sides;
}

/**
 * Aggregate tok/s against streams at once, one series per side (the order of
 * `concurrencySides`): each side's median over its rounds at each stream
 * count. A round is counted once, whichever of its streams carries it.
 */
export function concurrencyColumns(runs: readonly RunRecord[]): ChartColumns {
  const sides = concurrencySides(runs);
  const rounds = new Map<string, { side: string; streams: number; aggregate: number }>();
  for (const run of runs) {
    if (run.concurrency === null || run.aggregate_tps === null || run.warmup) continue;
    const side = concurrencySide(run);
    const key = [side, run.bench_id, run.test, run.repetition, run.concurrency].join('\u0000');
    if (!rounds.has(key)) rounds.set(key, { side, streams: run.concurrency, aggregate: run.aggregate_tps });
  }
  const counts = [...new Set([...rounds.values()].map((round) => round.streams))].sort((a, b) => a - b);
  return [
    counts,
    ...sides.map((side) =>
      counts.map((streams) => {
        const values = [...rounds.values()]
          .filter((round) => round.side === side && round.streams === streams)
          .map((round) => round.aggregate);
        return values.length === 0 ? null : positive(median(values));
      }),
    ),
  ];
}

/** The concurrency chart in words. */
export function concurrencySummary(runs: readonly RunRecord[]): string {
  const sides = concurrencySides(runs);
  const [counts, ...series] = concurrencyColumns(runs);
  if (sides.length === 0 || counts.length === 0) return 'No concurrency benchmark to chart.';
  const most = counts[counts.length - 1] as number;
  const parts = sides.map((side, index) => {
    const values = series[index] ?? [];
    const first = values[0] ?? null;
    const last = values[values.length - 1] ?? null;
    return `${side} ${formatTps(first)} at ${counts[0]} stream${counts[0] === 1 ? '' : 's'}, ${formatTps(last)} at ${most}`;
  });
  return `Aggregate decode in all streams: ${parts.join('; ')}.`;
}

/** Load time (cold runs only) and TTFT per run, ms. */
export function coldWarmColumns(runs: readonly RunRecord[]): ChartColumns {
  const ordered = chronological(runs);
  return [
    ordered.map((_, index) => index + 1),
    ordered.map((run) => (run.load_kind === 'cold' ? positive(run.load_ms) : null)),
    ordered.map((run) => positive(run.ttft_ms)),
  ];
}

export const TIMELINE_SERIES = [
  { key: 'used_bytes', label: 'Used' },
  { key: 'app_bytes', label: 'App' },
  { key: 'wired_bytes', label: 'Wired' },
  { key: 'compressed_bytes', label: 'Compressed' },
  { key: 'footprint_bytes', label: 'Ondo footprint' },
] as const;

export function timelineColumns(samples: readonly MemorySample[]): ChartColumns {
  return [samples.map(sampleTime), ...TIMELINE_SERIES.map(({ key }) => samples.map((sample) => sample[key]))];
}

export interface PressureSegment {
  from_ms: number;
  to_ms: number;
  level: string;
}

/** Consecutive samples of one pressure level merged into segments; each ends
 * where the next begins. */
export function pressureSegments(samples: readonly MemorySample[]): PressureSegment[] {
  const segments: PressureSegment[] = [];
  for (const [index, sample] of samples.entries()) {
    const next = samples[index + 1];
    const end = sampleTime(next ?? sample);
    const last = segments.at(-1);
    if (last && last.level === sample.level) last.to_ms = end;
    else segments.push({ from_ms: sampleTime(sample), to_ms: end, level: sample.level });
  }
  return segments;
}

/** The speed chart in words, for screen readers and where canvas is missing. */
export function speedSummary(runs: readonly RunRecord[]): string {
  if (runs.length === 0) return 'No runs to chart.';
  const prefill = median(runs.map((run) => run.prefill_tps).filter(measured).filter((tps) => tps > 0));
  const decode = median(runs.map((run) => run.decode_tps).filter(measured).filter((tps) => tps > 0));
  const noun = runs.length === 1 ? 'run' : 'runs';
  let text = `${runs.length} ${noun}: median prefill ${formatTps(prefill)}, median decode ${formatTps(decode)}.`;
  if (prefill > 0 && decode > 0) text += ` Prefill processes tokens ${(prefill / decode).toFixed(1)}× faster than decode.`;
  return text;
}

export function coldWarmSummary(runs: readonly RunRecord[]): string {
  if (runs.length === 0) return 'No runs to chart.';
  const cold = runs.filter((run) => run.load_kind === 'cold');
  const ttft = median(runs.map((run) => run.ttft_ms).filter(measured));
  const coldText =
    cold.length === 0
      ? 'No cold starts'
      : `${cold.length} cold ${cold.length === 1 ? 'start' : 'starts'}, median load ${formatMs(median(cold.map((run) => run.load_ms).filter(measured)))}`;
  return `${coldText}; ${runs.length - cold.length} warm. Median time to first token ${formatMs(ttft)}.`;
}

export function timelineSummary(samples: readonly MemorySample[]): string {
  const first = samples[0];
  const last = samples.at(-1);
  if (!first || !last) return 'No memory samples were recorded for this run.';
  const peak = (key: (typeof TIMELINE_SERIES)[number]['key']) => Math.max(...samples.map((sample) => sample[key]));
  const worst = samples.reduce((a, b) => ((PRESSURE_RANK[b.level] ?? 0) > (PRESSURE_RANK[a.level] ?? 0) ? b : a));
  const pressure =
    pressureSegments(samples).length === 1
      ? `pressure ${first.level} throughout`
      : `pressure reached ${worst.level} at ${formatMs(worst.t_ms)}`;
  return (
    `${samples.length} samples over ${formatMs(sampleTime(last) - sampleTime(first))}: used memory peaked at ` +
    `${formatBytes(peak('used_bytes'))}, Ondo's footprint at ${formatBytes(peak('footprint_bytes'))}; ${pressure}.`
  );
}
