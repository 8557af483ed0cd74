import { cleanup, fireEvent, render, screen, waitFor, within } from '@testing-library/svelte';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { cachedQwen, modelsViewWithQwen } from '../../test/fixtures';
import { allRuns, BENCH_ID, benchResultFor, makeTimeline, newBenchRuns, selectRuns } from '../../test/fixtures-runs';
import type { BenchEvent, BenchRequest, BenchResult, CommandError, Exported, RunFilter, RunRecord } from '../lib/backend';
import RunsView, { type RunsApi } from './RunsView.svelte';

// uPlot reads the pixel ratio through matchMedia when it loads; jsdom has none.
vi.hoisted(() => {
  window.matchMedia ??= (query: string) =>
    ({
      matches: false,
      media: query,
      onchange: null,
      addEventListener: () => {},
      removeEventListener: () => {},
      addListener: () => {},
      removeListener: () => {},
      dispatchEvent: () => false,
    }) as MediaQueryList;
});

// jsdom has no canvas: the charts fall back to their text summaries.
beforeEach(() => {
  vi.spyOn(HTMLCanvasElement.prototype, 'getContext').mockReturnValue(null);
});

afterEach(() => {
  cleanup();
  vi.restoreAllMocks();
});

function fakeApi(runs: RunRecord[] = allRuns) {
  const store = { runs: [...runs] };
  let runsChanged: ((payload: { run_id: string }) => void) | null = null;
  let finishBench: ((result: BenchResult) => void) | null = null;
  let failBench: ((error: CommandError) => void) | null = null;
  let benchEvents: ((event: BenchEvent) => void) | null = null;
  const api = {
    listRuns: vi.fn(async (filter: RunFilter) => selectRuns(store.runs, filter)),
    runTimeline: vi.fn(async (runId: string) => {
      const run = store.runs.find((candidate) => candidate.run_id === runId);
      return run ? makeTimeline(run, run.pressure_max === 'warning') : [];
    }),
    runBenchmark: vi.fn(
      (_request: BenchRequest, onEvent: (event: BenchEvent) => void) =>
        new Promise<BenchResult>((resolve, reject) => {
          benchEvents = onEvent;
          finishBench = resolve;
          failBench = reject;
        }),
    ),
    cancelBenchmark: vi.fn(async () => {
      failBench?.({ kind: 'cancelled', message: 'The benchmark was cancelled.' });
      return true;
    }),
    chooseExportPath: vi.fn(async (): Promise<string | null> => '/home/me/ondo-report.html'),
    exportRuns: vi.fn(
      async (filter: RunFilter, _format: string, path: string): Promise<Exported> => ({
        runs: selectRuns(store.runs, filter).length,
        bytes: 48_213,
        path,
      }),
    ),
    onAppEvent: vi.fn(async (_name: string, handler: (payload: { run_id: string }) => void) => {
      runsChanged = handler;
      return () => {};
    }) as unknown as RunsApi['onAppEvent'],
    listModels: vi.fn(async () => modelsViewWithQwen),
  };
  return {
    api,
    store,
    emitRunsChanged: (runId: string) => runsChanged?.({ run_id: runId }),
    bench: {
      send: (event: BenchEvent) => benchEvents?.(event),
      finish: (result: BenchResult) => finishBench?.(result),
    },
  };
}

const table = () => screen.getByRole('table', { name: 'Recorded runs' });
const bodyRows = () => within(table()).getAllByRole('row').slice(1);
const rowIds = () => bodyRows().map((row) => row.dataset.runId);
const visibleRuns = allRuns.filter((run) => !run.warmup);

/** The filter the view sends with no filter set. */
const DEFAULT_RUN_FILTER: RunFilter = {
  last: 500,
  model_id: null,
  kind: null,
  bench_id: null,
  include_warmup: false,
  loop: null,
  prefill_step_size: null,
  max_kv_size: null,
  prefix_source: null,
};

