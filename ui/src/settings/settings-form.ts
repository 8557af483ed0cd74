// The Settings form's state and rules: AppSettings to the strings the inputs
// edit and back, every range check with the sentence shown next to the
// field, and the global-shortcut recorder. Pure, so every rule is unit-tested.
import type { AppSettings } from '../lib/backend';
import { formatBytes } from '../lib/format';
import {
  DEFAULT_SETTINGS as CORE_DEFAULTS,
  GENERATION_LIMITS as LIMITS,
  LOCAL_SERVER_PORTS,
} from '../lib/bindings';

const GiB = 2 ** 30;

/** What a fresh install uses; "Restore defaults" puts these in the form.
 * Defined in the core (AppSettings::default), as are the limits below. */
export const DEFAULT_SETTINGS: Required<AppSettings> = {
  ...CORE_DEFAULTS,
  generation: { ...CORE_DEFAULTS.generation },
  local_server: { ...CORE_DEFAULTS.local_server, allowed_origins: [...CORE_DEFAULTS.local_server.allowed_origins] },
};

/** "from 1 to 32,768" for a [low, high] range. */
function range([low, high]: readonly [number, number]): string {
  return `from ${low.toLocaleString('en-US')} to ${high.toLocaleString('en-US')}`;
}

/** The keep-alive choice that keeps a model until memory is needed (null). */
export const UNTIL_MEMORY_IS_NEEDED = 'until-memory-is-needed';

/** The KV-cache-bits choice that keeps the cache in the model's float dtype (null). */
export const KV_BITS_OFF = 'off';

/** Bits a quantized KV cache holds per element, as the select offers them. */
export const KV_BITS = [8, 4] as const;

/** Elements sharing a scale and a bias in a quantized KV cache. */
export const KV_GROUP_SIZES = [32, 64, 128] as const;

/** Keep-alive choices in minutes, as the select offers them. */
export const KEEP_ALIVE_MINUTES = [1, 5, 10, 30, 60] as const;

/** The form as the inputs hold it: text for every number, so a half-typed or
 * wrong value stays on screen with its message instead of turning into NaN. */
export interface SettingsForm {
  models_folder: string | null;
  /** Minutes as text, or UNTIL_MEMORY_IS_NEEDED. */
  keep_alive: string;
  /** GiB; empty: no budget. */
  memory_budget_gib: string;
  /** GiB of prompt caches on disk; empty: the default; 0: off. */
  prompt_cache_gib: string;
  max_tokens: string;
  temperature: string;
  top_p: string;
  top_k: string;
  min_p: string;
  /** Empty: off. */
  repetition_penalty: string;
  /** Empty: a random seed each run. */
  seed: string;
  loop: 'sync' | 'pipelined';
  prefill_step_size: string;
  /** Empty: unbounded. */
  max_kv_size: string;
  /** KV_BITS_OFF, '4' or '8'. */
  kv_bits: string;
  /** One of KV_GROUP_SIZES, as text. */
  kv_group_size: string;
  quantized_kv_start: string;
  max_batch: string;
  max_image_mib: string;
  max_image_megapixels: string;
  theme: AppSettings['theme'];
  launch_at_login: boolean;
  /** Empty: no shortcut. */
  global_shortcut: string;
  server_enabled: boolean;
  server_port: string;
  /** Empty: no key asked for. */
  server_api_key: string;
  /** One origin a line; empty: no web page may call. */
  server_allowed_origins: string;
}

export type FormField = keyof SettingsForm;

/** One message per field that is wrong; fields not listed are fine. */
export type FieldErrors = Partial<Record<FormField, string>>;

/** GiB as the budget input shows them: at most two decimals, no trailing zeros. */
export function gibText(bytes: number): string {
  return String(Number((bytes / GiB).toFixed(2)));
}

