// Settings as the shell answers `get_settings`, shared by the component tests
// and the browser tests' mocked IPC.
import type { AppSettings } from '../src/lib/backend';

const GiB = 2 ** 30;

/** Someone's saved settings: every field away from its default, so a test
 * sees which value came from where. */
export const savedSettings: AppSettings = {
  keep_alive_minutes: 5,
  memory_budget_bytes: 16 * GiB,
  prompt_cache_budget_bytes: null,
  generation: {
    max_tokens: 256,
    temperature: 0.7,
    top_p: 0.9,
    top_k: 40,
    min_p: 0.05,
    repetition_penalty: 1.1,
    seed: 42,
    loop: 'pipelined',
    prefill_step_size: 512,
    max_kv_size: 4096,
    kv_bits: 8,
    kv_group_size: 128,
    quantized_kv_start: 2048,
    max_batch: 4,
    max_image_mib: 20,
    max_image_megapixels: 32,
  },
  theme: 'system',
  models_folder: '/Users/me/Models',
  launch_at_login: true,
  global_shortcut: 'CommandOrControl+Shift+O',
  local_server: {
    enabled: false,
    port: 11480,
    api_key: null,
    allowed_origins: [],
  },
};

/** What the chat tests start from: answers of at most 64 tokens. */
export const chatSettings: AppSettings = {
  keep_alive_minutes: 5,
  memory_budget_bytes: null,
  prompt_cache_budget_bytes: null,
  generation: {
    max_tokens: 64,
    temperature: 0.7,
    top_p: 0.9,
    top_k: 0,
    min_p: 0,
    repetition_penalty: null,
    seed: null,
    loop: 'pipelined',
    prefill_step_size: 512,
    max_kv_size: null,
    kv_bits: null,
    kv_group_size: 64,
    quantized_kv_start: 5000,
    max_batch: 8,
    max_image_mib: 20,
    max_image_megapixels: 32,
  },
  theme: 'system',
  models_folder: null,
  launch_at_login: false,
  global_shortcut: 'CommandOrControl+Shift+O',
  local_server: {
    enabled: false,
    port: 11480,
    api_key: null,
    allowed_origins: [],
  },
};

/** Where the mocked folder dialog points. */
export const chosenFolder = '/Volumes/External/ondo-models';
