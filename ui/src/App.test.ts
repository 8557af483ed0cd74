import { cleanup, fireEvent, render, screen } from '@testing-library/svelte';
import { afterEach, describe, expect, it, vi } from 'vitest';
import {
  demoRun,
  doctorReport,
  doctorReportWithoutKernels,
  emptyModelsView,
  kernelsMissing,
  memorySnapshot,
  preparedTinyModel,
} from '../test/fixtures';
import App from './App.svelte';
import type { Backend } from './lib/backend';

afterEach(cleanup);

async function notUsedHere(): Promise<never> {
  throw { kind: 'internal', message: 'not used by this test' };
}

function fakeBackend(overrides: Partial<Backend> = {}): Backend {
  return {
    doctorReport: vi.fn(async () => doctorReport),
    startupCheck: vi.fn(async () => null),
    prepareBuiltinModel: vi.fn(async () => preparedTinyModel),
    runTestGeneration: vi.fn(async () => demoRun),
    listModels: vi.fn(async () => emptyModelsView),
    // The screens that use these come with their own tests.
    fitModel: vi.fn(notUsedHere),
    downloadModel: vi.fn(notUsedHere),
    cancelDownload: vi.fn(notUsedHere),
    deleteModel: vi.fn(notUsedHere),
    runTimeline: vi.fn(notUsedHere),
    memoryNow: vi.fn(notUsedHere),
    poolStatus: vi.fn(async () => ({ resident: [], events: [] })),
    unloadModel: vi.fn(notUsedHere),
    chatSend: vi.fn(notUsedHere),
    chatStop: vi.fn(notUsedHere),
    chatForget: vi.fn(notUsedHere),
    chatFeatures: vi.fn(async () => ({ thinking_switch: false, sees_images: false })),
    getSettings: vi.fn(notUsedHere),
    setSettings: vi.fn(notUsedHere),
    promptCacheStatus: vi.fn(notUsedHere),
    clearPromptCache: vi.fn(notUsedHere),
    listRuns: vi.fn(notUsedHere),
    runBenchmark: vi.fn(notUsedHere),
    cancelBenchmark: vi.fn(notUsedHere),
    chooseExportPath: vi.fn(notUsedHere),
    exportRuns: vi.fn(notUsedHere),
    chooseFolder: vi.fn(notUsedHere),
    openWindow: vi.fn(async () => null),
    serverStatus: vi.fn(async () => ({ state: 'off' as const })),
    splitStatus: vi.fn(async () => ({ status: null, last_ask: null })),
    splitStart: vi.fn(notUsedHere),
    splitStop: vi.fn(notUsedHere),
    onAppEvent: vi.fn(async () => () => undefined),
    ...overrides,
  };
}

describe('App', () => {
  it('loads the memory line and the library on open', async () => {
    render(App, { api: fakeBackend() });
    expect(await screen.findByText('20.0 GiB free of 24.0 GiB')).toBeTruthy();
    expect(await screen.findByText('No models are downloaded yet.')).toBeTruthy();
  });

  it('runs a test generation on the tiny model and shows the timings', async () => {
    const api = fakeBackend();
    render(App, { api });
    const run = (await screen.findByRole('button', { name: 'Run a test generation' })) as HTMLButtonElement;
    expect(run.disabled).toBe(true);

    await fireEvent.click(await screen.findByRole('button', { name: 'Use the built-in tiny model' }));
    await screen.findByTestId('tiny-ready');
    expect(run.disabled).toBe(false);

    await fireEvent.click(run);
    const table = await screen.findByTestId('timings');
    expect(table.textContent).toContain('1,427 tok/s');
    expect(api.runTestGeneration).toHaveBeenCalledWith({ kind: 'builtin_tiny' }, expect.any(String), 32);
    expect(screen.getByTestId('generated-text').textContent).toContain('quartz lantern');
  });

  it('shows the backend error kind and message when the run fails', async () => {
    const api = fakeBackend({
      runTestGeneration: vi.fn(async () => {
        throw { kind: 'mlx', message: 'MLX failed while generating: out of memory' };
      }),
    });
    render(App, { api });
    await fireEvent.click(await screen.findByRole('button', { name: 'Use the built-in tiny model' }));
    await screen.findByTestId('tiny-ready');
    await fireEvent.click(screen.getByRole('button', { name: 'Run a test generation' }));
    const alert = await screen.findByRole('alert');
    expect(alert.dataset.kind).toBe('mlx');
    expect(alert.textContent).toContain('MLX failed while generating');
    expect(alert.textContent).toContain('out of memory');
  });

  it('says first what is missing and where it was looked for when MLX cannot load its kernels', async () => {
    const api = fakeBackend({
      startupCheck: vi.fn(async () => {
        throw kernelsMissing;
      }),
      doctorReport: vi.fn(async () => doctorReportWithoutKernels),
    });
    render(App, { api });
    const note = await screen.findByRole('region', { name: 'Ondo cannot run models' });
    // Above everything else in the popover.
    expect(note.parentElement?.firstElementChild).toBe(note);
    const alert = note.querySelector('[role="alert"]') as HTMLElement;
    expect(alert.dataset.kind).toBe('metal_kernels_unavailable');
    for (const shown of [
      'MLX’s GPU kernels are missing',
      'were not found',
      '/Applications/Ondo.app/Contents/Resources/mlx.metallib',
      '/Applications/Ondo.app/Contents/Frameworks/Resources/default.metallib',
      'drag Ondo from its disk image to Applications again',
    ]) {
      expect(alert.textContent).toContain(shown);
    }
  });

  it('shows no start-up note when MLX works', async () => {
    const api = fakeBackend();
    render(App, { api });
    await screen.findByText('20.0 GiB free of 24.0 GiB');
    expect(api.startupCheck).toHaveBeenCalledOnce();
    expect(screen.queryByRole('region', { name: 'Ondo cannot run models' })).toBeNull();
  });

  it('says memory is unknown when the doctor report fails', async () => {
    const api = fakeBackend({
      doctorReport: vi.fn(async () => {
        throw { kind: 'internal', message: 'libmlx missing' };
      }),
    });
    render(App, { api });
    expect(await screen.findByText('Memory: unknown')).toBeTruthy();
    expect((await screen.findByRole('alert')).textContent).toContain('libmlx missing');
  });

  it('reads memory every 2 s while open and stops when closed', async () => {
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
    try {
      const memoryNow = vi.fn(async () => ({ ...memorySnapshot, available_bytes: 18 * 2 ** 30, level: 'warning' as const }));
      const { unmount } = render(App, { api: fakeBackend({ memoryNow }) });
      expect(await screen.findByText('18.0 GiB free of 24.0 GiB')).toBeTruthy();
      expect(screen.getByRole('meter').getAttribute('aria-label')).toBe('Memory in use, pressure warning');
      expect(memoryNow).toHaveBeenCalledTimes(1);
      vi.advanceTimersByTime(2000);
      expect(memoryNow).toHaveBeenCalledTimes(2);
      vi.advanceTimersByTime(4000);
      expect(memoryNow).toHaveBeenCalledTimes(4);
      unmount();
      vi.advanceTimersByTime(10_000);
      expect(memoryNow).toHaveBeenCalledTimes(4);
    } finally {
      vi.useRealTimers();
    }
  });

  it('hides the window on Escape', async () => {
    const hideWindow = vi.fn(async () => {});
    render(App, { api: fakeBackend(), hideWindow });
    await fireEvent.keyDown(window, { key: 'Escape' });
    expect(hideWindow).toHaveBeenCalledOnce();
  });
});
