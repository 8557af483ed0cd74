import { describe, expect, it } from 'vitest';
import { applyDownloadEvent, settleDownloadFailure, startDownload, type DownloadProgress } from './download-progress';

describe('download progress', () => {
  it('takes the plan, then each progress event, and shows retries until progress resumes', () => {
    let progress = startDownload();
    progress = applyDownloadEvent(progress, {
      event: 'planned',
      model: 'org/m',
      commit: 'c',
      files: 2,
      total_bytes: 1000,
      present_bytes: 200,
    });
    expect(progress).toMatchObject({ status: 'running', done_bytes: 200, total_bytes: 1000 });

    progress = applyDownloadEvent(progress, { event: 'retrying', file: 'a.safetensors', attempt: 2, detail: 'reset' });
    expect(progress.retrying).toBe('Retrying a.safetensors (attempt 2)…');

    progress = applyDownloadEvent(progress, {
      event: 'progress',
      file: 'a.safetensors',
      file_bytes: 300,
      file_total_bytes: 800,
      done_bytes: 500,
      total_bytes: 1000,
      bytes_per_second: 100,
      eta_seconds: 5,
    });
    expect(progress).toMatchObject({ done_bytes: 500, bytes_per_second: 100, eta_seconds: 5, retrying: null });
  });

  it('shows a wait for a busy hub with its status, wait and attempt, until bytes arrive again', () => {
    let progress: DownloadProgress = { ...startDownload(), done_bytes: 500, total_bytes: 1000, bytes_per_second: 100, eta_seconds: 5 };
    progress = applyDownloadEvent(progress, {
      event: 'hub_busy',
      file: 'a.safetensors',
      status: 503,
      wait_ms: 3200,
      attempt: 2,
      attempts: 6,
    });
    expect(progress).toMatchObject({
      done_bytes: 500,
      bytes_per_second: 0,
      eta_seconds: null,
      retrying: 'Hub busy (503), retrying in 4 s, attempt 2 of 6…',
    });

    progress = applyDownloadEvent(progress, { event: 'hub_busy', file: null, status: 429, wait_ms: 1000, attempt: 3, attempts: 6 });
    expect(progress.retrying).toBe('Hub busy (429, too many requests), retrying in 1 s, attempt 3 of 6…');

    progress = applyDownloadEvent(progress, {
      event: 'progress',
      file: 'a.safetensors',
      file_bytes: 400,
      file_total_bytes: 800,
      done_bytes: 600,
      total_bytes: 1000,
      bytes_per_second: 100,
      eta_seconds: 4,
    });
    expect(progress.retrying).toBeNull();
  });

  it('treats cancelled as a pause and anything else as an error; resuming keeps the bytes', () => {
    const running = { ...startDownload(), done_bytes: 500, total_bytes: 1000, bytes_per_second: 100 };
    const paused = settleDownloadFailure(running, { kind: 'cancelled', message: 'x' });
    expect(paused).toMatchObject({ status: 'paused', error: null, bytes_per_second: 0 });
    expect(startDownload(paused)).toMatchObject({ status: 'running', done_bytes: 500, total_bytes: 1000 });

    const failed = settleDownloadFailure(running, { kind: 'disk_full', message: 'free 2 GB' });
    expect(failed).toMatchObject({ status: 'failed', error: { kind: 'disk_full' } });
  });
});
