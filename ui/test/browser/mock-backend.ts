// Stands in for the Tauri shell in the browser test: answers the popover's
// commands from fixtures, then mounts the real app. `?scenario=` picks how the
// backend behaves; every call is recorded in `window.__ondoIpcCalls`.
import type { Channel } from '@tauri-apps/api/core';
import { mockIPC, mockWindows } from '@tauri-apps/api/mocks';
import type { CommandError, DownloadEvent, DownloadSummary } from '../../src/lib/backend';
import {
  demoRun,
  doctorReport,
  emptyLibrary,
  emptyModelsView,
  memorySnapshot,
  modelsViewWithQwen,
  preparedTinyModel,
  qwen06b,
} from '../fixtures';

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

/** The mock's one download (Qwen3 0.6B): the first call stops at 42% and
 * waits for a pause; the next continues from there and completes. */
const download = {
  total: qwen06b.entry.size_bytes,
  calls: 0,
  complete: false,
  cancel: null as (() => void) | null,
};

async function downloadModel(model: string, channel: Channel<DownloadEvent>): Promise<DownloadSummary> {
  const send = (event: DownloadEvent) => channel.onmessage(event);
  const progress = (done: number, bytesPerSecond: number): DownloadEvent => ({
    event: 'progress',
    file: 'model.safetensors',
    file_bytes: done - 4_000_000,
    file_total_bytes: download.total - 4_000_000,
    done_bytes: done,
    total_bytes: download.total,
    bytes_per_second: bytesPerSecond,
    eta_seconds: (download.total - done) / bytesPerSecond,
  });
  download.calls += 1;
  const resuming = download.calls > 1;
  const present = resuming ? 0.42 * download.total : 0;
  send({ event: 'planned', model, commit: 'abc123', files: 4, total_bytes: download.total, present_bytes: present });
  if (!resuming) {
    send({ event: 'file_done', file: 'config.json', verified: true, fetched_bytes: 4_000_000 });
    await pause(50);
    send(progress(0.42 * download.total, 12_400_000));
    await new Promise<void>((resolve) => (download.cancel = resolve));
    throw { kind: 'cancelled', message: 'The download was paused; download again to continue.' } satisfies CommandError;
  }
  await pause(100);
  send(progress(0.8 * download.total, 15_000_000));
  await pause(150);
  send(progress(download.total, 15_000_000));
  download.complete = true;
  return {
    model,
    commit: 'abc123',
    snapshot_dir: '/home/me/.cache/huggingface/hub/models--mlx-community--Qwen3-0.6B-4bit/snapshots/abc123',
    files: 4,
    total_bytes: download.total,
    fetched_bytes: 0.58 * download.total,
    download_ms: 300,
  };
}

mockWindows('main');
mockIPC(async (cmd, payload) => {
  window.__ondoIpcCalls.push({ cmd, payload });
  switch (cmd) {
    case 'doctor_report':
      return doctorReport;
    case 'library_status':
      return emptyLibrary;
    case 'list_models':
      return download.complete ? modelsViewWithQwen : emptyModelsView;
    case 'memory_now':
      return memorySnapshot;
    case 'download_model': {
      const { model, onEvent } = payload as { model: string; onEvent: Channel<DownloadEvent> };
      return downloadModel(model, onEvent);
    }
    case 'cancel_download': {
      const cancel = download.cancel;
      download.cancel = null;
      cancel?.();
      return cancel !== null;
    }
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
