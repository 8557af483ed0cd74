import { cleanup, fireEvent, render, screen, waitFor, within } from '@testing-library/svelte';
import { afterEach, describe, expect, it, vi } from 'vitest';
import {
  cachedQwen,
  emptyModelsView,
  gemma1b,
  qwen30bMoe,
  modelsViewWithQwen,
  partialLlama,
  preparedTinyModel,
  qwen4bFit,
} from '../../test/fixtures';
import type {
  Backend,
  CommandError,
  DownloadEvent,
  DownloadSummary,
  FitEstimate,
  ModelsView,
} from '../lib/backend';
import ModelsSection from './ModelsSection.svelte';

afterEach(cleanup);

const summary: DownloadSummary = {
  model: 'mlx-community/Qwen3-0.6B-4bit',
  commit: 'abc',
  snapshot_dir: '/tmp/snap',
  files: 3,
  total_bytes: 340_000_000,
  fetched_bytes: 340_000_000,
  download_ms: 9000,
};

/** A download the test drives: send events, then finish or fail it. */
interface PendingDownload {
  model: string;
  send: (event: DownloadEvent) => void;
  finish: () => void;
  fail: (error: CommandError) => void;
}

function fakeApi(views: ModelsView[] = [emptyModelsView]) {
  const pending: PendingDownload[] = [];
  let listed = 0;
  let onModelsChanged: (() => void) | null = null;
  const api = {
    listModels: vi.fn(async (): Promise<ModelsView> => views[Math.min(listed++, views.length - 1)] ?? emptyModelsView),
    downloadModel: vi.fn(
      (model: string, onEvent: (event: DownloadEvent) => void) =>
        new Promise<DownloadSummary>((resolve, reject) => {
          pending.push({ model, send: onEvent, finish: () => resolve(summary), fail: reject });
        }),
    ),
    cancelDownload: vi.fn(async (model: string) => {
      pending.find((download) => download.model === model)?.fail({ kind: 'cancelled', message: 'paused' });
      return true;
    }),
    deleteModel: vi.fn(async () => 335_000_000),
    fitModel: vi.fn(async (_model: string, _context: number): Promise<FitEstimate> => qwen4bFit),
    onAppEvent: vi.fn(async (name: string, handler: () => void) => {
      if (name === 'ondo://models-changed') onModelsChanged = handler;
      return () => undefined;
    }),
  };
  /** The download started last; fails the test when there is none. */
  const latest = (): PendingDownload => {
    const download = pending.at(-1);
    if (!download) throw new Error('no download was started');
    return download;
  };
  /** What the shell sends when a model is downloaded or deleted elsewhere. */
  const modelsChanged = () => onModelsChanged?.();
  return { api: api as typeof api & Pick<Backend, 'onAppEvent'>, latest, modelsChanged };
}

const base = { prepared: null, preparing: false, error: null, onUseTinyModel: () => {} };

function card(name: string): HTMLElement {
  return screen.getByRole('listitem', { name });
}

