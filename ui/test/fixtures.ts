// Backend answers shared by the component tests and the browser test's mocked
// IPC, shaped like what the Rust commands return on this Linux machine.
import type {
  CatalogEntry,
  CatalogOffer,
  CommandError,
  DemoRun,
  DoctorReport,
  FitEstimate,
  LibraryModel,
  MemorySnapshot,
  ModelsView,
  PreparedModel,
  RunRecord,
} from '../src/lib/backend';
import { makeRun } from './fixtures-runs';

export const doctorReport: DoctorReport = {
  ondo_version: '0.1.0',
  mlx_version: '0.32.2',
  backend: 'cpu',
  device: 'cpu (Intel Xeon, 2 cores)',
  os: 'Linux 6.1 (Debian 12)',
  total_memory_bytes: 24 * 2 ** 30,
  available_memory_bytes: 20 * 2 ** 30,
  mlx_memory_limit_bytes: 18 * 2 ** 30,
  recommended_working_set_bytes: null,
  build_profile: 'release',
  data_dir: '/home/me/.local/share/ondo',
  models_dir: '/home/me/.local/share/ondo/models',
  hf_cache_dir: '/home/me/.cache/huggingface/hub',
  hub_endpoint: 'https://huggingface.co',
  hub_token_source: null,
  hub_offline: false,
  memory: null,
  variables: [],
  checks: [
    { name: 'MLX version', passed: true, detail: 'libmlx 0.32.2, as mlx-c expects' },
    { name: 'matmul f32', passed: true, detail: 'max abs diff 0' },
    { name: 'quantized matmul 4-bit', passed: true, detail: 'max abs diff 1e-6' },
  ],
};

/** Where Ondo.app and MLX look for the kernels, in order (ondo::metallib). */
const lookedIn = [
  '/Applications/Ondo.app/Contents/Resources/mlx.metallib',
  '/Applications/Ondo.app/Contents/Frameworks/mlx.metallib',
  '/Applications/Ondo.app/Contents/Frameworks/Resources/mlx.metallib',
  '/Applications/Ondo.app/Contents/Frameworks/Resources/default.metallib',
];

/** The start-up check on a Mac whose Ondo.app lost its mlx.metallib, as the
 * shell words it. */
export const kernelsMissing: CommandError = {
  kind: 'metal_kernels_unavailable',
  message:
    "MLX's Metal kernels (mlx.metallib) were not found, so no model can run; looked for them at " +
    `${lookedIn.join(', ')} and where libmlx was built. ` +
    'Reinstall Ondo from its disk image, which carries them in Ondo.app/Contents/Resources',
};

/** The doctor report on that Mac: the Metal check failed, so the compute
 * checks did not run. */
export const doctorReportWithoutKernels: DoctorReport = {
  ...doctorReport,
  backend: 'metal',
  device: 'Apple M2 Pro',
  os: 'macOS 14.5',
  recommended_working_set_bytes: null,
  metal: {
    device_name: null,
    metallib: null,
    metallib_macos: null,
    libmlx: '/Applications/Ondo.app/Contents/Frameworks/libmlx.dylib',
    looked_in: lookedIn,
  },
  checks: [
    { name: 'MLX version', passed: true, detail: 'libmlx 0.32.2, as mlx-c expects' },
    { name: 'Metal GPU and kernels', passed: false, detail: kernelsMissing.message },
  ],
};

export const preparedTinyModel: PreparedModel = {
  model_dir: '/home/me/.local/share/ondo/models/builtin-tiny',
};

export const demoRun: DemoRun = {
  model_dir: preparedTinyModel.model_dir,
  load_kind: 'cold',
  loop: 'pipelined',
  load_ms: 41.7,
  prompt_tokens: 12,
  ttft_ms: 8.93,
  prefill_ms: 8.41,
  prefill_tps: 1426.9,
  generated_tokens: 32,
  decode_ms: 66.2,
  decode_tps: 468.3,
  kv_cache_bytes: 360_448,
  mlx_peak_bytes: 12.5 * 2 ** 20,
  text: ' quartz lantern mild the the orbit seventeen velvet ridge',
};

const GiB = 2 ** 30;
const MiB = 2 ** 20;

