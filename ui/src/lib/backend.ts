// The commands of the Tauri shell (src-tauri/src/commands.rs) and the shapes
// they answer with. Written by hand to match the Rust types field for field;
// to be generated from Rust (tauri-specta) once the command set settles.
import { Channel, invoke } from '@tauri-apps/api/core';
import { listen, type UnlistenFn } from '@tauri-apps/api/event';

/** One MLX self-test from `ondo doctor`. */
export interface Check {
  name: string;
  passed: boolean;
  detail: string;
}

/** What Ondo runs on (`ondo::doctor::DoctorReport`). */
export interface DoctorReport {
  ondo_version: string;
  mlx_version: string;
  backend: 'metal' | 'cuda' | 'cpu';
  device: string;
  os?: string;
  total_memory_bytes: number;
  available_memory_bytes: number;
  build_profile?: string;
  data_dir: string;
  hf_cache_dir: string;
  checks: Check[];
}

/** The local library as the Models section shows it. */
export interface LibraryStatus {
  /** Repo ids (`ORG/NAME`) found in the Hugging Face cache. */
  downloaded: string[];
  recommended_model_id: string;
  downloads_available: boolean;
  models_dir: string;
  hf_cache_dir: string;
}

/** The built-in tiny model, written and ready. */
export interface PreparedModel {
  model_dir: string;
}

/** Which model a test generation runs. */
export type ModelChoice = { kind: 'builtin_tiny' };

/** One timed generation (`ondo::demo::DemoRun`); durations in ms. */
export interface DemoRun {
  model_dir: string;
  /** "cold" when this run loaded the model, "warm" when it was resident. */
  load_kind: 'cold' | 'warm';
  /** The decode loop's shape: one sync per token, or the next step queued first. */
  loop: 'sync' | 'pipelined';
  load_ms: number;
  prompt_tokens: number;
  ttft_ms: number;
  prefill_ms: number;
  prefill_tps: number;
  generated_tokens: number;
  decode_ms: number;
  decode_tps: number;
  kv_cache_bytes: number;
  /** MLX's peak memory during the run (reset at its start). */
  mlx_peak_bytes: number;
  text: string;
}

/** How every command fails: `kind` to branch on, `message` to show. Hub
 * errors keep the hub's kind (`repo_not_found`, `unauthorized`, `forbidden`,
 * `unreachable`, `disk_full`, `checksum_mismatch`, `interrupted`, `cancelled`,
 * `not_cached_offline`, `invalid_repo_id`, ...). */
export interface CommandError {
  kind: string;
  message: string;
}

/** `ondo::hub::fit::FitEstimate`: will a model fit, with the numbers. */
export interface FitEstimate {
  weights_bytes: number;
  kv_cache_bytes: number;
  overhead_bytes: number;
  needed_bytes: number;
  available_bytes: number;
  working_set_bytes: number | null;
  budget_bytes: number;
  context_tokens: number;
  kv_bytes_per_token: number;
  verdict: 'fits' | 'tight' | 'will_not_fit';
  max_context_that_fits: number | null;
  /** Sentences a user can act on; empty when it fits. */
  advice: string[];
}

/** `ondo::hub::catalog::CatalogEntry`. */
export interface CatalogEntry {
  repo_id: string;
  display_name: string;
  family: string;
  parameters: number;
  quantization: string;
  /** Approximate size on disk. */
  size_bytes: number;
  context_length: number;
  note: string;
}

/** A catalog model as offered on this machine. */
export interface CatalogOffer {
  entry: CatalogEntry;
  fit: FitEstimate;
  downloaded: boolean;
}

/** `ondo::hub::library::LibraryModel`: a model on this machine. */
export interface LibraryModel {
  id: string;
  source: 'hub_cache' | 'folder' | 'ondo';
  path: string;
  revisions: string[];
  commit: string | null;
  size_on_disk_bytes: number;
  partial_bytes: number;
  model_type: string | null;
  quantization: string | null;
  parameters: number | null;
  complete: boolean;
  problem: string | null;
}

/** What the Models screen shows (`list_models`). */
export interface ModelsView {
  library: LibraryModel[];
  catalog: CatalogOffer[];
  default_model: string;
  hf_cache_dir: string;
  offline: boolean;
}

