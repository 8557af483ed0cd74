// Stands in for the Tauri shell in the Settings browser test: answers the
// view's commands from fixtures, then mounts SettingsView alone. `?scenario=`
// picks how the backend behaves; every call is recorded in
// `window.__ondoIpcCalls`.
import { mockIPC, mockWindows } from '@tauri-apps/api/mocks';
import { mount } from 'svelte';
import '../../src/app.css';
import type { AppSettings, CommandError } from '../../src/lib/backend';
import SettingsView from '../../src/settings/SettingsView.svelte';
import { memorySnapshot } from '../fixtures';
import { chosenFolder, savedSettings } from '../fixtures-settings';

type Scenario = 'ok' | 'save-fails';

declare global {
  interface Window {
    __ondoIpcCalls: { cmd: string; payload: unknown }[];
  }
}

const scenario = (new URLSearchParams(location.search).get('scenario') ?? 'ok') as Scenario;
window.__ondoIpcCalls = [];

/** What `set_settings` last stored; `get_settings` answers with it. */
let stored: AppSettings = structuredClone(savedSettings);

mockWindows('main');
mockIPC(async (cmd, payload) => {
  window.__ondoIpcCalls.push({ cmd, payload });
  switch (cmd) {
    case 'get_settings':
      return stored;
    case 'set_settings':
      if (scenario === 'save-fails') {
        throw {
          kind: 'invalid_input',
          message: 'The shortcut CommandOrControl+Shift+O is taken by another app; choose another.',
        } satisfies CommandError;
      }
      stored = (payload as { settings: AppSettings }).settings;
      return null;
    case 'memory_now':
      return memorySnapshot;
    case 'choose_folder':
      return chosenFolder;
    default:
      throw { kind: 'internal', message: `the mock backend has no command ${cmd}` } satisfies CommandError;
  }
});

const target = document.getElementById('app');
if (!target) throw new Error('settings.html has no #app element');
mount(SettingsView, { target });