export function settingsToForm(settings: AppSettings): SettingsForm {
  const generation = settings.generation;
  const optional = (value: number | null) => (value === null ? '' : String(value));
  return {
    models_folder: settings.models_folder,
    keep_alive: settings.keep_alive_minutes === null ? UNTIL_MEMORY_IS_NEEDED : String(settings.keep_alive_minutes),
    memory_budget_gib: settings.memory_budget_bytes === null ? '' : gibText(settings.memory_budget_bytes),
    prompt_cache_gib:
      settings.prompt_cache_budget_bytes === null || settings.prompt_cache_budget_bytes === undefined
        ? ''
        : gibText(settings.prompt_cache_budget_bytes),
    max_tokens: String(generation.max_tokens),
    temperature: String(generation.temperature),
    top_p: String(generation.top_p),
    top_k: String(generation.top_k),
    min_p: String(generation.min_p),
    repetition_penalty: optional(generation.repetition_penalty),
    seed: optional(generation.seed),
    loop: generation.loop,
    prefill_step_size: String(generation.prefill_step_size),
    max_kv_size: optional(generation.max_kv_size),
    kv_bits: generation.kv_bits === null || generation.kv_bits === undefined ? KV_BITS_OFF : String(generation.kv_bits),
    kv_group_size: String(generation.kv_group_size ?? DEFAULT_SETTINGS.generation.kv_group_size),
    quantized_kv_start: String(generation.quantized_kv_start ?? DEFAULT_SETTINGS.generation.quantized_kv_start),
    max_batch: String(generation.max_batch ?? DEFAULT_SETTINGS.generation.max_batch),
    max_image_mib: String(generation.max_image_mib ?? DEFAULT_SETTINGS.generation.max_image_mib),
    max_image_megapixels: String(
      generation.max_image_megapixels ?? DEFAULT_SETTINGS.generation.max_image_megapixels,
    ),
    theme: settings.theme,
    launch_at_login: settings.launch_at_login,
    global_shortcut: settings.global_shortcut ?? '',
    server_enabled: settings.local_server.enabled,
    server_port: String(settings.local_server.port),
    server_api_key: settings.local_server.api_key ?? '',
    server_allowed_origins: settings.local_server.allowed_origins.join('\n'),
  };
}

/** The keep-alive select's options; a saved value that is not one of the
 * presets (set in the settings file by hand) is offered too, not lost. */
export function keepAliveOptions(current: string): { value: string; label: string }[] {
  const minutes = [...KEEP_ALIVE_MINUTES] as number[];
  const custom = Number(current);
  if (current !== UNTIL_MEMORY_IS_NEEDED && Number.isInteger(custom) && custom > 0 && !minutes.includes(custom)) {
    minutes.push(custom);
    minutes.sort((a, b) => a - b);
  }
  return [
    ...minutes.map((value) => ({ value: String(value), label: value === 1 ? '1 minute' : `${value} minutes` })),
    { value: UNTIL_MEMORY_IS_NEEDED, label: 'Until memory is needed' },
  ];
}

type Read<T> = { value: T } | { error: string };

const WHOLE = /^\d+$/;
const DECIMAL = /^(\d+\.?\d*|\.\d+)$/;

function readWhole(text: string, min: number, max: number, message: string): Read<number> {
  const trimmed = text.trim();
  const value = Number(trimmed);
  if (!WHOLE.test(trimmed) || !Number.isSafeInteger(value) || value < min || value > max) return { error: message };
  return { value };
}

function readDecimal(text: string, min: number, max: number, message: string, minExclusive = false): Read<number> {
  const trimmed = text.trim();
  const value = Number(trimmed);
  if (!DECIMAL.test(trimmed) || !Number.isFinite(value) || value > max) return { error: message };
  if (minExclusive ? value <= min : value < min) return { error: message };
  return { value };
}

/** An empty input means null (off, random, unbounded, none). */
function orNull(text: string, read: (text: string) => Read<number>): Read<number | null> {
  return text.trim() === '' ? { value: null } : read(text);
}

/** The form read back into settings. Fields `base` has and the form does not
 * edit are kept, and so is `base`'s exact budget while its rounded GiB text is
 * unchanged. `settings` is only meant to be saved when `errors` is empty. */
