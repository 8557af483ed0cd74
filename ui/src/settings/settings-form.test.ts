import { describe, expect, it } from 'vitest';
import { savedSettings } from '../../test/fixtures-settings';
import type { AppSettings } from '../lib/backend';
import {
  acceleratorFromKeyPress,
  budgetShare,
  checkShortcut,
  DEFAULT_SETTINGS,
  firstInvalidField,
  isWebOrigin,
  keepAliveOptions,
  KV_BITS_OFF,
  readForm,
  sameSettings,
  settingsToForm,
  UNTIL_MEMORY_IS_NEEDED,
  type KeyPress,
  type SettingsForm,
} from './settings-form';

const GiB = 2 ** 30;

/** The saved settings' form with some fields edited. */
const edited = (changes: Partial<SettingsForm>): SettingsForm => ({ ...settingsToForm(savedSettings), ...changes });

const errorsOf = (changes: Partial<SettingsForm>) => readForm(edited(changes), savedSettings).errors;

describe('settingsToForm and readForm', () => {
  it('round-trips saved settings unchanged, with no errors', () => {
    const { settings, errors } = readForm(settingsToForm(savedSettings), savedSettings);
    expect(errors).toEqual({});
    expect(settings).toEqual(savedSettings);
    expect(sameSettings(settings, savedSettings)).toBe(true);
  });

  it('round-trips the defaults', () => {
    const { settings, errors } = readForm(settingsToForm(DEFAULT_SETTINGS), savedSettings);
    expect(errors).toEqual({});
    expect(settings).toEqual(DEFAULT_SETTINGS);
  });

  it('shows nulls as empty inputs and the keep-alive choice', () => {
    const form = settingsToForm({ ...DEFAULT_SETTINGS, keep_alive_minutes: null, global_shortcut: null });
    expect(form.keep_alive).toBe(UNTIL_MEMORY_IS_NEEDED);
    expect(form.memory_budget_gib).toBe('');
    expect(form.repetition_penalty).toBe('');
    expect(form.seed).toBe('');
    expect(form.max_kv_size).toBe('');
    expect(form.global_shortcut).toBe('');
    expect(settingsToForm(savedSettings).memory_budget_gib).toBe('16');
  });

  it('reads empty optional fields as null and numbers as numbers', () => {
    const { settings, errors } = readForm(
      edited({
        keep_alive: UNTIL_MEMORY_IS_NEEDED,
        memory_budget_gib: '',
        repetition_penalty: ' ',
        seed: '',
        max_kv_size: '',
        global_shortcut: '',
        temperature: ' 1.5 ',
        top_p: '.95',
        max_tokens: '1024',
        loop: 'sync',
      }),
      savedSettings,
    );
    expect(errors).toEqual({});
    expect(settings.keep_alive_minutes).toBeNull();
    expect(settings.memory_budget_bytes).toBeNull();
    expect(settings.global_shortcut).toBeNull();
    expect(settings.generation).toEqual({
      ...savedSettings.generation,
      repetition_penalty: null,
      seed: null,
      max_kv_size: null,
      temperature: 1.5,
      top_p: 0.95,
      max_tokens: 1024,
      loop: 'sync',
    });
  });

  it('turns the budget from GiB into bytes, keeping the exact saved bytes while untouched', () => {
    expect(readForm(edited({ memory_budget_gib: '12.5' }), savedSettings).settings.memory_budget_bytes).toBe(
      12.5 * GiB,
    );
    const odd: AppSettings = { ...savedSettings, memory_budget_bytes: 12_345_678_901 };
    const form = settingsToForm(odd);
    expect(form.memory_budget_gib).toBe('11.5');
    expect(readForm(form, odd).settings.memory_budget_bytes).toBe(12_345_678_901);
  });

  it('reads the KV cache bits, group size and start', () => {
    const form = settingsToForm(DEFAULT_SETTINGS);
    expect([form.kv_bits, form.kv_group_size, form.quantized_kv_start]).toEqual([KV_BITS_OFF, '64', '5000']);
    const { settings, errors } = readForm(
      edited({ kv_bits: '4', kv_group_size: '32', quantized_kv_start: '0' }),
      savedSettings,
    );
    expect(errors).toEqual({});
    expect(settings.generation).toEqual({
      ...savedSettings.generation,
      kv_bits: 4,
      kv_group_size: 32,
      quantized_kv_start: 0,
    });
    expect(readForm(edited({ kv_bits: KV_BITS_OFF }), savedSettings).settings.generation.kv_bits).toBeNull();
  });

  it('reads the image limits in MiB and megapixels', () => {
    const form = settingsToForm(DEFAULT_SETTINGS);
    expect([form.max_image_mib, form.max_image_megapixels]).toEqual(['20', '32']);
    const { settings, errors } = readForm(edited({ max_image_mib: '8', max_image_megapixels: '50' }), savedSettings);
    expect(errors).toEqual({});
    expect([settings.generation.max_image_mib, settings.generation.max_image_megapixels]).toEqual([8, 50]);
  });

  it('keeps fields the form does not know about', () => {
    const newer = { ...savedSettings, api_port: 11435 } as AppSettings;
    expect(readForm(settingsToForm(newer), newer).settings).toEqual(newer);
  });
});

