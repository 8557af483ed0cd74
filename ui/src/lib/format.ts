// Turns the backend's raw numbers into what the popover shows. Pure functions,
// so every rounding rule is unit-tested. Times and rates may arrive as null:
// JSON has no NaN or infinity, so a rate over a zero time comes as null and
// shows as a dash.
import type { DemoRun, DoctorReport } from './backend';

const integer = new Intl.NumberFormat('en-US', { maximumFractionDigits: 0 });

const BYTE_UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];

/** Bytes with three significant digits in binary units (1 GiB = 2^30 bytes),
 * labelled as such: "512 B", "12.0 KiB", "565 MiB", "2.55 GiB". The rule of
 * the core's `human_bytes` (src/units.rs), so a size reads the same here, in
 * an error message from the core and in the terminal; both test the same
 * cases. Halves round up; a figure that would read 1024 moves to the next
 * unit ("1.00 GiB", never "1024 MiB"). */
export function formatBytes(bytes: number): string {
  if (!Number.isFinite(bytes) || bytes < 0) return '—';
  let unit = 0;
  let divisor = 1;
  while (unit < BYTE_UNITS.length - 1 && bytes >= divisor * 1024) {
    divisor *= 1024;
    unit += 1;
  }
  if (unit === 0) return `${Math.round(bytes)} B`;
  for (;;) {
    const figure = bytes / divisor;
    // The decimals follow the rounded figure, so 9.996 reads "10.0".
    for (const decimals of [2, 1]) {
      const scale = 10 ** decimals;
      const scaled = Math.round(figure * scale);
      if (scaled < 1000) {
        const fraction = String(scaled % scale).padStart(decimals, '0');
        return `${Math.floor(scaled / scale)}.${fraction} ${BYTE_UNITS[unit]}`;
      }
    }
    const whole = Math.round(figure);
    if (whole < 1024 || unit === BYTE_UNITS.length - 1) return `${whole} ${BYTE_UNITS[unit]}`;
    divisor *= 1024;
    unit += 1;
  }
}

/** Milliseconds with about three significant digits; seconds from 1 s up. */
export function formatMs(ms: number | null): string {
  if (ms === null || !Number.isFinite(ms) || ms < 0) return '—';
  if (ms >= 1000) return `${(ms / 1000).toFixed(ms >= 10_000 ? 1 : 2)} s`;
  if (ms >= 100) return `${ms.toFixed(0)} ms`;
  if (ms >= 10) return `${ms.toFixed(1)} ms`;
  return `${ms.toFixed(2)} ms`;
}

/** Tokens per second; a rate that could not be measured shows as a dash. */
export function formatTps(tps: number | null): string {
  if (tps === null || !Number.isFinite(tps) || tps <= 0) return '—';
  if (tps >= 100) return `${integer.format(tps)} tok/s`;
  if (tps >= 10) return `${tps.toFixed(1)} tok/s`;
  return `${tps.toFixed(2)} tok/s`;
}

export function formatCount(count: number): string {
  return integer.format(count);
}

/** One row of the timings table. */
export interface TimingRow {
  stage: string;
  /** What the time column measures, in a few words. */
  measures: string;
  time: string;
  tokens: string;
  speed: string;
}

/** The three stages of a test generation, in the order they happen. */
export function formatTimings(run: DemoRun): TimingRow[] {
  return [
    {
      stage: 'Load',
      measures: run.load_kind === 'warm' ? 'warm, already loaded' : 'cold start',
      time: formatMs(run.load_ms),
      tokens: '',
      speed: '',
    },
    {
      stage: 'Prefill',
      measures: 'to first token',
      time: formatMs(run.ttft_ms),
      tokens: `${formatCount(run.prompt_tokens)} prompt`,
      speed: formatTps(run.prefill_tps),
    },
    {
      stage: 'Decode',
      measures: `after first token, ${run.loop} loop`,
      time: formatMs(run.decode_ms),
      tokens: `${formatCount(run.generated_tokens)} generated`,
      speed: formatTps(run.decode_tps),
    },
  ];
}

/** What the run did to memory, in one line under the timings. */
export function formatRunMemory(run: Pick<DemoRun, 'mlx_peak_bytes' | 'kv_cache_bytes'>): string {
  return `MLX peak ${formatBytes(run.mlx_peak_bytes)} · KV cache ${formatBytes(run.kv_cache_bytes)}`;
}

/** The header's memory line and how full memory is (0 to 1). */
export function formatMemory(report: Pick<DoctorReport, 'total_memory_bytes' | 'available_memory_bytes'>): {
  text: string;
  usedFraction: number;
} {
  const total = report.total_memory_bytes;
  const available = Math.min(report.available_memory_bytes, total);
  if (!(total > 0)) return { text: 'Memory unknown', usedFraction: 0 };
  return {
    text: `${formatBytes(available)} free of ${formatBytes(total)}`,
    usedFraction: (total - available) / total,
  };
}

/** The MLX self-tests in a few words: "all 3 checks passed", "1 of 3 checks failed". */
export function formatChecks(report: Pick<DoctorReport, 'checks'>): string {
  const total = report.checks.length;
  const failed = report.checks.filter((check) => !check.passed).length;
  const noun = total === 1 ? 'check' : 'checks';
  if (total === 0) return 'no checks ran';
  if (failed === 0) return total === 1 ? '1 check passed' : `all ${total} checks passed`;
  return `${failed} of ${total} ${noun} failed`;
}

/** A download's speed in decimal megabytes per second, as browsers show it. */
export function formatSpeed(bytesPerSecond: number): string {
  if (!Number.isFinite(bytesPerSecond) || bytesPerSecond <= 0) return '—';
  const mbps = bytesPerSecond / 1_000_000;
  return `${mbps.toFixed(mbps < 100 ? 1 : 0)} MB/s`;
}

/** Time left: "45 s left", "3 min 5 s left", "1 h 12 min left"; null when unknown. */
export function formatEta(seconds: number | null): string | null {
  if (seconds === null || !Number.isFinite(seconds) || seconds < 0) return null;
  const total = Math.ceil(seconds);
  if (total < 60) return `${total} s left`;
  const minutes = Math.floor(total / 60);
  if (minutes < 60) return `${minutes} min ${total % 60} s left`;
  return `${Math.floor(minutes / 60)} h ${minutes % 60} min left`;
}

/** Parameter counts as model cards write them: "600M", "1.7B", "8.0B". */
export function formatParameters(count: number | null): string {
  if (count === null || !Number.isFinite(count) || count <= 0) return '—';
  if (count >= 1e9) return `${(count / 1e9).toFixed(1)}B`;
  if (count >= 1e6) return `${Math.round(count / 1e6)}M`;
  return formatCount(count);
}

/** Context lengths in tokens: 4096 as "4K", 40960 as "40K", 1000 as "1,000". */
export function formatContext(tokens: number): string {
  if (tokens >= 1024 && tokens % 1024 === 0) return `${tokens / 1024}K`;
  return formatCount(tokens);
}

/** `ORG/NAME` to `NAME`: the part people recognise. */
export function modelName(repoId: string): string {
  return repoId.slice(repoId.lastIndexOf('/') + 1);
}
