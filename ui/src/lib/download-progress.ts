// What the Models section knows about one download, folded from the backend's
// `DownloadEvent`s and the command's outcome. Pure, so each step is tested.
import type { CommandError, DownloadEvent } from './backend';

export interface DownloadProgress {
  /** `running` until the command settles; `pausing` between the Pause click
   * and the backend's `cancelled`; `failed` keeps the error to show. */
  status: 'running' | 'pausing' | 'paused' | 'failed';
  done_bytes: number;
  /** Zero until the plan arrives. */
  total_bytes: number;
  bytes_per_second: number;
  eta_seconds: number | null;
  /** The file being fetched now. */
  file: string | null;
  /** Set while the backend retries a file or waits for a busy hub;
   * cleared by the next progress. */
  retrying: string | null;
  error: CommandError | null;
}

/** A download that has just been asked for, or resumed from `previous`. */
export function startDownload(previous?: DownloadProgress): DownloadProgress {
  return {
    status: 'running',
    done_bytes: previous?.done_bytes ?? 0,
    total_bytes: previous?.total_bytes ?? 0,
    bytes_per_second: 0,
    eta_seconds: null,
    file: null,
    retrying: null,
    error: null,
  };
}

export function applyDownloadEvent(progress: DownloadProgress, event: DownloadEvent): DownloadProgress {
  switch (event.event) {
    case 'planned':
      return { ...progress, total_bytes: event.total_bytes, done_bytes: event.present_bytes };
    case 'progress':
      return {
        ...progress,
        done_bytes: event.done_bytes,
        total_bytes: event.total_bytes,
        bytes_per_second: event.bytes_per_second ?? 0,
        eta_seconds: event.eta_seconds,
        file: event.file,
        retrying: null,
      };
    case 'retrying':
      return { ...progress, file: event.file, retrying: `Retrying ${event.file} (attempt ${event.attempt})…` };
    case 'hub_busy':
      // Nothing arrives while waiting: the speed and ETA would be stale.
      return { ...progress, bytes_per_second: 0, eta_seconds: null, retrying: hubBusyLine(event) };
    case 'file_done':
      return progress;
  }
}

/** "Hub busy (503), retrying in 4 s, attempt 2 of 6" */
export function hubBusyLine(event: Extract<DownloadEvent, { event: 'hub_busy' }>): string {
  const seconds = Math.max(1, Math.ceil(event.wait_ms / 1000));
  const what = event.status === 429 ? 'Hub busy (429, too many requests)' : `Hub busy (${event.status})`;
  return `${what}, retrying in ${seconds} s, attempt ${event.attempt} of ${event.attempts}…`;
}

/** How a download that did not complete ends: `cancelled` is the user's
 * pause, anything else an error to show. */
export function settleDownloadFailure(progress: DownloadProgress, error: CommandError): DownloadProgress {
  if (error.kind === 'cancelled') return { ...progress, status: 'paused', bytes_per_second: 0, eta_seconds: null, retrying: null };
  return { ...progress, status: 'failed', retrying: null, error };
}