describe('validation', () => {
  it.each([
    ['max_tokens', '0', 'Enter a whole number from 1 to 32,768.'],
    ['max_tokens', '32769', 'Enter a whole number from 1 to 32,768.'],
    ['max_tokens', '12.5', 'Enter a whole number from 1 to 32,768.'],
    ['max_tokens', '', 'Enter a whole number from 1 to 32,768.'],
    ['temperature', '5.01', 'Enter a number from 0 to 5.'],
    ['temperature', '-1', 'Enter a number from 0 to 5.'],
    ['temperature', 'hot', 'Enter a number from 0 to 5.'],
    ['top_p', '1.1', 'Enter a number from 0 to 1.'],
    ['min_p', '2', 'Enter a number from 0 to 1.'],
    ['top_k', '-3', 'Enter a whole number from 0 to 100,000 (0 is off).'],
    ['top_k', '2.5', 'Enter a whole number from 0 to 100,000 (0 is off).'],
    ['repetition_penalty', '0', 'Enter a number from 0.5 to 2, or leave it empty for off.'],
    ['seed', '-1', 'Enter a whole number, 0 or more, or leave it empty for random.'],
    ['seed', '99999999999999999999', 'Enter a whole number, 0 or more, or leave it empty for random.'],
    ['prefill_step_size', '0', 'Enter a whole number from 1 to 65,536.'],
    ['prefill_step_size', '65537', 'Enter a whole number from 1 to 65,536.'],
    ['max_kv_size', '15', 'Enter a whole number of tokens from 16 to 4,294,967,296, or leave it empty for unbounded.'],
    ['kv_bits', '3', 'Choose 8 or 4 bits, or off.'],
    ['kv_group_size', '48', 'Choose 32, 64 or 128 elements.'],
    ['quantized_kv_start', '-1', 'Enter a whole number of tokens from 0 to 4,294,967,296 (0: from the start).'],
    ['max_image_mib', '25', 'Enter a whole number of MiB from 1 to 24.'],
    ['max_image_megapixels', '0', 'Enter a whole number of megapixels from 1 to 200.'],
    ['memory_budget_gib', '0', 'Enter at least 0.25 GiB (less holds no model), or leave it empty for no budget.'],
    ['memory_budget_gib', '0.2', 'Enter at least 0.25 GiB (less holds no model), or leave it empty for no budget.'],
    ['memory_budget_gib', '-4', 'Enter at least 0.25 GiB (less holds no model), or leave it empty for no budget.'],
  ] as const)('%s = %j says %j', (field, value, message) => {
    expect(errorsOf({ [field]: value })).toEqual({ [field]: message });
  });

  it.each([
    ['max_tokens', '1'],
    ['max_tokens', '32768'],
    ['temperature', '0'],
    ['temperature', '5'],
    ['top_p', '1'],
    ['min_p', '0'],
    ['top_k', '0'],
    ['prefill_step_size', '1'],
    ['prefill_step_size', '65536'],
    ['max_kv_size', '16'],
    ['memory_budget_gib', '0.25'],
    ['seed', '0'],
  ] as const)('%s = %j is accepted', (field, value) => {
    expect(errorsOf({ [field]: value })).toEqual({});
  });

  it('names the first wrong field in the order of the form', () => {
    expect(firstInvalidField(errorsOf({ max_kv_size: '1', temperature: '9' }))).toBe('temperature');
    expect(firstInvalidField({})).toBeNull();
  });
});

