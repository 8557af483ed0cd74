import { cleanup, fireEvent, render, screen, waitFor } from '@testing-library/svelte';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { emptyModelsView, modelsViewWithQwen } from '../../test/fixtures';
import type { SplitAsk, SplitState, SplitView } from '../lib/backend';
import SplitSection from './SplitSection.svelte';

afterEach(cleanup);

const ask: SplitAsk = {
  model: 'mlx-community/Llama-3.3-70B-Instruct-8bit',
  hosts: ['localhost', 'studio-2.local'],
  split: 'tensor',
};

function view(state: SplitState, lines: string[] = []): SplitView {
  return { status: { ask, state, lines }, last_ask: ask };
}

/** A backend whose split goes through `states`, one a status read. */
function fakeApi(states: SplitView[], first: SplitView = { status: null, last_ask: null }) {
  let read = 0;
  return {
    listModels: vi.fn(async () => modelsViewWithQwen),
    splitStatus: vi.fn(async () => (read === 0 ? (read++, first) : (states[Math.min(read++ - 1, states.length - 1)] ?? first))),
    splitStart: vi.fn(async (_ask: SplitAsk) => view({ state: 'starting' })),
    splitStop: vi.fn(async () => view({ state: 'ended', reason: 'stopped' })),
  };
}

describe('SplitSection', () => {
  it('starts a split from the form, follows the machines as they start, and stops it', async () => {
    const api = fakeApi([
      view({ state: 'starting' }, ['fit: fits split over 2 ranks (38 GiB here, 36 GiB on studio-2)']),
      view({ state: 'serving', url: 'http://127.0.0.1:40123' }, ['fit: fits split over 2 ranks', 'loaded']),
    ]);
    render(SplitSection, { api, pollMs: 20 });
    await fireEvent.click(screen.getByText('Several machines'));
    const start = screen.getByRole('button', { name: 'Start' });
    // One machine is not a split.
    await fireEvent.input(screen.getByPlaceholderText('a repo id or a folder'), { target: { value: ask.model } });
    expect((start as HTMLButtonElement).disabled).toBe(true);
    await fireEvent.input(screen.getByLabelText('Machines, one a line, this one first'), {
      target: { value: 'localhost\n  studio-2.local \n\n' },
    });
    await fireEvent.change(screen.getByLabelText('Split'), { target: { value: 'tensor' } });
    await fireEvent.click(start);
    expect(api.splitStart).toHaveBeenCalledWith(ask);
    await waitFor(() => expect(screen.getByTestId('split-headline').textContent).toContain('Starting'));
    await waitFor(() =>
      expect(screen.getByTestId('split-headline').textContent).toBe(
        `Serving ${ask.model} by heads over 2 machines (localhost, studio-2.local): pick it in Chat`,
      ),
    );
    expect(screen.getByTestId('split-lines').textContent).toContain('fits split over 2 ranks');
    await fireEvent.click(screen.getByRole('button', { name: 'Stop the split' }));
    expect(api.splitStop).toHaveBeenCalled();
    // Stopped: the form again, with the last split offered.
    await waitFor(() => expect((screen.getByRole('button', { name: 'Start' }) as HTMLButtonElement).disabled).toBe(false));
  });

  it('names the lost machine and offers to stop; a split that could not start says why', async () => {
    const lost = fakeApi([], view({ state: 'lost', reason: 'rank 1 (studio-2.local) stopped (signal: 9)' }));
    render(SplitSection, { api: lost, pollMs: 20 });
    await waitFor(() => expect(screen.getByText(/rank 1 \(studio-2.local\) stopped/)).toBeTruthy());
    expect((screen.getByRole('button', { name: 'Stop the split' }) as HTMLButtonElement).disabled).toBe(false);
    cleanup();
    const failed = fakeApi(
      [],
      view({ state: 'ended', reason: 'rank 1 needs 40 GiB of its 32 GiB: split over 3 machines' }),
    );
    failed.listModels.mockResolvedValue(emptyModelsView);
    render(SplitSection, { api: failed, pollMs: 20 });
    await waitFor(() => expect(screen.getByText(/needs 40 GiB of its 32 GiB/)).toBeTruthy());
    // The form comes back filled with what was asked.
    expect((screen.getByPlaceholderText('a repo id or a folder') as HTMLInputElement).value).toBe(ask.model);
    expect((screen.getByRole('button', { name: 'Start' }) as HTMLButtonElement).disabled).toBe(false);
  });
});