/** A fit at 4K context on a machine with 20 GiB available. */
export function fitAt4k(weights: number, verdict: FitEstimate['verdict'], available = 20 * GiB, advice: string[] = []): FitEstimate {
  const kv = 448 * MiB;
  const overhead = 512 * MiB;
  return {
    weights_bytes: weights,
    kv_cache_bytes: kv,
    overhead_bytes: overhead,
    needed_bytes: weights + kv + overhead,
    available_bytes: available,
    working_set_bytes: null,
    budget_bytes: available * 0.9,
    context_tokens: 4096,
    kv_bytes_per_token: kv / 4096,
    kv_cache_note: null,
    parameters: null,
    active_parameters: null,
    experts_note: null,
    verdict,
    max_context_that_fits: verdict === 'will_not_fit' ? null : 40_960,
    advice,
  };
}

function entry(repo_id: string, display_name: string, parameters: number, size_bytes: number, note: string): CatalogEntry {
  return {
    repo_id,
    display_name,
    family: repo_id.includes('Qwen') ? 'qwen3' : 'llama',
    parameters,
    quantization: '4-bit',
    size_bytes,
    note,
  };
}

export const llama3b: CatalogOffer = {
  entry: entry(
    'mlx-community/Llama-3.2-3B-Instruct-4bit',
    'Llama 3.2 3B Instruct',
    3_210_000_000,
    1_800_000_000,
    'Quick and capable at chat and summaries; a good first model.',
  ),
  fit: fitAt4k(1_800_000_000, 'fits'),
  downloaded: false,
  unsupported: null,
};

export const qwen06b: CatalogOffer = {
  entry: entry(
    'mlx-community/Qwen3-0.6B-4bit',
    'Qwen3 0.6B',
    600_000_000,
    340_000_000,
    'Tiny and very fast; for trying Ondo out rather than for answers you rely on.',
  ),
  fit: fitAt4k(340_000_000, 'fits'),
  downloaded: false,
  unsupported: null,
};

export const qwen8b: CatalogOffer = {
  entry: entry('mlx-community/Qwen3-8B-4bit', 'Qwen3 8B', 8_190_000_000, 4_600_000_000, 'Strong at reasoning and code.'),
  fit: fitAt4k(4_600_000_000, 'tight', 6 * GiB, ['Close other apps first: it needs most of the free memory.']),
  downloaded: false,
  unsupported: null,
};

export const mistral7b: CatalogOffer = {
  entry: entry(
    'mlx-community/Mistral-7B-Instruct-v0.3-4bit',
    'Mistral 7B Instruct v0.3',
    7_250_000_000,
    4_080_000_000,
    'A well-known all-rounder.',
  ),
  fit: fitAt4k(4_080_000_000, 'will_not_fit', 3 * GiB, [
    'It needs 4.74 GiB but only 3.00 GiB is available.',
    'Quit memory-hungry apps, or pick a smaller model such as Qwen3 0.6B.',
  ]),
  downloaded: false,
  unsupported: null,
};

/**
 * Qwen3 30B-A3B, a mixture of experts Ondo does not run yet: all 128 experts
 * in memory, 8 of them per token.
 */
export const qwen30bMoe: CatalogOffer = {
  entry: {
    ...entry(
      'mlx-community/Qwen3-30B-A3B-4bit',
      'Qwen3 30B-A3B',
      30_500_000_000,
      17_200_000_000,
      'A mixture of experts: answers at about the speed of a 3B model.',
    ),
    family: 'qwen3_moe',
  },
  fit: {
    ...fitAt4k(17_200_000_000, 'fits', 48 * GiB),
    parameters: 30_531_911_680,
    active_parameters: 3_352_821_760,
    experts_note: 'all 128 experts stay in memory; 8 of them work on each token',
  },
  downloaded: false,
  unsupported: null,
};

/** Gemma 3 1B: most layers keep a 512-token window. */
export const gemma1b: CatalogOffer = {
  entry: { ...entry('mlx-community/gemma-3-1b-it-4bit', 'Gemma 3 1B', 1_000_000_000, 563_000_000, 'Small and light.'), family: 'gemma3_text' },
  fit: { ...fitAt4k(563_000_000, 'fits'), kv_cache_note: '22 of 26 layers keep at most 512 positions' },
  downloaded: false,
  unsupported: null,
};