/** `ondo::hub::DownloadEvent`, streamed while a download runs. */
export type DownloadEvent =
  | {
      event: 'planned';
      model: string;
      commit: string;
      files: number;
      total_bytes: number;
      present_bytes: number;
    }
  | {
      event: 'progress';
      file: string;
      file_bytes: number;
      file_total_bytes: number;
      done_bytes: number;
      total_bytes: number;
      bytes_per_second: number;
      eta_seconds: number | null;
    }
  | { event: 'retrying'; file: string; attempt: number; detail: string }
  | { event: 'file_done'; file: string; verified: boolean; fetched_bytes: number };

/** `ondo::hub::DownloadSummary`. */
export interface DownloadSummary {
  model: string;
  commit: string;
  snapshot_dir: string;
  files: number;
  total_bytes: number;
  fetched_bytes: number;
  download_ms: number;
}

/** `ondo_os::MemorySnapshot`: the gauge's numbers. */
export interface MemorySnapshot {
  taken_at_unix_ms: number;
  level: 'normal' | 'warning' | 'critical' | 'unknown';
  total_bytes: number;
  available_bytes: number;
  used_bytes: number;
  app_bytes: number;
  wired_bytes: number;
  compressed_bytes: number;
  cached_bytes: number;
  swap_used_bytes: number;
  swap_total_bytes: number;
  process_footprint_bytes: number;
}

/** One point of a run's memory timeline (`ondo::store::MemorySample`). */
export interface MemorySample {
  t_ms: number;
  level: string;
  used_bytes: number;
  app_bytes: number;
  wired_bytes: number;
  compressed_bytes: number;
  swap_used_bytes: number;
  footprint_bytes: number;
}

/** A recorded run (`ondo::store::RunRecord`); the fields the UI reads.
 * docs/REPORT_SCHEMA.md describes every field. */
export interface RunRecord {
  run_id: string;
  created_at: string;
  kind: string;
  /** Groups the runs of one benchmark; null for chat and test runs. */
  bench_id: string | null;
  /** The test's shape, llama-bench style ("pp128+tg64"); null outside benchmarks. */
  test: string | null;
  /** 0-based repetition within its test; null outside benchmarks. */
  repetition: number | null;
  /** A warm-up repetition: recorded, never in the statistics. */
  warmup: boolean;
  model_id: string;
  load_kind: 'cold' | 'warm';
  /** The run also paid for a process start and library init (`bench_cold`). */
  fresh_process: boolean;
  loop: 'sync' | 'pipelined';
  load_ms: number;
  ttft_ms: number;
  prefill_ms: number;
  decode_ms: number;
  /** Process start to first token, ms; set for fresh-process runs only. */
  cold_start_ms: number | null;
  prefill_tps: number;
  decode_tps: number;
  prompt_tokens: number;
  cached_tokens: number;
  prefill_tokens: number;
  generated_tokens: number;
  mlx_peak_bytes: number;
  kv_cache_bytes: number;
  pressure_max: string;
  prefill_step_size: number;
  max_kv_size: number | null;
  stop_reason: string;
  [field: string]: unknown;
}

/** A model the pool keeps warm. */
export interface PooledModel {
  model_id: string;
  model_dir: string;
  weights_bytes: number;
  kv_cache_bytes: number;
  idle_ms: number;
  expires_in_ms: number | null;
  busy: boolean;
}

/** Something the pool did, and why. */
export interface PoolEvent {
  at: string;
  action: string;
  model_id: string;
  reason: string;
  bytes: number | null;
}

/** One message of a conversation. */
export interface ChatMessage {
  role: 'system' | 'user' | 'assistant';
  content: string;
}

/** `ondo::session::chat::GenerationSettings` (every field optional when sent). */
export interface GenerationSettings {
  max_tokens: number;
  temperature: number;
  top_p: number;
  top_k: number;
  min_p: number;
  repetition_penalty: number | null;
  seed: number | null;
  loop: 'sync' | 'pipelined';
  prefill_step_size: number;
  max_kv_size: number | null;
}

/** Streamed while an answer is written (`ondo::session::chat::ChatEvent`). */
export type ChatEvent =
  | {
      event: 'started';
      load_kind: 'cold' | 'warm';
      load_ms: number;
      prompt_tokens: number;
      cached_tokens: number;
    }
  | { event: 'delta'; text: string };

/** `ondo::session::settings::AppSettings`. */
export interface AppSettings {
  /** Minutes an idle model stays loaded; null keeps it until memory is needed. */
  keep_alive_minutes: number | null;
  memory_budget_bytes: number | null;
  generation: GenerationSettings;
  theme: 'system' | 'light' | 'dark';
  /** Where downloads go; null: the Hugging Face cache (shared with mlx-lm). */
  models_folder: string | null;
  /** Start Ondo (in the menu bar only) when the user logs in. */
  launch_at_login: boolean;
  /** Toggles the popover from anywhere, e.g. "CommandOrControl+Shift+O"; null: none. */
  global_shortcut: string | null;
}