describe('keepAliveOptions', () => {
  it('offers the presets and "until memory is needed"', () => {
    expect(keepAliveOptions('5').map((option) => option.label)).toEqual([
      '1 minute',
      '5 minutes',
      '10 minutes',
      '30 minutes',
      '60 minutes',
      'Until memory is needed',
    ]);
  });

  it('keeps a saved value that is not a preset, in order', () => {
    expect(keepAliveOptions('15').map((option) => option.value)).toEqual([
      '1',
      '5',
      '10',
      '15',
      '30',
      '60',
      UNTIL_MEMORY_IS_NEEDED,
    ]);
  });
});

describe('budgetShare', () => {
  it('gives the budget as a share of total memory', () => {
    expect(budgetShare('16', 24 * GiB)).toEqual({ text: "67% of this Mac's 24.0 GiB of memory", over: false });
  });

  it('warns when the budget is more than the memory', () => {
    expect(budgetShare('32', 24 * GiB)).toEqual({ text: "More than this Mac's 24.0 GiB of memory", over: true });
  });

  it('says nothing without a total or a valid budget', () => {
    expect(budgetShare('16', null)).toBeNull();
    expect(budgetShare('', 24 * GiB)).toBeNull();
    expect(budgetShare('lots', 24 * GiB)).toBeNull();
    expect(budgetShare('0', 24 * GiB)).toBeNull();
  });
});

describe('checkShortcut', () => {
  it.each(['', 'CommandOrControl+Shift+O', 'cmdorctrl+space', 'Alt+F5', 'F5', 'Super+Up', 'Control+Alt+Slash', 'Shift+KeyK'])(
    'accepts %j',
    (shortcut) => {
      expect(checkShortcut(shortcut)).toBeNull();
    },
  );

  it.each([
    ['O', /Add a modifier/],
    ['CommandOrControl+', /A part is missing/],
    ['Hyper+O', /"Hyper" is not a modifier/],
    ['Shift+Alt', /End with a key/],
    ['CommandOrControl+Banana', /"Banana" is not a key/],
  ])('rejects %j', (shortcut, message) => {
    expect(checkShortcut(shortcut)).toMatch(message);
  });

  it('blocks saving with its message', () => {
    expect(errorsOf({ global_shortcut: 'Ctrl+' })).toHaveProperty('global_shortcut');
  });
});

