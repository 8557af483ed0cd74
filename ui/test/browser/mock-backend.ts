// Stands in for the Tauri shell in the browser test: answers the popover's
// commands from fixtures, then mounts the real app. `?scenario=` picks how the
// backend behaves; every call is recorded in `window.__ondoIpcCalls`.
import { mockIPC, mockWindows } from '@tauri-apps/api/mocks';
import type { CommandError } from '../../src/lib/backend';
import { demoRun, doctorReport, emptyLibrary, preparedTinyModel } from '../fixtures';

type Scenario = 'ok' | 'generation-fails';

declare global {
  interface Window {
    __ondoIpcCalls: { cmd: string; payload: unknown }[];
  }
}

const scenario = (new URLSearchParams(location.search).get('scenario') ?? 'ok') as Scenario;
window.__ondoIpcCalls = [];

/** Slow enough for the busy state to render, quick enough for the test. */
const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

const generationFailed: CommandError = {
  kind: 'generation_failed',
  message: 'The test generation failed: model.safetensors is missing in the model folder; run `ondo synth` again',
};

mockWindows('main');
mockIPC(async (cmd, payload) => {
  window.__ondoIpcCalls.push({ cmd, payload });
  switch (cmd) {
    case 'doctor_report':
      return doctorReport;
    case 'library_status':
      return emptyLibrary;
    case 'prepare_builtin_model':
      await pause(150);
      return preparedTinyModel;
    case 'run_test_generation':
      await pause(300);
      if (scenario === 'generation-fails') throw generationFailed;
      return demoRun;
    case 'plugin:window|hide':
      return null;
    default:
      throw { kind: 'internal', message: `the mock backend has no command ${cmd}` } satisfies CommandError;
  }
});

await import('../../src/main');
