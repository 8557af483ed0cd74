import { cleanup, fireEvent, render, screen, waitFor } from '@testing-library/svelte';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { memorySnapshot } from '../../test/fixtures';
import { chosenFolder, savedSettings } from '../../test/fixtures-settings';
import type { AppSettings, CommandError } from '../lib/backend';
import { DEFAULT_SETTINGS } from './settings-form';
import SettingsView from './SettingsView.svelte';
import { applyTheme } from './theme';

afterEach(() => {
  cleanup();
  applyTheme('system');
});

function fakeApi({
  settings = savedSettings,
  loadFails = false,
  saveFails = false,
  folder = chosenFolder as string | null,
  memoryFails = false,
} = {}) {
  return {
    getSettings: vi.fn(async (): Promise<AppSettings> => {
      if (loadFails) throw { kind: 'internal', message: 'settings.json is not valid JSON; fix or delete it' };
      return structuredClone(settings);
    }),
    setSettings: vi.fn(async (_settings: AppSettings): Promise<null> => {
      if (saveFails) {
        throw { kind: 'invalid_input', message: 'The shortcut is taken by another app; choose another.' } satisfies CommandError;
      }
      return null;
    }),
    chooseFolder: vi.fn(async () => folder),
    memoryNow: vi.fn(async () => {
      if (memoryFails) throw { kind: 'internal', message: 'no memory stats' };
      return memorySnapshot;
    }),
    promptCacheStatus: vi.fn(async () => ({ ...promptCache, saved: [...promptCache.saved] })),
    clearPromptCache: vi.fn(async () => {
      const removed = promptCache.saved.length;
      promptCache = { ...promptCache, bytes: 0, saved: [] };
      return removed;
    }),
  };
}

/** Two saved prompts, 3 GiB of a 20 GiB budget. */
const savedPrompt = (tokens: number) => ({
  path: `/data/prompt-cache/abc/${tokens}.safetensors`,
  model_dir: '/models/qwen',
  tokens,
  bytes: 1.5 * 2 ** 30,
  last_used_unix: 1_700_000_000,
});
let promptCache = {
  folder: '/data/prompt-cache',
  bytes: 3 * 2 ** 30,
  budget_bytes: 20 * 2 ** 30,
  enabled: true,
  saved: [savedPrompt(12_000), savedPrompt(9_000)],
};

async function open(api = fakeApi()) {
  render(SettingsView, { api, mac: false });
  await screen.findByRole('heading', { name: 'Settings', level: 1 });
  await screen.findByRole('region', { name: 'Generation defaults' });
  return api;
}

const input = (name: string | RegExp) => screen.getByRole('textbox', { name }) as HTMLInputElement;
const button = (name: string | RegExp) => screen.getByRole('button', { name }) as HTMLButtonElement;
const status = () => screen.getByTestId('settings-status').textContent;
const radio = (name: string) => screen.getByRole('radio', { name }) as HTMLInputElement;

async function type(name: string | RegExp, value: string): Promise<void> {
  await fireEvent.input(input(name), { target: { value } });
}

/** The text of the elements an input's aria-describedby names. */
function description(element: HTMLElement): string {
  return (element.getAttribute('aria-describedby') ?? '')
    .split(' ')
    .map((id) => document.getElementById(id)?.textContent?.trim() ?? `(missing #${id})`)
    .join(' | ');
}