describe('acceleratorFromKeyPress', () => {
  const press = (code: string, modifiers: Partial<KeyPress> = {}): KeyPress => ({
    code,
    key: '',
    metaKey: false,
    ctrlKey: false,
    altKey: false,
    shiftKey: false,
    ...modifiers,
  });

  it('writes ⌘ as CommandOrControl on a Mac, and reads the key from its code', () => {
    // Option+O types "ø"; the accelerator still names the O key.
    expect(acceleratorFromKeyPress({ ...press('KeyO', { metaKey: true, altKey: true }), key: 'ø' }, true)).toBe(
      'CommandOrControl+Alt+O',
    );
    expect(acceleratorFromKeyPress(press('KeyO', { ctrlKey: true, shiftKey: true }), true)).toBe('Control+Shift+O');
  });

  it('writes Ctrl as CommandOrControl and the Windows key as Super elsewhere', () => {
    expect(acceleratorFromKeyPress(press('KeyO', { ctrlKey: true, shiftKey: true }), false)).toBe(
      'CommandOrControl+Shift+O',
    );
    expect(acceleratorFromKeyPress(press('Space', { metaKey: true }), false)).toBe('Super+Space');
  });

  it('names digits, function keys, arrows and punctuation as the plugin parses them', () => {
    expect(acceleratorFromKeyPress(press('Digit5', { altKey: true }), true)).toBe('Alt+5');
    expect(acceleratorFromKeyPress(press('F5'), true)).toBe('F5');
    expect(acceleratorFromKeyPress(press('ArrowUp', { shiftKey: true }), true)).toBe('Shift+Up');
    expect(acceleratorFromKeyPress(press('Slash', { metaKey: true }), true)).toBe('CommandOrControl+Slash');
    for (const shortcut of ['Alt+5', 'F5', 'Shift+Up', 'CommandOrControl+Slash']) {
      expect(checkShortcut(shortcut)).toBeNull();
    }
  });

  it('waits while only modifiers are down, and skips keys the plugin cannot register', () => {
    expect(acceleratorFromKeyPress(press('ShiftLeft', { shiftKey: true }), true)).toBeNull();
    expect(acceleratorFromKeyPress(press('MetaRight', { metaKey: true }), true)).toBeNull();
    expect(acceleratorFromKeyPress(press('IntlBackslash', { metaKey: true }), true)).toBeNull();
  });
});

describe('the local server fields', () => {
  it('reads the toggle, port, key and origins into the settings', () => {
    const { settings, errors } = readForm(
      edited({
        server_enabled: true,
        server_port: ' 2000 ',
        server_api_key: ' ondo-abc ',
        server_allowed_origins: 'https://app.example\n\n  http://localhost:3000  \n',
      }),
      savedSettings,
    );
    expect(errors).toEqual({});
    expect(settings.local_server).toEqual({
      enabled: true,
      port: 2000,
      api_key: 'ondo-abc',
      allowed_origins: ['https://app.example', 'http://localhost:3000'],
    });
    expect(readForm(edited({ server_api_key: '  ' }), savedSettings).settings.local_server.api_key).toBeNull();
  });

  it('names a port out of range, a key with spaces and an origin with a path', () => {
    expect(errorsOf({ server_port: '80' }).server_port).toBe("Enter a port from 1,024 to 65,535 (lower ones are the system's).");
    expect(errorsOf({ server_port: '70000' }).server_port).toMatch(/from 1,024 to 65,535/);
    expect(errorsOf({ server_port: '' }).server_port).toMatch(/Enter a port/);
    expect(errorsOf({ server_api_key: 'two words' }).server_api_key).toMatch(/no spaces/);
    expect(errorsOf({ server_allowed_origins: 'https://ok.example\nhttps://app.example/page' }).server_allowed_origins).toBe(
      '"https://app.example/page" is not a web origin: write it like https://app.example or http://localhost:3000 (no path), or * for any.',
    );
    expect(firstInvalidField(errorsOf({ server_port: '1', server_api_key: 'a b' }))).toBe('server_port');
  });

  it('accepts the origins a browser sends, as the core does', () => {
    for (const origin of ['*', 'https://app.example', 'http://localhost:3000/', 'http://[::1]:8080']) {
      expect(isWebOrigin(origin), origin).toBe(true);
    }
    for (const origin of ['app.example', 'ftp://app.example', 'https://', 'https://app.example:99999', 'https://a b']) {
      expect(isWebOrigin(origin), origin).toBe(false);
    }
  });
});
