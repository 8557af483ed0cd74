import { cleanup, fireEvent, render, screen } from '@testing-library/svelte';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { emptyLibrary, preparedTinyModel } from '../../test/fixtures';
import ModelsSection from './ModelsSection.svelte';

afterEach(cleanup);

const base = { library: emptyLibrary, prepared: null, preparing: false, error: null };

describe('ModelsSection', () => {
  it('says the library is empty and offers the tiny model, labelled as random weights', async () => {
    const onUseTinyModel = vi.fn();
    render(ModelsSection, { ...base, onUseTinyModel });

    expect(screen.getByText('No models are downloaded yet.')).toBeTruthy();
    expect(screen.getByText('Speed test · random weights')).toBeTruthy();
    await fireEvent.click(screen.getByRole('button', { name: 'Use the built-in tiny model' }));
    expect(onUseTinyModel).toHaveBeenCalledOnce();
  });

  it('shows the recommended model with its download disabled and a reason', () => {
    render(ModelsSection, { ...base, onUseTinyModel: () => {} });
    expect(screen.getByText('mlx-community/Llama-3.2-3B-Instruct-4bit')).toBeTruthy();
    const download = screen.getByRole('button', { name: 'Download' }) as HTMLButtonElement;
    expect(download.disabled).toBe(true);
    expect(download.getAttribute('aria-describedby')).toBe('download-note');
    expect(screen.getByText(/next version of Ondo/)).toBeTruthy();
  });

  it('lists models found in the cache instead of the empty note', () => {
    const library = { ...emptyLibrary, downloaded: ['mlx-community/Qwen3-0.6B-4bit'] };
    render(ModelsSection, { ...base, library, onUseTinyModel: () => {} });
    expect(screen.queryByText('No models are downloaded yet.')).toBeNull();
    expect(screen.getByRole('list', { name: 'Downloaded models' }).textContent).toContain('Qwen3-0.6B-4bit');
  });

  it('is busy while the tiny model is written, then shows it in use', async () => {
    const { rerender } = render(ModelsSection, { ...base, preparing: true, onUseTinyModel: () => {} });
    const busy = screen.getByRole('button', { name: 'Preparing…' }) as HTMLButtonElement;
    expect(busy.disabled).toBe(true);
    expect(busy.getAttribute('aria-busy')).toBe('true');

    await rerender({ ...base, prepared: preparedTinyModel, onUseTinyModel: () => {} });
    expect(screen.getByTestId('tiny-ready').textContent).toContain('In use');
    expect(screen.queryByRole('button', { name: /tiny model/ })).toBeNull();
  });

  it('shows a failure to prepare as an alert', () => {
    const error = { kind: 'model_unavailable', message: 'disk full; free some space' } as const;
    render(ModelsSection, { ...base, error, onUseTinyModel: () => {} });
    expect(screen.getByRole('alert').textContent).toContain('disk full; free some space');
  });
});