export function readForm(form: SettingsForm, base: AppSettings): { settings: AppSettings; errors: FieldErrors } {
  const errors: FieldErrors = {};
  function take<T>(field: FormField, read: Read<T>, fallback: T): T {
    if ('error' in read) {
      errors[field] = read.error;
      return fallback;
    }
    return read.value;
  }
  const generation = base.generation;

  const keepAlive =
    form.keep_alive === UNTIL_MEMORY_IS_NEEDED
      ? null
      : take('keep_alive', readWhole(form.keep_alive, 1, 100_000, 'Choose how long a model stays loaded.'), base.keep_alive_minutes);

  const baseBudgetText = base.memory_budget_bytes === null ? '' : gibText(base.memory_budget_bytes);
  const budgetGib = take(
    'memory_budget_gib',
    orNull(form.memory_budget_gib, (text) =>
      // The shell refuses less than 256 MiB: no model fits in it.
      readDecimal(text, 0.25, 1_000_000, 'Enter at least 0.25 GiB (less holds no model), or leave it empty for no budget.'),
    ),
    null,
  );
  let budgetBytes = budgetGib === null ? null : Math.round(budgetGib * GiB);
  if (form.memory_budget_gib.trim() === baseBudgetText) budgetBytes = base.memory_budget_bytes;

  const basePromptCache = base.prompt_cache_budget_bytes ?? null;
  const promptCacheGib = take(
    'prompt_cache_gib',
    orNull(form.prompt_cache_gib, (text) =>
      readDecimal(text, 0, 1_000_000, 'Enter GiB (0 turns the prompt cache off), or leave it empty for the default.'),
    ),
    null,
  );
  let promptCacheBytes = promptCacheGib === null ? null : Math.round(promptCacheGib * GiB);
  if (form.prompt_cache_gib.trim() === (basePromptCache === null ? '' : gibText(basePromptCache))) {
    promptCacheBytes = basePromptCache;
  }

  const shortcutError = checkShortcut(form.global_shortcut);
  if (shortcutError) errors.global_shortcut = shortcutError;

  const serverPort = take(
    'server_port',
    readWhole(
      form.server_port,
      ...LOCAL_SERVER_PORTS,
      `Enter a port ${range(LOCAL_SERVER_PORTS)} (lower ones are the system's).`,
    ),
    base.local_server.port,
  );
  const keyError = checkApiKey(form.server_api_key);
  if (keyError) errors.server_api_key = keyError;
  const origins = originLines(form.server_allowed_origins);
  const badOrigin = origins.find((origin) => !isWebOrigin(origin));
  if (badOrigin !== undefined) {
    errors.server_allowed_origins = `"${badOrigin}" is not a web origin: write it like https://app.example or http://localhost:3000 (no path), or * for any.`;
  }

  const settings: AppSettings = {
    ...base,
    keep_alive_minutes: keepAlive,
    memory_budget_bytes: budgetBytes,
    prompt_cache_budget_bytes: promptCacheBytes,
    generation: {
      ...generation,
      max_tokens: take(
        'max_tokens',
        readWhole(form.max_tokens, ...LIMITS.max_tokens, `Enter a whole number ${range(LIMITS.max_tokens)}.`),
        generation.max_tokens,
      ),
      temperature: take(
        'temperature',
        readDecimal(form.temperature, ...LIMITS.temperature, `Enter a number ${range(LIMITS.temperature)}.`),
        generation.temperature,
      ),
      top_p: take(
        'top_p',
        readDecimal(form.top_p, ...LIMITS.probability, `Enter a number ${range(LIMITS.probability)}.`),
        generation.top_p,
      ),
      top_k: take(
        'top_k',
        readWhole(form.top_k, ...LIMITS.top_k, `Enter a whole number ${range(LIMITS.top_k)} (0 is off).`),
        generation.top_k,
      ),
      min_p: take(
        'min_p',
        readDecimal(form.min_p, ...LIMITS.probability, `Enter a number ${range(LIMITS.probability)}.`),
        generation.min_p,
      ),
      repetition_penalty: take(
        'repetition_penalty',
        orNull(form.repetition_penalty, (text) =>
          readDecimal(
            text,
            ...LIMITS.repetition_penalty,
            `Enter a number ${range(LIMITS.repetition_penalty)}, or leave it empty for off.`,
          ),
        ),
        generation.repetition_penalty,
      ),
      seed: take(
        'seed',
        orNull(form.seed, (text) =>
          readWhole(text, 0, Number.MAX_SAFE_INTEGER, 'Enter a whole number, 0 or more, or leave it empty for random.'),
        ),
        generation.seed,
      ),
      loop: form.loop,
      prefill_step_size: take(
        'prefill_step_size',
        readWhole(
          form.prefill_step_size,
          ...LIMITS.prefill_step_size,
          `Enter a whole number ${range(LIMITS.prefill_step_size)}.`,
        ),
        generation.prefill_step_size,
      ),
      max_kv_size: take(
        'max_kv_size',
        orNull(form.max_kv_size, (text) =>
          readWhole(
            text,
            ...LIMITS.max_kv_size,
            `Enter a whole number of tokens ${range(LIMITS.max_kv_size)}, or leave it empty for unbounded.`,
          ),
        ),
        generation.max_kv_size,
      ),
      kv_bits: take(
        'kv_bits',
        form.kv_bits === KV_BITS_OFF
          ? { value: null }
          : (KV_BITS as readonly number[]).includes(Number(form.kv_bits))
            ? { value: Number(form.kv_bits) }
            : { error: 'Choose 8 or 4 bits, or off.' },
        generation.kv_bits ?? null,
      ),
      kv_group_size: take(
        'kv_group_size',
        (KV_GROUP_SIZES as readonly number[]).includes(Number(form.kv_group_size))
          ? { value: Number(form.kv_group_size) }
          : { error: 'Choose 32, 64 or 128 elements.' },
        generation.kv_group_size ?? DEFAULT_SETTINGS.generation.kv_group_size,
      ),
      quantized_kv_start: take(
        'quantized_kv_start',
        readWhole(
          form.quantized_kv_start,
          ...LIMITS.quantized_kv_start,
          `Enter a whole number of tokens ${range(LIMITS.quantized_kv_start)} (0: from the start).`,
        ),
        generation.quantized_kv_start ?? DEFAULT_SETTINGS.generation.quantized_kv_start,
      ),
      max_batch: take(
        'max_batch',
        readWhole(
          form.max_batch,
          ...LIMITS.max_batch,
          `Enter a whole number of conversations ${range(LIMITS.max_batch)} (1: one at a time).`,
        ),
        generation.max_batch ?? DEFAULT_SETTINGS.generation.max_batch,
      ),
      max_image_mib: take(
        'max_image_mib',
        readWhole(form.max_image_mib, ...LIMITS.max_image_mib, `Enter a whole number of MiB ${range(LIMITS.max_image_mib)}.`),
        generation.max_image_mib ?? DEFAULT_SETTINGS.generation.max_image_mib,
      ),
      max_image_megapixels: take(
        'max_image_megapixels',
        readWhole(
          form.max_image_megapixels,
          ...LIMITS.max_image_megapixels,
          `Enter a whole number of megapixels ${range(LIMITS.max_image_megapixels)}.`,
        ),
        generation.max_image_megapixels ?? DEFAULT_SETTINGS.generation.max_image_megapixels,
      ),
    },
    theme: form.theme,
    models_folder: form.models_folder,
    launch_at_login: form.launch_at_login,
    global_shortcut: form.global_shortcut.trim() === '' ? null : form.global_shortcut.trim(),
    local_server: {
      ...base.local_server,
      enabled: form.server_enabled,
      port: serverPort,
      api_key: form.server_api_key.trim() === '' ? null : form.server_api_key.trim(),
      allowed_origins: badOrigin === undefined ? origins : base.local_server.allowed_origins,
    },
  };
  return { settings, errors };
}