describe('SettingsView', () => {
  it('shows the saved settings, each field labelled and explained', async () => {
    await open();
    expect(input('Max tokens').value).toBe('256');
    expect(input('Temperature').value).toBe('0.7');
    expect(input('Top p').value).toBe('0.9');
    expect(input('Top k').value).toBe('40');
    expect(input('Min p').value).toBe('0.05');
    expect(input('Repetition penalty').value).toBe('1.1');
    expect(input('Seed').value).toBe('42');
    expect(input('Prefill step size').value).toBe('512');
    expect(input('Max KV cache size').value).toBe('4096');
    expect(input('Memory budget').value).toBe('16');
    expect(input('Global shortcut').value).toBe('CommandOrControl+Shift+O');
    expect((screen.getByRole('combobox', { name: 'Keep a model loaded' }) as HTMLSelectElement).value).toBe('5');
    expect(radio('Pipelined').checked).toBe(true);
    expect(radio('System').checked).toBe(true);
    expect((screen.getByRole('checkbox', { name: 'Launch at login' }) as HTMLInputElement).checked).toBe(true);
    expect(screen.getByTestId('models-folder').textContent?.trim()).toBe('/Users/me/Models');

    expect(description(input('Prefill step size'))).toMatch(/smaller steps lower peak memory on long prompts/);
    expect(description(input('Max KV cache size'))).toMatch(/rotating window.*forgetting the start/);
    expect(description(screen.getByRole('radiogroup', { name: 'Loop shape' }))).toMatch(
      /Pipelined schedules the next token before reading the current one back/,
    );
    await waitFor(() => expect(description(input('Memory budget'))).toMatch(/67% of this Mac's 24\.0 GiB of memory/));

    // Nothing changed yet: nothing to save or revert.
    expect(button('Save').disabled).toBe(true);
    expect(button('Revert').disabled).toBe(true);
  });

  it('says what is wrong next to the field, blocks Save, then saves the corrected settings', async () => {
    const api = await open();
    await type('Temperature', '7');
    await type('Max KV cache size', '8');

    const temperature = input('Temperature');
    expect(temperature.getAttribute('aria-invalid')).toBe('true');
    expect(description(temperature)).toMatch(/Enter a number from 0 to 5\./);
    expect(description(input('Max KV cache size'))).toMatch(/from 16 to 4,294,967,296/);
    expect(screen.getByTestId('settings-invalid').textContent).toMatch(/Fix the 2 fields marked above to save/);
    expect(button('Save').disabled).toBe(true);
    expect(button('Revert').disabled).toBe(false);

    // Ctrl+S with a wrong field saves nothing and takes focus to it.
    await fireEvent.keyDown(window, { key: 's', ctrlKey: true });
    expect(api.setSettings).not.toHaveBeenCalled();
    await waitFor(() => expect(document.activeElement).toBe(temperature));

    await type('Temperature', '1.2');
    await type('Max KV cache size', '');
    await type('Max tokens', '1024');
    await type('Seed', '');
    await type('Memory budget', '8');
    await fireEvent.change(screen.getByRole('combobox', { name: 'Keep a model loaded' }), {
      target: { value: 'until-memory-is-needed' },
    });
    await fireEvent.click(radio('Sync'));
    await fireEvent.click(screen.getByRole('checkbox', { name: 'Launch at login' }));
    expect(temperature.hasAttribute('aria-invalid')).toBe(false);
    expect(screen.queryByTestId('settings-invalid')).toBeNull();
    expect(button('Save').disabled).toBe(false);

    await fireEvent.click(button('Save'));
    await waitFor(() => expect(api.setSettings).toHaveBeenCalledOnce());
    expect(api.setSettings).toHaveBeenCalledWith({
      ...savedSettings,
      keep_alive_minutes: null,
      memory_budget_bytes: 8 * 2 ** 30,
      launch_at_login: false,
      generation: {
        ...savedSettings.generation,
        temperature: 1.2,
        max_kv_size: null,
        max_tokens: 1024,
        seed: null,
        loop: 'sync',
      },
    } satisfies AppSettings);
    await waitFor(() => expect(status()).toBe('Saved'));
    expect(button('Save').disabled).toBe(true);

    // Editing again clears the "Saved" note.
    await type('Top k', '20');
    expect(status()).toBe('');
  });

  it('shows what the prompt cache holds, clears it, and saves its budget', async () => {
    const api = await open();
    await waitFor(() => expect(screen.getByTestId('prompt-cache-size').textContent).toMatch(/Holds 3\.00 GiB \(2 prompts\) of 20\.0 GiB/));
    expect(description(input('Prompt cache on disk'))).toMatch(/also after a\s+restart/);
    await fireEvent.click(screen.getByTestId('clear-prompt-cache'));
    await waitFor(() => expect(screen.getByTestId('prompt-cache-size').textContent).toMatch(/Holds 0 B \(0 prompts\) of 20\.0 GiB\. Removed 2 saved prompts\./));
    expect(api.clearPromptCache).toHaveBeenCalledOnce();
    expect((screen.getByTestId('clear-prompt-cache') as HTMLButtonElement).disabled).toBe(true);

    await type('Prompt cache on disk', 'lots');
    expect(description(input('Prompt cache on disk'))).toMatch(/0 turns the prompt cache off/);
    await type('Prompt cache on disk', '2');
    await fireEvent.click(button('Save'));
    await waitFor(() => expect(api.setSettings).toHaveBeenCalled());
    expect(api.setSettings.mock.calls[0]?.[0].prompt_cache_budget_bytes).toBe(2 * 2 ** 30);
  });

  it('saves with Ctrl+S', async () => {
    const api = await open();
    await type('Max tokens', '2048');
    await fireEvent.keyDown(window, { key: 's', ctrlKey: true });
    await waitFor(() => expect(api.setSettings).toHaveBeenCalledOnce());
    expect(api.setSettings.mock.calls[0]?.[0].generation.max_tokens).toBe(2048);
  });

  it('Revert goes back to the saved values; Restore defaults fills in the defaults', async () => {
    const api = await open();
    await type('Max tokens', '9');
    await fireEvent.click(button('Revert'));
    expect(input('Max tokens').value).toBe('256');
    expect(button('Save').disabled).toBe(true);

    await fireEvent.click(button('Restore defaults'));
    expect(input('Max tokens').value).toBe('512');
    expect(input('Prefill step size').value).toBe('2048');
    expect(input('Memory budget').value).toBe('');
    expect(screen.getByTestId('models-folder').textContent?.trim()).toBe('Hugging Face cache (shared with mlx-lm)');
    expect(status()).toMatch(/Defaults restored: save to keep them/);
    await fireEvent.click(button('Save'));
    await waitFor(() => expect(api.setSettings).toHaveBeenCalledWith(DEFAULT_SETTINGS));
  });

  it('chooses a models folder, keeps it when the dialog is cancelled, and goes back to the Hugging Face cache', async () => {
    const api = fakeApi({ settings: { ...savedSettings, models_folder: null } });
    await open(api);
    const folder = () => screen.getByTestId('models-folder').textContent?.trim();
    expect(folder()).toBe('Hugging Face cache (shared with mlx-lm)');
    expect(button('Use the Hugging Face cache').disabled).toBe(true);

    await fireEvent.click(button('Choose…'));
    await waitFor(() => expect(folder()).toBe(chosenFolder));
    api.chooseFolder.mockResolvedValueOnce(null);
    await fireEvent.click(button('Choose…'));
    await waitFor(() => expect(api.chooseFolder).toHaveBeenCalledTimes(2));
    expect(folder()).toBe(chosenFolder);

    await fireEvent.click(button('Save'));
    await waitFor(() => expect(api.setSettings).toHaveBeenCalledOnce());
    expect(api.setSettings.mock.calls[0]?.[0].models_folder).toBe(chosenFolder);

    await fireEvent.click(button('Use the Hugging Face cache'));
    expect(folder()).toBe('Hugging Face cache (shared with mlx-lm)');
  });

  it('applies the theme at once, and puts the saved one back when closed unsaved', async () => {
    await open();
    expect(document.documentElement.hasAttribute('data-theme')).toBe(false);
    await fireEvent.click(radio('Dark'));
    expect(document.documentElement.dataset.theme).toBe('dark');
    await fireEvent.click(radio('Light'));
    expect(document.documentElement.dataset.theme).toBe('light');
    cleanup();
    expect(document.documentElement.hasAttribute('data-theme')).toBe(false);
  });

  it('records a shortcut from the next key combination; Escape cancels', async () => {
    await open();
    const record = button('Record…');
    await fireEvent.click(record);
    expect(record.getAttribute('aria-pressed')).toBe('true');
    // Modifiers alone keep it waiting.
    await fireEvent.keyDown(record, { key: 'Control', code: 'ControlLeft', ctrlKey: true });
    expect(record.getAttribute('aria-pressed')).toBe('true');
    await fireEvent.keyDown(record, { key: 'K', code: 'KeyK', ctrlKey: true, shiftKey: true });
    expect(input('Global shortcut').value).toBe('CommandOrControl+Shift+K');
    expect(record.getAttribute('aria-pressed')).toBe('false');

    await fireEvent.click(record);
    await fireEvent.keyDown(record, { key: 'Escape', code: 'Escape' });
    expect(input('Global shortcut').value).toBe('CommandOrControl+Shift+K');
    expect(record.getAttribute('aria-pressed')).toBe('false');
  });

  it('explains a shortcut that cannot be registered', async () => {
    await open();
    await type('Global shortcut', 'K');
    expect(description(input('Global shortcut'))).toMatch(/Add a modifier/);
    expect(button('Save').disabled).toBe(true);
  });

  it('shows a failed save with ErrorNote and keeps the edits', async () => {
    const api = await open(fakeApi({ saveFails: true }));
    await type('Max tokens', '100');
    await fireEvent.click(button('Save'));
    const alert = await screen.findByRole('alert');
    expect(alert.textContent).toMatch(/That request was not accepted/);
    expect(alert.textContent).toMatch(/The shortcut is taken by another app/);
    expect(api.setSettings).toHaveBeenCalledOnce();
    expect(input('Max tokens').value).toBe('100');
    expect(status()).toBe('');
    expect(button('Save').disabled).toBe(false);
  });

  it('shows a failed load and tries again', async () => {
    const api = fakeApi({ loadFails: true });
    render(SettingsView, { api, mac: false });
    const alert = await screen.findByRole('alert');
    expect(alert.textContent).toMatch(/settings\.json is not valid JSON/);
    api.getSettings.mockResolvedValueOnce(structuredClone(savedSettings));
    await fireEvent.click(button('Try again'));
    await screen.findByRole('region', { name: 'Generation defaults' });
    expect(input('Max tokens').value).toBe('256');
  });

  it('shows the budget without its share when memory cannot be read', async () => {
    const api = await open(fakeApi({ memoryFails: true }));
    await waitFor(() => expect(api.memoryNow).toHaveBeenCalled());
    expect(screen.getByTestId('budget-share').textContent).toBe('');
  });

  describe('Local server', () => {
    afterEach(() => vi.unstubAllGlobals());

    it('is off by default; turned on it shows the address and a curl example, and saves', async () => {
      const api = await open();
      const toggle = screen.getByRole('checkbox', { name: 'Run the local server' }) as HTMLInputElement;
      expect(toggle.checked).toBe(false);
      expect(screen.queryByTestId('server-address')).toBeNull();
      expect(description(input('Port'))).toMatch(/Not Ollama's \(11434\) or LM Studio's \(1234\)/);

      await fireEvent.click(toggle);
      await type('Port', '2000');
      expect(screen.getByTestId('server-address').textContent).toContain('http://127.0.0.1:2000');
      expect(screen.getByTestId('server-address').textContent).toContain('Save to serve here.');
      expect(screen.getByTestId('server-curl').textContent).toBe(
        `curl http://127.0.0.1:2000/v1/chat/completions \\\n` +
          `  -d '{"model": "tiny", "messages": [{"role": "user", "content": "Hello"}]}'`,
      );
      await fireEvent.click(button('Save'));
      await waitFor(() => expect(api.setSettings).toHaveBeenCalledOnce());
      expect(api.setSettings.mock.calls[0]?.[0].local_server).toEqual({
        enabled: true,
        port: 2000,
        api_key: null,
        allowed_origins: [],
      });
      await waitFor(() => expect(screen.getByTestId('server-address').textContent).toContain('Serving here now.'));
    });

    it('says what is wrong with the port and the origins next to them', async () => {
      const api = await open();
      await type('Port', '80');
      expect(input('Port').getAttribute('aria-invalid')).toBe('true');
      expect(description(input('Port'))).toMatch(/Enter a port from 1,024 to 65,535/);
      const origins = screen.getByRole('textbox', { name: 'Allowed origins' }) as HTMLTextAreaElement;
      await fireEvent.input(origins, { target: { value: 'https://app.example\napp.example' } });
      expect(description(origins)).toMatch(/"app\.example" is not a web origin/);
      expect(screen.getByTestId('settings-invalid').textContent).toMatch(/Fix the 2 fields/);
      await fireEvent.keyDown(window, { key: 's', ctrlKey: true });
      expect(api.setSettings).not.toHaveBeenCalled();
    });

    it('generates a key, shows and hides it, and the curl example sends it', async () => {
      await open();
      await fireEvent.click(screen.getByRole('checkbox', { name: 'Run the local server' }));
      const key = screen.getByLabelText('API key') as HTMLInputElement;
      expect(key.type).toBe('password');
      expect(description(key).replace(/\s+/g, ' ')).toMatch(/kept with Ondo's other settings in its history database/);

      await fireEvent.click(button('Generate a key'));
      expect(key.value).toMatch(/^ondo-[0-9a-f]{32}$/);
      expect(key.type).toBe('text');
      expect(screen.getByTestId('server-curl').textContent).toContain(`Bearer ${key.value}`);

      await fireEvent.click(button('Hide'));
      expect(key.type).toBe('password');
      // Hidden, the example names the key without showing it.
      expect(screen.getByTestId('server-curl').textContent).toContain('Bearer $ONDO_API_KEY');
      expect(screen.getByTestId('server-curl').textContent).not.toContain(key.value);
      expect(button('Show').getAttribute('aria-pressed')).toBe('false');
    });

    it('copies the address and the curl example', async () => {
      const writeText = vi.fn(async () => undefined);
      vi.stubGlobal('navigator', { ...navigator, clipboard: { writeText } });
      await open();
      await fireEvent.click(screen.getByRole('checkbox', { name: 'Run the local server' }));
      await fireEvent.click(button('Copy the address'));
      await waitFor(() => expect(writeText).toHaveBeenCalledWith('http://127.0.0.1:11480'));
      expect(await screen.findByText('Copied')).toBeTruthy();
      await fireEvent.click(button('Copy the curl example'));
      await waitFor(() => expect(writeText).toHaveBeenLastCalledWith(expect.stringContaining('curl http://127.0.0.1:11480/')));
    });

    it('writes a set-up for Claude Code, Codex, OpenAI and Ollama clients, and copies it', async () => {
      const writeText = vi.fn(async () => undefined);
      vi.stubGlobal('navigator', { ...navigator, clipboard: { writeText } });
      await open();
      expect(screen.queryByTestId('server-setup')).toBeNull();
      await fireEvent.click(screen.getByRole('checkbox', { name: 'Run the local server' }));
      await type('Port', '2000');
      const client = screen.getByRole('combobox', { name: 'Set up a client' }) as HTMLSelectElement;
      expect(client.value).toBe('claude-code');
      expect(screen.getByTestId('server-setup-text').textContent).toContain('export ANTHROPIC_BASE_URL=http://127.0.0.1:2000');
      expect(screen.getByTestId('server-setup-url').textContent).toBe('http://127.0.0.1:2000');

      await fireEvent.change(client, { target: { value: 'codex' } });
      expect(screen.getByTestId('server-setup-text').textContent).toContain('wire_api = "responses"');
      expect(screen.getByTestId('server-setup-url').textContent).toBe('http://127.0.0.1:2000/v1');
      await fireEvent.click(button('Copy the Codex CLI set-up'));
      await waitFor(() => expect(writeText).toHaveBeenCalledWith(expect.stringContaining('[model_providers.ondo]')));

      // With a key shown, the set-up carries it; hidden, it names it.
      await fireEvent.change(client, { target: { value: 'openai' } });
      await fireEvent.click(button('Generate a key'));
      const key = (screen.getByLabelText('API key') as HTMLInputElement).value;
      expect(screen.getByTestId('server-setup-text').textContent).toContain(`OPENAI_API_KEY="${key}"`);
      await fireEvent.click(button('Hide'));
      expect(screen.getByTestId('server-setup-text').textContent).toContain('OPENAI_API_KEY="$ONDO_API_KEY"');
    });

    it('shows the error when the port is taken', async () => {
      const api = await open();
      api.setSettings.mockRejectedValueOnce({
        kind: 'address_unavailable',
        message: 'cannot listen on 127.0.0.1:11480: Address already in use (os error 98); choose another port or address',
      });
      await fireEvent.click(screen.getByRole('checkbox', { name: 'Run the local server' }));
      await fireEvent.click(button('Save'));
      expect(await screen.findByText('The local server could not take its address')).toBeTruthy();
      expect(screen.getByText('Choose another port in Settings → Local server.')).toBeTruthy();
    });
  });
});
