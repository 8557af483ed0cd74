// Backend answers shared by the component tests and the browser test's mocked
// IPC, shaped like what the Rust commands return on this Linux machine.
import type { DemoRun, DoctorReport, LibraryStatus, PreparedModel } from '../src/lib/backend';

export const doctorReport: DoctorReport = {
  ondo_version: '0.1.0',
  mlx_version: '0.32.2',
  backend: 'cpu',
  device: 'cpu (Intel Xeon, 2 cores)',
  os: 'Linux 6.1 (Debian 12)',
  total_memory_bytes: 24 * 2 ** 30,
  available_memory_bytes: 20 * 2 ** 30,
  build_profile: 'release',
  data_dir: '/home/me/.local/share/ondo',
  hf_cache_dir: '/home/me/.cache/huggingface/hub',
  checks: [
    { name: 'MLX version', passed: true, detail: 'libmlx 0.32.2, as mlx-c expects' },
    { name: 'matmul f32', passed: true, detail: 'max abs diff 0' },
    { name: 'quantized matmul 4-bit', passed: true, detail: 'max abs diff 1e-6' },
  ],
};

export const emptyLibrary: LibraryStatus = {
  downloaded: [],
  recommended_model_id: 'mlx-community/Llama-3.2-3B-Instruct-4bit',
  downloads_available: false,
  models_dir: '/home/me/.local/share/ondo/models',
  hf_cache_dir: '/home/me/.cache/huggingface/hub',
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