describe('RunsView', () => {
  it('lists the runs newest first without warm-ups, selects the newest, and shows its timeline', async () => {
    const { api } = fakeApi();
    render(RunsView, { api });
    await waitFor(() => expect(bodyRows()).toHaveLength(visibleRuns.length));
    expect(rowIds()[0]).toBe(visibleRuns.at(-1)?.run_id);
    expect(rowIds().at(-1)).toBe('r-1760000000000-a1');
    expect(api.listRuns).toHaveBeenCalledWith({ last: 500, include_warmup: true });

    const qwenRow = bodyRows().find((row) => row.dataset.runId === 'r-1760000120000-a3') as HTMLElement;
    expect(qwenRow.textContent).toContain('Qwen3-0.6B-4bit');
    expect(qwenRow.textContent).toContain('171 (152 cached)');
    expect(qwenRow.textContent).toContain('40.9 tok/s');

    // The newest run is selected; its timeline summary is there for screen readers.
    expect(bodyRows()[0]?.getAttribute('aria-selected')).toBe('true');
    expect(api.runTimeline).toHaveBeenCalledWith(visibleRuns.at(-1)?.run_id);
    const timeline = await screen.findByTestId('timeline-chart');
    expect(within(timeline).getByTestId('chart-summary').textContent).toMatch(/^24 samples over .*pressure normal throughout\.$/);
    // Charts degrade to their summaries without canvas.
    expect(within(screen.getByTestId('speed-chart')).getByTestId('chart-summary').textContent).toMatch(
      /Prefill processes tokens [\d.]+× faster than decode\./,
    );
    expect(within(screen.getByTestId('cold-warm-chart')).getByTestId('chart-summary').textContent).toMatch(/cold starts?, median load/);
  });

  it('sorts by a column header, and says so with aria-sort', async () => {
    const { api } = fakeApi();
    render(RunsView, { api });
    await waitFor(() => expect(bodyRows().length).toBeGreaterThan(0));
    const header = screen.getByRole('columnheader', { name: /Decode/ });
    expect(header.getAttribute('aria-sort')).toBe('none');
    expect(screen.getByRole('columnheader', { name: /When/ }).getAttribute('aria-sort')).toBe('descending');

    await fireEvent.click(within(header).getByRole('button'));
    expect(header.getAttribute('aria-sort')).toBe('descending');
    const rates = rowIds().map((id) => allRuns.find((run) => run.run_id === id)?.decode_tps ?? 0);
    expect(rates).toEqual([...rates].sort((a, b) => b - a));

    await fireEvent.click(within(header).getByRole('button'));
    expect(header.getAttribute('aria-sort')).toBe('ascending');
    expect(rowIds()[0]).toBe('r-1760000120000-a3');
  });

  it('moves the selection with the arrow keys and loads that run’s timeline', async () => {
    const { api } = fakeApi();
    render(RunsView, { api });
    await waitFor(() => expect(bodyRows().length).toBeGreaterThan(2));
    const first = bodyRows()[0] as HTMLElement;
    expect(first.tabIndex).toBe(0);
    expect(bodyRows()[1]?.tabIndex).toBe(-1);
    first.focus();
    await fireEvent.keyDown(first, { key: 'ArrowDown' });
    await fireEvent.keyDown(bodyRows()[1] as HTMLElement, { key: 'ArrowDown' });
    const third = bodyRows()[2] as HTMLElement;
    expect(third.getAttribute('aria-selected')).toBe('true');
    expect(document.activeElement).toBe(third);
    await waitFor(() => expect(api.runTimeline).toHaveBeenLastCalledWith(third.dataset.runId));

    await fireEvent.keyDown(third, { key: 'End' });
    const last = bodyRows().at(-1) as HTMLElement;
    expect(last.getAttribute('aria-selected')).toBe('true');
    expect(screen.getByTestId('run-detail').textContent).toContain('cold, load 38.2 ms');

    // A click selects too.
    await fireEvent.click(bodyRows()[1] as HTMLElement);
    expect(bodyRows()[1]?.getAttribute('aria-selected')).toBe('true');
  });

  it('sends every filter to the backend and shows what it selects', async () => {
    const { api } = fakeApi();
    render(RunsView, { api });
    await waitFor(() => expect(bodyRows()).toHaveLength(visibleRuns.length));

    await fireEvent.change(screen.getByRole('combobox', { name: 'Benchmark' }), { target: { value: 'latest' } });
    await waitFor(() =>
      expect(api.listRuns).toHaveBeenLastCalledWith({
        ...DEFAULT_RUN_FILTER,
        bench_id: BENCH_ID,
      }),
    );
    await waitFor(() => expect(bodyRows()).toHaveLength(13));

    await fireEvent.change(screen.getByRole('combobox', { name: 'Loop' }), { target: { value: 'sync' } });
    await waitFor(() => expect(bodyRows()).toHaveLength(6));
    expect(api.listRuns).toHaveBeenLastCalledWith({ ...DEFAULT_RUN_FILTER, bench_id: BENCH_ID, loop: 'sync' });

    await fireEvent.click(screen.getByRole('checkbox', { name: 'Include warm-ups' }));
    await waitFor(() => expect(bodyRows()).toHaveLength(8));

    await fireEvent.click(screen.getAllByRole('button', { name: 'Clear filters' })[0] as HTMLElement);
    await waitFor(() => expect(bodyRows()).toHaveLength(visibleRuns.length));

    await fireEvent.change(screen.getByRole('combobox', { name: 'Model' }), { target: { value: cachedQwen.id } });
    await waitFor(() => expect(bodyRows()).toHaveLength(2));
    expect(api.listRuns).toHaveBeenLastCalledWith(expect.objectContaining({ model_id: cachedQwen.id }));

    await fireEvent.change(screen.getByRole('combobox', { name: 'Setting' }), { target: { value: 'max_kv_size=4096' } });
    await screen.findByTestId('runs-no-match');
    expect(api.listRuns).toHaveBeenLastCalledWith(
      expect.objectContaining({ model_id: cachedQwen.id, prefill_step_size: null, max_kv_size: 4096 }),
    );
    // Unbounded goes to the backend as 0.
    await fireEvent.change(screen.getByRole('combobox', { name: 'Setting' }), { target: { value: 'max_kv_size=none' } });
    await waitFor(() => expect(bodyRows()).toHaveLength(2));
    expect(api.listRuns).toHaveBeenLastCalledWith(expect.objectContaining({ max_kv_size: 0 }));
  });

  it('shows no run for the latest benchmark before one is recorded, without asking for every run', async () => {
    const { api } = fakeApi(allRuns.filter((run) => run.bench_id === null));
    render(RunsView, { api });
    await waitFor(() => expect(bodyRows()).toHaveLength(4));
    const calls = api.listRuns.mock.calls.length;
    await fireEvent.change(screen.getByRole('combobox', { name: 'Benchmark' }), { target: { value: 'latest' } });
    await screen.findByTestId('runs-no-match');
    expect(api.listRuns.mock.calls.slice(calls)).toEqual([[{ last: 500, include_warmup: true }]]);
    expect((screen.getByRole('button', { name: 'Export…' }) as HTMLButtonElement).disabled).toBe(true);
  });

  it('says what to do when nothing is recorded yet', async () => {
    const { api } = fakeApi([]);
    render(RunsView, { api });
    const empty = await screen.findByTestId('runs-empty');
    expect(empty.textContent).toMatch(/Chat with a model in the menu-bar popover, or run a benchmark/);
    expect(within(empty).getByRole('button', { name: 'Run a benchmark…' })).toBeTruthy();
  });

  it('refreshes once after a burst of runs-changed events, and on Refresh', async () => {
    const { api, store, emitRunsChanged } = fakeApi(allRuns.slice(0, 2));
    render(RunsView, { api, refreshDelayMs: 20 });
    await waitFor(() => expect(bodyRows()).toHaveLength(2));
    expect(api.onAppEvent).toHaveBeenCalledWith('ondo://runs-changed', expect.any(Function));
    const calls = api.listRuns.mock.calls.length;
    store.runs = allRuns.slice(0, 4);
    emitRunsChanged('r-1760000120000-a3');
    emitRunsChanged('r-1760000180000-a4');
    await waitFor(() => expect(bodyRows()).toHaveLength(4));
    await new Promise((resolve) => setTimeout(resolve, 60));
    // One refresh: every run (for the filter options) and the filtered table.
    expect(api.listRuns.mock.calls.slice(calls)).toEqual([[{ last: 500, include_warmup: true }], [DEFAULT_RUN_FILTER]]);

    store.runs = allRuns.slice(0, 3);
    await fireEvent.click(screen.getByRole('button', { name: 'Refresh' }));
    await waitFor(() => expect(bodyRows()).toHaveLength(3));
  });

  it('shows a failed listing with the error note', async () => {
    const { api } = fakeApi();
    api.listRuns.mockRejectedValue({ kind: 'internal', message: 'runs.jsonl could not be read; check the data folder' });
    render(RunsView, { api });
    const alert = await screen.findByRole('alert');
    expect(alert.textContent).toContain('runs.jsonl could not be read');
  });

  it('exports: asks for a path, writes the filtered runs there, says how many and how big', async () => {
    const { api } = fakeApi();
    render(RunsView, { api });
    await waitFor(() => expect(bodyRows().length).toBeGreaterThan(0));
    await fireEvent.change(screen.getByRole('combobox', { name: 'Kind' }), { target: { value: 'chat' } });
    await waitFor(() => expect(bodyRows()).toHaveLength(3));

    api.chooseExportPath.mockResolvedValueOnce(null);
    await fireEvent.click(screen.getByRole('button', { name: 'Export…' }));
    await waitFor(() => expect(api.chooseExportPath).toHaveBeenCalledWith('html'));
    expect(api.exportRuns).not.toHaveBeenCalled();

    await fireEvent.change(screen.getByRole('combobox', { name: 'Report format' }), { target: { value: 'csv' } });
    await fireEvent.click(screen.getByRole('button', { name: 'Export…' }));
    await waitFor(() =>
      expect(screen.getByTestId('export-status').textContent).toBe(
        'Saved 3 runs to /home/me/ondo-report.html (47.1 KiB)',
      ),
    );
    expect(api.chooseExportPath).toHaveBeenLastCalledWith('csv');
    expect(api.exportRuns).toHaveBeenCalledWith({ ...DEFAULT_RUN_FILTER, kind: 'chat' }, 'csv', '/home/me/ondo-report.html');

    // The export covers what the table shows: the loop filter too.
    await fireEvent.change(screen.getByRole('combobox', { name: 'Loop' }), { target: { value: 'sync' } });
    await waitFor(() => expect(bodyRows()).toHaveLength(1));
    await fireEvent.click(screen.getByRole('button', { name: 'Export…' }));
    await waitFor(() =>
      expect(screen.getByTestId('export-status').textContent).toBe('Saved 1 run to /home/me/ondo-report.html (47.1 KiB)'),
    );
    expect(api.exportRuns).toHaveBeenLastCalledWith(
      { ...DEFAULT_RUN_FILTER, kind: 'chat', loop: 'sync' },
      'csv',
      '/home/me/ondo-report.html',
    );

    api.exportRuns.mockRejectedValueOnce({ kind: 'invalid_input', message: 'The folder is not writable; choose another.' });
    await fireEvent.click(screen.getByRole('button', { name: 'Export…' }));
    expect((await screen.findByRole('alert')).textContent).toContain('The folder is not writable');
  });
});