describe('ModelsSection', () => {
  it('lists a model downloaded elsewhere as soon as the shell says the models changed', async () => {
    const { api, modelsChanged } = fakeApi([emptyModelsView, modelsViewWithQwen]);
    render(ModelsSection, { ...base, api });
    expect(await screen.findByText('No models are downloaded yet.')).toBeTruthy();

    modelsChanged();
    await waitFor(() =>
      expect(screen.getByRole('list', { name: 'Models on this Mac' }).textContent).toContain('Qwen3-0.6B-4bit'),
    );
    expect(await within(card('Qwen3 0.6B')).findByText('Downloaded')).toBeTruthy();
    expect(api.listModels).toHaveBeenCalledTimes(2);
  });

  it('says the library is empty and offers the tiny model, labelled as random weights', async () => {
    const onUseTinyModel = vi.fn();
    const { api } = fakeApi();
    render(ModelsSection, { ...base, api, onUseTinyModel });

    expect(await screen.findByText('No models are downloaded yet.')).toBeTruthy();
    expect(screen.getByText('Speed test · random weights')).toBeTruthy();
    await fireEvent.click(screen.getByRole('button', { name: 'Use the built-in tiny model' }));
    expect(onUseTinyModel).toHaveBeenCalledOnce();
  });

  it('shows the catalog with verdict chips, the recommended model first', async () => {
    const { api } = fakeApi();
    render(ModelsSection, { ...base, api });
    const catalog = await screen.findByRole('list', { name: 'Download a model' });
    const cards = [...catalog.children] as HTMLElement[];
    expect(cards.map((item) => item.dataset.repo)).toEqual(emptyModelsView.catalog.map((offer) => offer.entry.repo_id));

    const llama = card('Llama 3.2 3B Instruct');
    expect(within(llama).getByText('Recommended')).toBeTruthy();
    expect(llama.textContent).toContain('about 1.68 GiB · 4-bit · 3.2B parameters');
    expect(screen.getAllByText('Recommended')).toHaveLength(1);

    const verdicts = cards.map((item) => item.querySelector('summary')?.dataset.verdict);
    expect(verdicts).toEqual(['fits', 'fits', 'tight', 'will_not_fit']);
    const wontFit = card('Mistral 7B Instruct v0.3').querySelector('summary') as HTMLElement;
    expect(wontFit.textContent).toContain("won't fit");
    expect(wontFit.title).toBe('Needs 4.74 GiB at 4K context; 3.00 GiB available');
    expect(card('Mistral 7B Instruct v0.3').textContent).toContain('pick a smaller model such as Qwen3 0.6B');
    expect(card('Qwen3 8B').querySelector('summary')?.textContent).toContain('tight');
  });

  it('shows download progress from events, then refreshes the list when done', async () => {
    const { api, latest } = fakeApi([emptyModelsView, modelsViewWithQwen]);
    render(ModelsSection, { ...base, api });
    await fireEvent.click(await screen.findByRole('button', { name: 'Download Qwen3 0.6B 4-bit' }));
    expect(api.downloadModel).toHaveBeenCalledWith('mlx-community/Qwen3-0.6B-4bit', expect.any(Function));

    const download = latest();
    download.send({ event: 'planned', model: download.model, commit: 'abc', files: 3, total_bytes: 340_000_000, present_bytes: 0 });
    download.send({
      event: 'progress',
      file: 'model.safetensors',
      file_bytes: 100_000_000,
      file_total_bytes: 330_000_000,
      done_bytes: 110_000_000,
      total_bytes: 340_000_000,
      bytes_per_second: 12_500_000,
      eta_seconds: 18.4,
    });
    const bar = (await screen.findByRole('progressbar', { name: 'Downloading Qwen3 0.6B 4-bit' })) as HTMLProgressElement;
    expect(bar.value).toBe(110_000_000);
    expect(bar.max).toBe(340_000_000);
    const progress = screen.getByTestId('download-progress');
    expect(progress.textContent).toContain('105 MiB of 324 MiB');
    expect(progress.textContent).toContain('12.5 MB/s');
    expect(progress.textContent).toContain('19 s left');
    expect(progress.textContent).toContain('model.safetensors');

    download.send({ event: 'retrying', file: 'model.safetensors', attempt: 2, detail: 'connection reset' });
    expect(await screen.findByText('Retrying model.safetensors (attempt 2)…')).toBeTruthy();

    download.send({ event: 'hub_busy', file: 'model.safetensors', status: 503, wait_ms: 4000, attempt: 3, attempts: 6 });
    const wait = await screen.findByText('Hub busy (503), retrying in 4 s, attempt 3 of 6…');
    expect(wait.getAttribute('role')).toBe('status');
    // Nothing arrives while it waits: no stale speed or time left.
    expect(screen.getByTestId('download-progress').textContent).not.toContain('MB/s');
    expect(screen.getByTestId('download-progress').textContent).not.toContain('left');

    download.finish();
    await waitFor(() => expect(api.listModels).toHaveBeenCalledTimes(2));
    expect(await within(card('Qwen3 0.6B')).findByText('Downloaded')).toBeTruthy();
    expect(screen.queryByRole('progressbar')).toBeNull();
    expect(screen.getByRole('list', { name: 'Models on this Mac' }).textContent).toContain('Qwen3-0.6B-4bit');
  });

  it('pauses a download, shows Paused, and resumes with a new download call', async () => {
    const { api, latest } = fakeApi();
    render(ModelsSection, { ...base, api });
    await fireEvent.click(await screen.findByRole('button', { name: 'Download Qwen3 0.6B 4-bit' }));
    latest().send({
      event: 'progress',
      file: 'model.safetensors',
      file_bytes: 50_000_000,
      file_total_bytes: 330_000_000,
      done_bytes: 60_000_000,
      total_bytes: 340_000_000,
      bytes_per_second: 10_000_000,
      eta_seconds: 28,
    });

    await fireEvent.click(await screen.findByRole('button', { name: 'Pause download of Qwen3 0.6B 4-bit' }));
    expect(api.cancelDownload).toHaveBeenCalledWith('mlx-community/Qwen3-0.6B-4bit');
    expect((await screen.findByRole('status')).textContent).toContain('Paused at 57.2 MiB of 324 MiB');
    expect(screen.queryByRole('alert')).toBeNull();

    await fireEvent.click(screen.getByRole('button', { name: 'Resume download of Qwen3 0.6B 4-bit' }));
    expect(api.downloadModel).toHaveBeenCalledTimes(2);
    // The bar continues from what had arrived.
    const bar = (await screen.findByRole('progressbar')) as HTMLProgressElement;
    expect(bar.value).toBe(60_000_000);
  });

  it('shows a failed download as an error and offers the download again', async () => {
    const { api, latest } = fakeApi();
    render(ModelsSection, { ...base, api });
    await fireEvent.click(await screen.findByRole('button', { name: 'Download Llama 3.2 3B Instruct 4-bit' }));
    latest().fail({ kind: 'unauthorized', message: 'Hugging Face wants a token: run `hf auth login`' });
    const alert = await screen.findByRole('alert');
    expect(alert.dataset.kind).toBe('unauthorized');
    expect(alert.textContent).toContain('hf auth login');
    expect(screen.getByRole('button', { name: 'Download Llama 3.2 3B Instruct 4-bit' })).toBeTruthy();
  });

  it("asks before downloading a model that won't fit", async () => {
    const { api } = fakeApi();
    render(ModelsSection, { ...base, api });
    await fireEvent.click(await screen.findByRole('button', { name: 'Download Mistral 7B Instruct v0.3 4-bit' }));
    expect(api.downloadModel).not.toHaveBeenCalled();
    const confirm = screen.getByRole('group', { name: 'Confirm the download of Mistral 7B Instruct v0.3 4-bit' });
    expect(confirm.textContent).toContain('needs 4.74 GiB; 3.00 GiB is available');

    await fireEvent.click(within(confirm).getByRole('button', { name: 'Cancel' }));
    expect(api.downloadModel).not.toHaveBeenCalled();
    await fireEvent.click(screen.getByRole('button', { name: 'Download Mistral 7B Instruct v0.3 4-bit' }));
    await fireEvent.click(screen.getByRole('button', { name: 'Download anyway' }));
    expect(api.downloadModel).toHaveBeenCalledWith('mlx-community/Mistral-7B-Instruct-v0.3-4bit', expect.any(Function));
  });

  it('offline, says so and offers no downloads', async () => {
    const { api } = fakeApi([{ ...emptyModelsView, offline: true }]);
    render(ModelsSection, { ...base, api });
    expect((await screen.findByTestId('offline-note')).textContent).toBe('Offline (HF_HUB_OFFLINE): downloads are off');
    expect(screen.getByRole('list', { name: 'Download a model' })).toBeTruthy();
    expect(screen.queryByRole('button', { name: /^Download/ })).toBeNull();
  });

  it('disables the download of a model Ondo cannot run yet and says why', async () => {
    // As an offer reads in an Ondo whose engine does not run its family.
    const reason = 'not supported yet: model_type qwen3_moe (Ondo runs: llama, mistral, qwen2, qwen3)';
    const view: ModelsView = {
      ...emptyModelsView,
      catalog: [...emptyModelsView.catalog, { ...qwen30bMoe, unsupported: reason }],
    };
    const { api } = fakeApi([view]);
    render(ModelsSection, { ...base, api });
    await screen.findByRole('list', { name: 'Download a model' });
    const moe = card('Qwen3 30B-A3B');
    const button = within(moe).getByRole('button', { name: 'Download Qwen3 30B-A3B 4-bit' }) as HTMLButtonElement;
    expect(button.disabled).toBe(true);
    expect(within(moe).getByTestId('unsupported-reason').textContent).toBe(reason);
    // The reason is the button's description, so a screen reader says it too.
    const describedBy = button.getAttribute('aria-describedby') ?? '';
    expect(document.getElementById(describedBy)?.textContent).toBe(reason);
    await fireEvent.click(button);
    expect(api.downloadModel).not.toHaveBeenCalled();
    // The models Ondo runs keep an enabled button and no reason.
    const llama = card('Llama 3.2 3B Instruct');
    expect((within(llama).getByRole('button', { name: /^Download/ }) as HTMLButtonElement).disabled).toBe(false);
    expect(within(llama).queryByTestId('unsupported-reason')).toBeNull();
  });

  it('says how many parameters of a mixture of experts work on each token, and what bounds a KV cache', async () => {
    const view: ModelsView = { ...emptyModelsView, catalog: [qwen30bMoe, gemma1b] };
    const { api } = fakeApi([view]);
    render(ModelsSection, { ...base, api });
    await screen.findByRole('list', { name: 'Download a model' });
    const moe = card('Qwen3 30B-A3B');
    expect(moe.textContent).toContain('30.5B parameters, 3.4B active per token');
    expect(within(moe).getByTestId('experts-note').textContent?.replace(/\s+/g, ' ').trim()).toBe(
      '3.4B of 30.5B parameters work on each token: all 128 experts stay in memory; 8 of them work on each token.',
    );
    const gemma = card('Gemma 3 1B');
    expect(gemma.textContent).not.toContain('active per token');
    expect(within(gemma).queryByTestId('experts-note')).toBeNull();
    expect(within(gemma).getByTestId('kv-cache-note').textContent).toBe(
      'KV cache: 22 of 26 layers keep at most 512 positions.',
    );
  });

  it('lists a library model Ondo cannot run with the reason', async () => {
    const reason = 'not supported yet: model_type mamba (Ondo runs: llama, mistral, qwen2, qwen3)';
    const mamba = { ...cachedQwen, id: 'someone/mamba-2.8b', model_type: 'mamba', unsupported: reason };
    const { api } = fakeApi([{ ...modelsViewWithQwen, library: [cachedQwen, mamba] }]);
    render(ModelsSection, { ...base, api });
    const library = await screen.findByRole('list', { name: 'Models on this Mac' });
    const [qwen, other] = within(library).getAllByTestId('library-model') as [HTMLElement, HTMLElement];
    expect(within(other).getByText('not supported yet')).toBeTruthy();
    expect(within(other).getByTestId('unsupported-reason').textContent).toBe(reason);
    expect(within(qwen).queryByTestId('unsupported-reason')).toBeNull();
    expect(qwen.textContent).not.toContain('not supported');
  });

  it('marks an embedding model as one, and a chat model not', async () => {
    const embedder = { ...cachedQwen, id: 'mlx-community/Qwen3-Embedding-0.6B-4bit', embedding: true };
    const { api } = fakeApi([{ ...modelsViewWithQwen, library: [cachedQwen, embedder] }]);
    render(ModelsSection, { ...base, api });
    const library = await screen.findByRole('list', { name: 'Models on this Mac' });
    const [qwen, other] = within(library).getAllByTestId('library-model') as [HTMLElement, HTMLElement];
    expect(within(other).getByText('embedding').getAttribute('title')).toContain('does not chat');
    expect(within(qwen).queryByText('embedding')).toBeNull();
  });

  it('lists library models with an incomplete badge, and deletes after a confirm naming the size', async () => {
    const withModels = { ...modelsViewWithQwen, library: [...modelsViewWithQwen.library, partialLlama] };
    const { api } = fakeApi([withModels, emptyModelsView]);
    render(ModelsSection, { ...base, api });
    const library = await screen.findByRole('list', { name: 'Models on this Mac' });
    const [qwen, llama] = within(library).getAllByTestId('library-model') as [HTMLElement, HTMLElement];
    expect(qwen.textContent).toContain('319 MiB on disk · 4-bit · 596M parameters');
    expect(qwen.textContent).not.toContain('incomplete');
    expect(llama.textContent).toContain('incomplete');
    expect(llama.textContent).toContain('download it again to finish');
    expect(screen.queryByText('No models are downloaded yet.')).toBeNull();

    await fireEvent.click(within(qwen).getByRole('button', { name: 'Delete Qwen3-0.6B-4bit' }));
    expect(api.deleteModel).not.toHaveBeenCalled();
    const confirm = screen.getByRole('group', { name: 'Confirm deleting Qwen3-0.6B-4bit' });
    expect(confirm.textContent).toContain('free 319 MiB');
    await fireEvent.click(within(confirm).getByRole('button', { name: 'Delete 319 MiB' }));
    expect(api.deleteModel).toHaveBeenCalledWith('mlx-community/Qwen3-0.6B-4bit');
    expect(await screen.findByText('No models are downloaded yet.')).toBeTruthy();
  });

  it('is busy while the tiny model is written, then shows it in use', async () => {
    const { api } = fakeApi();
    const { rerender } = render(ModelsSection, { ...base, api, preparing: true });
    const busy = screen.getByRole('button', { name: 'Preparing…' }) as HTMLButtonElement;
    expect(busy.disabled).toBe(true);
    expect(busy.getAttribute('aria-busy')).toBe('true');

    await rerender({ ...base, api, prepared: preparedTinyModel });
    expect(screen.getByTestId('tiny-ready').textContent).toContain('In use');
    expect(screen.queryByRole('button', { name: /tiny model/ })).toBeNull();
  });

  it('shows a failure to prepare as an alert', () => {
    const { api } = fakeApi();
    const error = { kind: 'model_unavailable', message: 'disk full; free some space' } as const;
    render(ModelsSection, { ...base, api, error });
    expect(screen.getByRole('alert').textContent).toContain('disk full; free some space');
  });

  describe('a hub model by its id', () => {
    const repo = 'mlx-community/Qwen3-4B-4bit';

    async function check(id: string): Promise<void> {
      const input = await screen.findByRole('textbox', { name: 'Hub model id' });
      await fireEvent.input(input, { target: { value: id } });
      await fireEvent.click(screen.getByRole('button', { name: 'Check' }));
    }

    it('asks for org/name when the id is malformed, without asking the backend', async () => {
      const { api } = fakeApi();
      render(ModelsSection, { ...base, api });
      await check('Qwen3-4B-4bit');
      const alert = await screen.findByRole('alert');
      expect(alert.textContent).toContain('org/name');
      expect(alert.textContent).toContain('mlx-community/Qwen3-4B-4bit');

      await check('mlx-community/Qwen3 4B');
      expect(screen.getByRole('alert').textContent).toContain('org/name');
      await check('a/b/c');
      expect(screen.getByRole('alert').textContent).toContain('org/name');
      expect(api.fitModel).not.toHaveBeenCalled();

      // Typing again clears the complaint.
      await fireEvent.input(screen.getByRole('textbox', { name: 'Hub model id' }), { target: { value: 'mlx' } });
      expect(screen.queryByRole('alert')).toBeNull();
    });

    it('checks the fit at 4K, then downloads it with progress like a catalog model', async () => {
      const onMac: ModelsView = { ...emptyModelsView, library: [{ ...cachedQwen, id: repo }] };
      const { api, latest } = fakeApi([emptyModelsView, onMac]);
      render(ModelsSection, { ...base, api });
      await check(`  ${repo} `);
      expect(api.fitModel).toHaveBeenCalledWith(repo, 4096);

      const hub = await screen.findByTestId('hub-model');
      expect(hub.textContent).toContain(repo);
      expect(hub.querySelector('summary')?.dataset.verdict).toBe('tight');
      expect(hub.textContent).toContain('about 2.10 GiB of weights · needs 3.04 GiB at 4,096 tokens');
      expect(hub.textContent).toContain('Close other apps first');

      await fireEvent.click(within(hub).getByRole('button', { name: `Download ${repo}` }));
      expect(api.downloadModel).toHaveBeenCalledWith(repo, expect.any(Function));
      const download = latest();
      download.send({
        event: 'progress',
        file: 'model.safetensors',
        file_bytes: 100_000_000,
        file_total_bytes: 2_200_000_000,
        done_bytes: 110_000_000,
        total_bytes: 2_260_000_000,
        bytes_per_second: 12_500_000,
        eta_seconds: 172,
      });
      const bar = (await within(hub).findByRole('progressbar', { name: `Downloading ${repo}` })) as HTMLProgressElement;
      expect(bar.value).toBe(110_000_000);
      expect(within(hub).getByTestId('download-progress').textContent).toContain('105 MiB of 2.10 GiB');
      expect(within(hub).getByRole('button', { name: `Pause download of ${repo}` })).toBeTruthy();

      download.finish();
      await waitFor(() => expect(api.listModels).toHaveBeenCalledTimes(2));
      expect(await within(hub).findByText('Downloaded')).toBeTruthy();
      expect(screen.queryByRole('progressbar')).toBeNull();
    });

    it('says Downloaded for a model already on this Mac, and clears the answer when the id changes', async () => {
      const { api } = fakeApi([modelsViewWithQwen]);
      render(ModelsSection, { ...base, api });
      await check(cachedQwen.id);
      const hub = await screen.findByTestId('hub-model');
      expect(within(hub).getByText('Downloaded')).toBeTruthy();
      expect(within(hub).queryByRole('button', { name: /^Download/ })).toBeNull();

      await fireEvent.input(screen.getByRole('textbox', { name: 'Hub model id' }), { target: { value: 'mlx-community/x' } });
      expect(screen.queryByTestId('hub-model')).toBeNull();
    });

    it("shows the backend's error when the check fails", async () => {
      const { api } = fakeApi();
      api.fitModel.mockRejectedValueOnce({ kind: 'repo_not_found', message: 'No model nobody/nothing on Hugging Face' });
      render(ModelsSection, { ...base, api });
      await check('nobody/nothing');
      const alert = await screen.findByRole('alert');
      expect(alert.dataset.kind).toBe('repo_not_found');
      expect(alert.textContent).toContain('No model nobody/nothing on Hugging Face');
      expect(screen.queryByTestId('hub-model')).toBeNull();
      expect(screen.getByRole('button', { name: 'Check' })).toBeTruthy();
    });

    it('disables the download of a hub model Ondo cannot run yet, with the reason', async () => {
      const { api } = fakeApi();
      const message =
        'someone/mamba is not supported yet: model_type mamba (Ondo runs: llama, mistral, qwen2, qwen3); choose a model of one of those types';
      api.fitModel.mockRejectedValueOnce({ kind: 'unsupported_model_type', message });
      render(ModelsSection, { ...base, api });
      await check('someone/mamba');
      const hub = await screen.findByTestId('hub-model');
      expect(hub.dataset.repo).toBe('someone/mamba');
      const button = within(hub).getByRole('button', { name: 'Download someone/mamba' }) as HTMLButtonElement;
      expect(button.disabled).toBe(true);
      expect(within(hub).getByTestId('unsupported-reason').textContent).toBe(message);
      expect(hub.querySelector('summary')).toBeNull();
      await fireEvent.click(button);
      expect(api.downloadModel).not.toHaveBeenCalled();
      expect(screen.queryByRole('alert')).toBeNull();

      // A new id clears it.
      await fireEvent.input(screen.getByRole('textbox', { name: 'Hub model id' }), { target: { value: 'x/y' } });
      expect(screen.queryByTestId('hub-model')).toBeNull();
    });

    it('is busy while checking', async () => {
      const { api } = fakeApi();
      let answer: (fit: FitEstimate) => void = () => undefined;
      api.fitModel.mockImplementationOnce(() => new Promise<FitEstimate>((resolve) => (answer = resolve)));
      render(ModelsSection, { ...base, api });
      await check(repo);
      const busy = screen.getByRole('button', { name: 'Checking…' }) as HTMLButtonElement;
      expect(busy.disabled).toBe(true);
      answer(qwen4bFit);
      expect(await screen.findByTestId('hub-model')).toBeTruthy();
      expect(screen.getByRole('button', { name: 'Check' })).toBeTruthy();
    });

    it('is not offered offline', async () => {
      const { api } = fakeApi([{ ...emptyModelsView, offline: true }]);
      render(ModelsSection, { ...base, api });
      await screen.findByTestId('offline-note');
      expect(screen.queryByRole('textbox', { name: 'Hub model id' })).toBeNull();
    });
  });
});
