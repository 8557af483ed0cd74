// The commands of the Tauri shell (src-tauri/src/commands.rs) and the shapes
// they answer with. Written by hand to match the Rust types field for field;
// to be generated from Rust (tauri-specta) once the command set settles.
import { invoke } from '@tauri-apps/api/core';

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

/** How every command fails: `kind` to branch on, `message` to show. */
export interface CommandError {
  kind: 'invalid_input' | 'model_unavailable' | 'generation_failed' | 'internal';
  message: string;
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
};

export type Backend = typeof backend;