describe('Benchmark dialog', () => {
  async function openDialog() {
    const fake = fakeApi();
    render(RunsView, { api: fake.api });
    await waitFor(() => expect(bodyRows().length).toBeGreaterThan(0));
    await fireEvent.click(screen.getByRole('button', { name: 'Benchmark…' }));
    const dialog = screen.getByRole('dialog', { name: 'Benchmark' });
    return { ...fake, dialog };
  }

  it('offers the tiny model (labelled) and downloaded models, with the defaults', async () => {
    const { dialog } = await openDialog();
    const model = within(dialog).getByRole('combobox', { name: 'Model' }) as HTMLSelectElement;
    await waitFor(() => expect(model.options).toHaveLength(2));
    expect(model.value).toBe('tiny');
    expect(model.options[0]?.textContent).toBe('Built-in tiny (speed test, random weights)');
    expect(model.options[1]?.value).toBe(cachedQwen.id);
    expect((within(dialog).getByLabelText(/Prompt lengths/) as HTMLInputElement).value).toBe('128');
    expect((within(dialog).getByLabelText('Tokens to generate') as HTMLInputElement).value).toBe('128');
    expect((within(dialog).getByLabelText('Repetitions') as HTMLInputElement).value).toBe('5');
    expect((within(dialog).getByLabelText(/sync/) as HTMLInputElement).checked).toBe(true);
    expect((within(dialog).getByLabelText(/pipelined/) as HTMLInputElement).checked).toBe(true);
  });

  it('refuses a bad plan with a message per field', async () => {
    const { api, dialog } = await openDialog();
    await fireEvent.input(within(dialog).getByLabelText(/Prompt lengths/), { target: { value: '128, lots' } });
    await fireEvent.click(within(dialog).getByLabelText(/sync/));
    await fireEvent.click(within(dialog).getByLabelText(/pipelined/));
    await fireEvent.click(within(dialog).getByRole('button', { name: 'Start' }));
    expect(within(dialog).getByText(/“lots” is not a valid prompt length/)).toBeTruthy();
    expect(within(dialog).getByText('Choose at least one loop shape.')).toBeTruthy();
    expect(within(dialog).getByLabelText(/Prompt lengths/).getAttribute('aria-invalid')).toBe('true');
    expect(api.runBenchmark).not.toHaveBeenCalled();
  });

  it('runs with progress, then shows the per-case summary and the new bench in the table', async () => {
    const { api, store, dialog, bench } = await openDialog();
    await fireEvent.input(within(dialog).getByLabelText(/Prompt lengths/), { target: { value: '128, 512' } });
    await fireEvent.input(within(dialog).getByLabelText('Tokens to generate'), { target: { value: '64' } });
    await fireEvent.click(within(dialog).getByRole('button', { name: 'Start' }));
    expect(api.runBenchmark).toHaveBeenCalledWith(
      expect.objectContaining({
        model: 'tiny',
        shape: expect.objectContaining({ prompt_tokens: [128, 512], repetitions: 5, loops: ['sync', 'pipelined'] }),
      }),
      expect.any(Function),
    );
    bench.send({ event: 'progress', done: 3, total: 25, what: 'pp128+tg64 sync, repetition 2 of 5' });
    const bar = (await within(dialog).findByRole('progressbar', { name: 'Benchmark progress' })) as HTMLProgressElement;
    await waitFor(() => expect(bar.value).toBe(3));
    expect(bar.max).toBe(25);
    expect(within(dialog).getByTestId('bench-progress').textContent).toContain('3 of 25 runs · pp128+tg64 sync');
    // Escape does not close a running benchmark.
    await fireEvent(dialog, new Event('cancel', { cancelable: true }));
    expect(screen.getByRole('dialog', { name: 'Benchmark' })).toBeTruthy();

    const benchId = 'b-1760009000000-0aa1';
    store.runs = [...allRuns, ...newBenchRuns(benchId, Date.parse('2025-10-09T11:00:00Z'))];
    bench.finish(benchResultFor(store.runs, benchId));
    const summary = await within(dialog).findByTestId('bench-summary');
    const caseTable = within(summary).getByRole('table', { name: 'Benchmark summary per case' });
    const caseRows = within(caseTable).getAllByRole('row').slice(1);
    expect(caseRows).toHaveLength(4);
    expect(caseRows[1]?.textContent).toMatch(/pp128\+tg64pipelined.*tok\/s\d\.\d\d×/);
    expect(caseRows[0]?.textContent).not.toMatch(/×/);
    expect(within(summary).getByRole('list', { name: 'Warnings' }).textContent).toContain('Fewer than 5 repetitions');
    expect(summary.textContent).toContain('Cold start in a fresh process: median 212 ms');

    await waitFor(() => expect(api.listRuns).toHaveBeenLastCalledWith(expect.objectContaining({ bench_id: benchId })));
    await waitFor(() => expect(bodyRows()).toHaveLength(13));
    expect((screen.getByRole('combobox', { name: 'Benchmark' }) as HTMLSelectElement).value).toBe(benchId);

    await fireEvent.click(within(summary).getByRole('button', { name: 'Close' }));
    expect(screen.queryByRole('dialog')).toBeNull();
  });

  it('cancels a running benchmark, and shows a failure as an error', async () => {
    const { api, dialog } = await openDialog();
    await fireEvent.click(within(dialog).getByRole('button', { name: 'Start' }));
    await fireEvent.click(within(dialog).getByRole('button', { name: 'Cancel' }));
    expect(api.cancelBenchmark).toHaveBeenCalledOnce();
    await within(dialog).findByText(/The benchmark was cancelled; the runs it finished are in the table\./);

    api.runBenchmark.mockRejectedValueOnce({
      kind: 'not_in_library',
      message: 'acme/gone is not among the models on this machine: download it first, or pick one that is downloaded',
    });
    await fireEvent.click(within(dialog).getByRole('button', { name: 'Start' }));
    const alert = await within(dialog).findByRole('alert');
    expect(alert.textContent).toContain('That model is not downloaded');
    expect(alert.textContent).toContain('acme/gone is not among the models on this machine');
    expect(alert.textContent).toContain('Download it under Models first');

    // Escape closes it when nothing runs.
    await fireEvent(dialog, new Event('cancel', { cancelable: true }));
    expect(screen.queryByRole('dialog')).toBeNull();
  });
});