/** The origins of the one-a-line text area, blank lines left out. */
export function originLines(text: string): string[] {
  return text
    .split('\n')
    .map((line) => line.trim())
    .filter((line) => line !== '');
}

/** `*`, or `http(s)://host[:port]` with nothing after (a trailing `/`
 * aside): what a browser sends as Origin. The core checks the same. */
export function isWebOrigin(text: string): boolean {
  if (text === '*') return true;
  return /^https?:\/\/([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(:\d{1,5})?\/?$/.test(text) && portInRange(text);
}

function portInRange(origin: string): boolean {
  const port = origin.replace(/\/$/, '').match(/:(\d{1,5})$/);
  return port === null || (Number(port[1]) >= 1 && Number(port[1]) <= 65535);
}

/** Why a key cannot be sent in a header, or null (empty: no key). */
export function checkApiKey(text: string): string | null {
  const key = text.trim();
  if (key === '') return null;
  if (!/^[\x21-\x7e]+$/.test(key)) return 'Use letters, digits and punctuation only (no spaces): clients send the key in a header.';
  return null;
}

/** Deep equality for settings (plain JSON values). */
export function sameSettings(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  const aKeys = Object.keys(a);
  const bKeys = Object.keys(b);
  if (aKeys.length !== bKeys.length) return false;
  return aKeys.every(
    (key) => key in b && sameSettings((a as Record<string, unknown>)[key], (b as Record<string, unknown>)[key]),
  );
}

/** "16 GiB is 67% of this Mac's 24.0 GiB"; null when either is unknown or the
 * budget is not a positive number. `over` when it exceeds the memory. */
export function budgetShare(budgetGib: string, totalBytes: number | null): { text: string; over: boolean } | null {
  const gib = Number(budgetGib.trim());
  if (budgetGib.trim() === '' || !DECIMAL.test(budgetGib.trim()) || !(gib > 0)) return null;
  if (totalBytes === null || !(totalBytes > 0)) return null;
  const total = formatBytes(totalBytes);
  const share = (gib * GiB) / totalBytes;
  if (share > 1) return { text: `More than this Mac's ${total} of memory`, over: true };
  return { text: `${Math.round(share * 100)}% of this Mac's ${total} of memory`, over: false };
}

// Accelerators as Tauri's global-shortcut plugin parses them (the
// global-hotkey crate): modifiers joined with '+', then one key, any case.
const MODIFIERS = new Set([
  'commandorcontrol',
  'commandorctrl',
  'cmdorctrl',
  'cmdorcontrol',
  'command',
  'cmd',
  'super',
  'meta',
  'control',
  'ctrl',
  'alt',
  'option',
  'shift',
]);

const NAMED_KEYS = new Set([
  'space',
  'enter',
  'tab',
  'backspace',
  'delete',
  'insert',
  'home',
  'end',
  'pageup',
  'pagedown',
  'escape',
  'esc',
  'up',
  'down',
  'left',
  'right',
  'arrowup',
  'arrowdown',
  'arrowleft',
  'arrowright',
  'backquote',
  'backslash',
  'bracketleft',
  'bracketright',
  'comma',
  'equal',
  'minus',
  'period',
  'quote',
  'semicolon',
  'slash',
  'printscreen',
  'scrolllock',
  'pause',
]);

function isFunctionKey(key: string): boolean {
  return /^f([1-9]|1\d|2[0-4])$/.test(key);
}

function isKey(token: string): boolean {
  const key = token.toLowerCase();
  return (
    /^[a-z0-9]$/.test(key) ||
    /^key[a-z]$/.test(key) ||
    /^digit\d$/.test(key) ||
    /^(numpad|num)\d$/.test(key) ||
    /^[`\\[\],=\-.';/]$/.test(key) ||
    isFunctionKey(key) ||
    NAMED_KEYS.has(key)
  );
}

/** Why a shortcut cannot be registered, or null when it can (or is empty). */
export function checkShortcut(text: string): string | null {
  const trimmed = text.trim();
  if (trimmed === '') return null;
  const tokens = trimmed.split('+').map((token) => token.trim());
  const example = 'Write it like CommandOrControl+Shift+O, or use Record….';
  if (tokens.some((token) => token === '')) return `A part is missing between the '+' signs. ${example}`;
  const key = tokens[tokens.length - 1] as string;
  const modifiers = tokens.slice(0, -1);
  const unknown = modifiers.find((token) => !MODIFIERS.has(token.toLowerCase()));
  if (unknown !== undefined) return `"${unknown}" is not a modifier (CommandOrControl, Alt, Shift, Super). ${example}`;
  if (MODIFIERS.has(key.toLowerCase())) return `End with a key after the modifiers. ${example}`;
  if (!isKey(key)) return `"${key}" is not a key Ondo can register. ${example}`;
  if (modifiers.length === 0 && !isFunctionKey(key.toLowerCase())) {
    return 'Add a modifier (CommandOrControl, Alt, Shift or Super): a key alone would be taken from every app.';
  }
  return null;
}

/** The parts of a keydown the recorder reads. */
export type KeyPress = Pick<KeyboardEvent, 'code' | 'key' | 'metaKey' | 'ctrlKey' | 'altKey' | 'shiftKey'>;

const MODIFIER_CODES = /^(Meta|OS|Control|Alt|Shift)(Left|Right)?$|^(AltGraph|CapsLock|Fn|FnLock)$/;

/** The key of a keydown in accelerator form. Read from `code` (where the key
 * is) not `key` (what it types), since Option+O types "ø" on a Mac. */
function acceleratorKey(code: string): string | null {
  let match: RegExpMatchArray | null;
  if ((match = code.match(/^Key([A-Z])$/))) return match[1] as string;
  if ((match = code.match(/^Digit(\d)$/))) return match[1] as string;
  if ((match = code.match(/^Arrow(Up|Down|Left|Right)$/))) return match[1] as string;
  if (/^F\d{1,2}$/.test(code) && isFunctionKey(code.toLowerCase())) return code;
  if (/^Numpad\d$/.test(code)) return code;
  if (isKey(code)) return code;
  return null;
}

/** What the recorder makes of one keydown: a whole accelerator, or still
 * waiting (only modifiers so far, or a key Tauri cannot register). On a Mac,
 * ⌘ is CommandOrControl and ⌃ is Control; elsewhere Ctrl is CommandOrControl
 * and the Windows/Super key is Super. */
export function acceleratorFromKeyPress(press: KeyPress, mac: boolean): string | null {
  if (MODIFIER_CODES.test(press.code)) return null;
  const key = acceleratorKey(press.code);
  if (key === null) return null;
  const parts: string[] = [];
  if (mac ? press.metaKey : press.ctrlKey) parts.push('CommandOrControl');
  if (mac && press.ctrlKey) parts.push('Control');
  if (press.altKey) parts.push('Alt');
  if (press.shiftKey) parts.push('Shift');
  if (!mac && press.metaKey) parts.push('Super');
  parts.push(key);
  return parts.join('+');
}

/** The first field in the form's order that has a message, to focus it. */
export function firstInvalidField(errors: FieldErrors): FormField | null {
  const order: FormField[] = [
    'models_folder',
    'keep_alive',
    'memory_budget_gib',
    'prompt_cache_gib',
    'max_tokens',
    'temperature',
    'top_p',
    'top_k',
    'min_p',
    'repetition_penalty',
    'seed',
    'loop',
    'prefill_step_size',
    'max_kv_size',
    'kv_bits',
    'kv_group_size',
    'quantized_kv_start',
    'max_batch',
    'max_image_mib',
    'max_image_megapixels',
    'theme',
    'launch_at_login',
    'global_shortcut',
    'server_enabled',
    'server_port',
    'server_api_key',
    'server_allowed_origins',
  ];
  return order.find((field) => errors[field] !== undefined) ?? null;
}
