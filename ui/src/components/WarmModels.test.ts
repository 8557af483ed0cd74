import { cleanup, fireEvent, render, screen } from '@testing-library/svelte';
import { afterEach, describe, expect, it, vi } from 'vitest';
import type { AppEvents, PooledModel } from '../lib/backend';
import WarmModels from './WarmModels.svelte';

afterEach(cleanup);

const tiny: PooledModel = {
  model_id: 'tiny',
  model_dir: '/home/me/.local/share/ondo/models/tiny',
  weights_bytes: 7_340_032,
  kv_cache_bytes: 1_048_576,
  idle_ms: 30_000,
  expires_in_ms: 570_000,
  busy: false,
};

const qwen: PooledModel = {
  ...tiny,
  model_id: 'mlx-community/Qwen3-0.6B-4bit',
  model_dir: '/hub/models--mlx-community--Qwen3-0.6B-4bit/snapshots/abc',
  weights_bytes: 351_272_960,
  expires_in_ms: null,
  busy: true,
};

type EngineHandler = (payload: AppEvents['ondo://engine-state']) => void;

function fakeApi(resident: PooledModel[]) {
  let onEngine: EngineHandler | null = null;
  const api = {
    poolStatus: vi.fn(async () => ({ resident, events: [] })),
    unloadModel: vi.fn(async () => true),
    onAppEvent: vi.fn(async (_name: string, handler: EngineHandler) => {
      onEngine = handler;
      return () => undefined;
    }),
  };
  return { api, emit: (payload: AppEvents['ondo://engine-state']) => onEngine?.(payload) };
}

describe('WarmModels', () => {
  it('shows nothing while no model is loaded', async () => {
    const { api } = fakeApi([]);
    render(WarmModels, { api: api as never });
    await Promise.resolve();
    expect(screen.queryByTestId('warm-models')).toBeNull();
  });

  it('lists what each warm model holds and when it goes', async () => {
    const { api } = fakeApi([tiny, qwen]);
    render(WarmModels, { api: api as never });
    expect(await screen.findByText('tiny (speed test)')).toBeTruthy();
    expect(screen.getByText(/7\.00 MiB weights · 1\.00 MiB KV cache · unloads in 10 min/)).toBeTruthy();
    expect(screen.getByText(/answering/)).toBeTruthy();
    // A model that is answering cannot be unloaded under it.
    expect((screen.getByRole('button', { name: 'Unload Qwen3-0.6B-4bit' }) as HTMLButtonElement).disabled).toBe(true);
  });

  it('unloads on request and follows the engine-state event', async () => {
    const { api, emit } = fakeApi([tiny]);
    render(WarmModels, { api: api as never });
    const unload = await screen.findByRole('button', { name: 'Unload tiny (speed test)' });
    api.poolStatus.mockResolvedValueOnce({ resident: [], events: [] });
    await fireEvent.click(unload);
    expect(api.unloadModel).toHaveBeenCalledWith(tiny.model_dir);
    await vi.waitFor(() => expect(screen.queryByTestId('warm-models')).toBeNull());

    emit({ resident: [qwen] });
    expect(await screen.findByText('Qwen3-0.6B-4bit')).toBeTruthy();
  });
});