/** Which recorded runs a screen or an export covers (`RunFilter` in
 * src-tauri/src/runs.rs); a null or missing field means "any". */
export interface RunFilter {
  /** Only the newest N (listed oldest first). */
  last: number | null;
  model_id?: string | null;
  /** "chat", "run", "bench" or "bench_cold". */
  kind?: string | null;
  bench_id?: string | null;
  /** Warm-up repetitions are recorded but left out unless asked for. */
  include_warmup?: boolean;
  /** Only runs with this decode loop shape. */
  loop?: 'sync' | 'pipelined' | null;
  /** Only runs with this prefill step size, tokens. */
  prefill_step_size?: number | null;
  /** Only runs with this KV cache bound, tokens; 0: only unbounded runs. */
  max_kv_size?: number | null;
}

/** What `export_runs` wrote. */
export interface Exported {
  /** How many runs the report holds. */
  runs: number;
  /** The report's size on disk. */
  bytes: number;
  /** Where it was written. */
  path: string;
}

/** A benchmark the Benchmark dialog starts (`ondo::bench::plan::BenchPlan`). */
export interface BenchRequest {
  /** "tiny", a folder, or a downloaded repo id. */
  model: string;
  prompt_tokens: number[];
  generate_tokens: number;
  repetitions: number;
  warmup: number;
  loops: ('sync' | 'pipelined')[];
  prefill_step_size: number;
  max_kv_size: number | null;
  /** One setting tried at several values (each case runs once per value). */
  vary: { setting: 'prefill_step_size' | 'max_kv_size'; values: number[] } | null;
  /** Cold starts measured in fresh processes. */
  cold_repetitions: number;
}

/** Streamed while a benchmark runs. */
export type BenchEvent = { event: 'progress'; done: number; total: number; what: string };

/** Samples of one metric (`ondo::bench::Summary`). */
export interface Summary {
  median: number;
  min: number;
  max: number;
  mean: number;
  stddev: number;
  samples: number[];
}

/** One case of a finished benchmark (`ondo::bench::plan::CaseSummary`). */
export interface BenchCaseSummary {
  case: {
    test: string;
    prompt_tokens: number;
    loop: 'sync' | 'pipelined';
    prefill_step_size: number;
    max_kv_size: number | null;
  };
  ttft_ms: Summary;
  prefill_tps: Summary;
  decode_tps: Summary;
  mlx_peak_bytes: Summary;
  decode_roofline_pct: Summary | null;
}

/** What a finished benchmark returns; every run is also in the history. */
export interface BenchResult {
  bench_id: string;
  runs: number;
  cases: BenchCaseSummary[];
  cold_start_ms: Summary | null;
  memory_bandwidth_gbps: number | null;
  warnings: string[];
}

/** The app-wide events the shell emits (names and payloads). */
export interface AppEvents {
  /** The warm models changed (loaded, unloaded, busy or idle). */
  'ondo://engine-state': { resident: PooledModel[] };
  /** The memory-pressure level changed: "normal", "warning" or "critical". */
  'ondo://pressure-level': { level: string };
  /** A model was downloaded, deleted or added. */
  'ondo://models-changed': Record<string, never>;
  /** A run was recorded (chat, test generation or a benchmark's run). */
  'ondo://runs-changed': { run_id: string };
  /** The tray menu asks a window to show a view ('models' goes to the popover). */
  'ondo://navigate': { view: AppView | 'models' };
  /** The settings were saved (in any window). */
  'ondo://settings-changed': AppSettings;
}

/** The views of the main window (the popover is its own window). */
export type AppView = 'runs' | 'settings';

export interface PoolStatus {
  resident: PooledModel[];
  events: PoolEvent[];
}

/** The prompt and output limit of the popover's test generation. */
export const TEST_PROMPT = 'Explain in one sentence why the sky is blue.';
export const TEST_MAX_TOKENS = 32;

export function isCommandError(value: unknown): value is CommandError {
  return (
    typeof value === 'object' &&
    value !== null &&
    typeof (value as CommandError).kind === 'string' &&
    typeof (value as CommandError).message === 'string'
  );
}

/** Turns anything a rejected invoke may carry into a CommandError. */
export function toCommandError(reason: unknown): CommandError {
  if (isCommandError(reason)) return reason;
  const message = reason instanceof Error ? reason.message : String(reason);
  return { kind: 'internal', message };
}

