// Stands in for the Tauri shell in the Runs view's browser test: answers the
// view's commands from test/fixtures-runs.ts, runs a fake benchmark that
// streams progress and emits `ondo://runs-changed`, then mounts RunsView
// alone. `?scenario=empty` starts with no runs. Every call is recorded in
// `window.__ondoIpcCalls`.
import { mount } from 'svelte';
import type { Channel } from '@tauri-apps/api/core';
import { emit } from '@tauri-apps/api/event';
import { mockIPC, mockWindows } from '@tauri-apps/api/mocks';
import type {
  BenchEvent,
  BenchRequest,
  BenchResult,
  CommandError,
  Exported,
  RunFilter,
  RunRecord,
} from '../../src/lib/backend';
import { backend } from '../../src/lib/backend';
import RunsView from '../../src/runs/RunsView.svelte';
import { modelsViewWithQwen } from '../fixtures';
import { allRuns, benchResultFor, makeTimeline, newBenchRuns, selectRuns } from '../fixtures-runs';
import '../../src/app.css';

declare global {
  interface Window {
    __ondoIpcCalls: { cmd: string; payload: unknown }[];
  }
}

const scenario = new URLSearchParams(location.search).get('scenario') ?? 'ok';
window.__ondoIpcCalls = [];

const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

const store = { runs: scenario === 'empty' ? [] : [...allRuns] };
const bench = { cancelled: false };

/** Records the plan's runs a few at a time, with progress, like the real one. */
async function runBenchmark(request: BenchRequest, channel: Channel<BenchEvent>): Promise<BenchResult> {
  const send = (event: BenchEvent) => channel.onmessage(event);
  bench.cancelled = false;
  const benchId = `b-${Date.parse('2025-10-09T11:00:00Z')}-0aa1`;
  const runs = newBenchRuns(benchId, Date.parse('2025-10-09T11:00:00Z')).map(
    (run): RunRecord => ({ ...run, model_id: request.model }),
  );
  send({ event: 'progress', done: 0, total: runs.length, what: 'Cold start in a fresh process' });
  for (const [index, run] of runs.entries()) {
    await pause(90);
    if (bench.cancelled) throw { kind: 'cancelled', message: 'The benchmark was cancelled.' } satisfies CommandError;
    store.runs.push(run);
    void emit('ondo://runs-changed', { run_id: run.run_id });
    const what = run.kind === 'bench_cold' ? 'cold start' : `${run.test} ${run.loop}${run.warmup ? ' warm-up' : ''}`;
    send({ event: 'progress', done: index + 1, total: runs.length, what });
  }
  return benchResultFor(store.runs, benchId);
}

mockWindows('main');
mockIPC(
  async (cmd, payload) => {
    window.__ondoIpcCalls.push({ cmd, payload });
    switch (cmd) {
      case 'list_runs':
        return selectRuns(store.runs, (payload as { filter: RunFilter }).filter);
      case 'run_timeline': {
        const { runId } = payload as { runId: string };
        const run = store.runs.find((candidate) => candidate.run_id === runId);
        return run ? makeTimeline(run, run.pressure_max === 'warning' || run.kind === 'bench_cold') : [];
      }
      case 'list_models':
        return modelsViewWithQwen;
      case 'run_benchmark': {
        const { request, onEvent } = payload as { request: BenchRequest; onEvent: Channel<BenchEvent> };
        return runBenchmark(request, onEvent);
      }
      case 'cancel_benchmark':
        bench.cancelled = true;
        return true;
      case 'choose_export_path': {
        const { format } = payload as { format: string };
        await pause(50);
        return `/home/me/Documents/ondo-runs.${format}`;
      }
      case 'export_runs': {
        const { filter, path } = payload as { filter: RunFilter; path: string };
        await pause(50);
        return { runs: selectRuns(store.runs, filter).length, bytes: 48_213, path } satisfies Exported;
      }
      default:
        throw { kind: 'internal', message: `the mock backend has no command ${cmd}` } satisfies CommandError;
    }
  },
  { shouldMockEvents: true },
);

const target = document.getElementById('app');
if (!target) throw new Error('runs.html has no #app element');
mount(RunsView, { target, props: { api: backend } });