/** A hub model outside the catalog, checked by its id: tight on 6 GiB. */
export const qwen4bFit: FitEstimate = fitAt4k(2_260_000_000, 'tight', 6 * GiB, [
  'Close other apps first: it needs most of the free memory.',
]);

/** The models view with nothing on this machine. */
export const emptyModelsView: ModelsView = {
  library: [],
  catalog: [llama3b, qwen06b, qwen8b, mistral7b],
  default_model: llama3b.entry.repo_id,
  hf_cache_dir: '/home/me/.cache/huggingface/hub',
  offline: false,
};

export const cachedQwen: LibraryModel = {
  id: 'mlx-community/Qwen3-0.6B-4bit',
  source: 'hub_cache',
  path: '/home/me/.cache/huggingface/hub/models--mlx-community--Qwen3-0.6B-4bit',
  revisions: ['main'],
  commit: '0123456789abcdef0123456789abcdef01234567',
  size_on_disk_bytes: 335_000_000,
  partial_bytes: 0,
  model_type: 'qwen3',
  quantization: '4-bit',
  parameters: 596_000_000,
  unsupported: null,
  complete: true,
  problem: null,
  embedding: false,
};

export const partialLlama: LibraryModel = {
  id: 'mlx-community/Llama-3.2-1B-Instruct-4bit',
  source: 'hub_cache',
  path: '/home/me/.cache/huggingface/hub/models--mlx-community--Llama-3.2-1B-Instruct-4bit',
  revisions: ['main'],
  commit: null,
  size_on_disk_bytes: 210_000_000,
  partial_bytes: 210_000_000,
  model_type: 'llama',
  quantization: '4-bit',
  parameters: 1_240_000_000,
  unsupported: null,
  complete: false,
  problem: 'model.safetensors is partly downloaded; download it again to finish',
  embedding: false,
};

/** The models view once Qwen3 0.6B is downloaded. */
export const modelsViewWithQwen: ModelsView = {
  ...emptyModelsView,
  library: [cachedQwen],
  catalog: emptyModelsView.catalog.map((offer) =>
    offer.entry.repo_id === cachedQwen.id ? { ...offer, downloaded: true } : offer,
  ),
};

export const memorySnapshot: MemorySnapshot = {
  taken_at_unix_ms: 1_760_000_000_000,
  level: 'normal',
  level_source: 'linux_psi',
  total_bytes: 24 * GiB,
  available_bytes: 20 * GiB,
  used_bytes: 4 * GiB,
  app_bytes: 2.5 * GiB,
  wired_bytes: 1 * GiB,
  compressed_bytes: 0.5 * GiB,
  cached_bytes: 6 * GiB,
  swap_used_bytes: 512 * MiB,
  swap_total_bytes: 2 * GiB,
  process_footprint_bytes: 182 * MiB,
  psi: null,
  swap_in_pages: null,
  swap_out_pages: null,
};

/** A chat's first answer on the tiny model: the model was loaded (cold). */
export const chatRunCold: RunRecord = makeRun({
  run_id: 'run-chat-1',
  created_at: '2025-10-09T10:00:00Z',
  kind: 'chat',
  model_id: 'tiny',
  load_kind: 'cold',
  loop: 'pipelined',
  load_ms: 15,
  ttft_ms: 8.5,
  prefill_ms: 3.2,
  decode_ms: 39.2,
  prefill_tps: 3790.4,
  decode_tps: 382.7,
  prompt_tokens: 12,
  prefill_tokens: 12,
  generated_tokens: 16,
  mlx_peak_bytes: 7.4 * MiB,
  kv_cache_bytes: 180_224,
  prefill_step_size: 512,
  max_tokens: 16,
});

/** The second answer of the same conversation: warm, most of the prompt cached. */
export const chatRunWarm: RunRecord = {
  ...chatRunCold,
  run_id: 'run-chat-2',
  load_kind: 'warm',
  load_ms: 0,
  ttft_ms: 3.1,
  prompt_tokens: 42,
  cached_tokens: 30,
  prefill_tokens: 12,
  prefill_tps: 3870,
  decode_tps: 401.2,
};