export const backend = {
  doctorReport: () => invoke<DoctorReport>('doctor_report'),
  libraryStatus: () => invoke<LibraryStatus>('library_status'),
  prepareBuiltinModel: () => invoke<PreparedModel>('prepare_builtin_model'),
  runTestGeneration: (model: ModelChoice, prompt: string, maxTokens: number) =>
    invoke<DemoRun>('run_test_generation', { model, prompt, maxTokens }),
  listModels: () => invoke<ModelsView>('list_models'),
  fitModel: (model: string, context: number) =>
    invoke<FitEstimate>('fit_model', { model, context }),
  /** Downloads `model`, calling `onEvent` with progress; resolves when done. */
  downloadModel: (model: string, onEvent: (event: DownloadEvent) => void) => {
    const channel = new Channel<DownloadEvent>();
    channel.onmessage = onEvent;
    return invoke<DownloadSummary>('download_model', { model, onEvent: channel });
  },
  /** Pauses a download (what arrived is kept; downloading again continues). */
  cancelDownload: (model: string) => invoke<boolean>('cancel_download', { model }),
  deleteModel: (model: string) => invoke<number>('delete_model', { model }),
  recentRuns: (last: number) => invoke<RunRecord[]>('recent_runs', { last }),
  runTimeline: (runId: string) => invoke<MemorySample[]>('run_timeline', { runId }),
  memoryNow: () => invoke<MemorySnapshot>('memory_now'),
  poolStatus: () => invoke<PoolStatus>('pool_status'),
  /** Unloads a warm model now; false when it was not loaded. */
  unloadModel: (modelDir: string) => invoke<boolean>('unload_model', { modelDir }),
  /** Answers the last user message of `messages` with `model` ("tiny", a
   * folder or a downloaded repo id), streaming to `onEvent`; resolves with the
   * run's record (the footer's numbers). */
  chatSend: (
    model: string,
    conversationId: string,
    systemPrompt: string | null,
    messages: ChatMessage[],
    settings: Partial<GenerationSettings>,
    onEvent: (event: ChatEvent) => void,
  ) => {
    const channel = new Channel<ChatEvent>();
    channel.onmessage = onEvent;
    return invoke<RunRecord>('chat_send', {
      model,
      conversationId,
      systemPrompt,
      messages,
      settings,
      onEvent: channel,
    });
  },
  /** Stops the answer being written; the partial answer is kept. */
  chatStop: (conversationId: string) => invoke<boolean>('chat_stop', { conversationId }),
  /** Lets a conversation's KV cache go (New conversation). */
  chatForget: (conversationId: string) => invoke<void>('chat_forget', { conversationId }),
  getSettings: () => invoke<AppSettings>('get_settings'),
  setSettings: (settings: AppSettings) => invoke<void>('set_settings', { settings }),
  /** Recorded runs, oldest first. */
  listRuns: (filter: RunFilter) => invoke<RunRecord[]>('list_runs', { filter }),
  /** Runs a benchmark plan, calling `onEvent` with progress; every run is
   * recorded under the returned bench id. */
  runBenchmark: (request: BenchRequest, onEvent: (event: BenchEvent) => void) => {
    const channel = new Channel<BenchEvent>();
    channel.onmessage = onEvent;
    return invoke<BenchResult>('run_benchmark', { request, onEvent: channel });
  },
  /** Stops the running benchmark after the run in progress. */
  cancelBenchmark: () => invoke<boolean>('cancel_benchmark'),
  /** Asks the user where to save a report (the system's save dialog); null
   * when they cancel. */
  chooseExportPath: (format: string) => invoke<string | null>('choose_export_path', { format }),
  /** Writes the runs `filter` selects to `path` in `format` (json, jsonl,
   * csv, md, html); says how many runs and bytes it wrote, and where. */
  exportRuns: (filter: RunFilter, format: string, path: string) =>
    invoke<Exported>('export_runs', { filter, format, path }),
  /** Asks the user for a folder (the system's dialog); null when cancelled. */
  chooseFolder: () => invoke<string | null>('choose_folder'),
  /** Opens (or focuses) the main window on a view. */
  openWindow: (view: AppView) => invoke<void>('open_window', { view }),
  /** Listens to one of the shell's app-wide events. */
  onAppEvent: <K extends keyof AppEvents>(
    name: K,
    handler: (payload: AppEvents[K]) => void,
  ): Promise<UnlistenFn> => listen<AppEvents[K]>(name, (event) => handler(event.payload)),
};

export type Backend = typeof backend;
