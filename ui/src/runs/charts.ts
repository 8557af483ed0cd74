//! uPlot options for the Runs view's three charts, built from the theme's CSS
//! variables so that light and dark mode draw in the app's colours.
import type uPlot from 'uplot';
import { formatBytes } from '../lib/format';
import { TIMELINE_SERIES, type PressureSegment } from './runs';

/** The colours a chart draws with, read from CSS variables. */
export interface ChartTheme {
  text: string;
  muted: string;
  grid: string;
  series: string[];
  pressure: Record<string, string>;
}

export function readTheme(element: Element): ChartTheme {
  const style = getComputedStyle(element);
  const css = (name: string, fallback: string) => style.getPropertyValue(name).trim() || fallback;
  return {
    text: css('--text', '#1d1c1a'),
    muted: css('--text-muted', '#5f5b55'),
    grid: css('--chart-grid', '#e8e4de'),
    series: ['--chart-1', '--chart-2', '--chart-3', '--chart-4', '--chart-5'].map((name) => css(name, '#888888')),
    pressure: {
      normal: css('--pressure-normal', '#34a853'),
      warning: css('--pressure-warning', '#e8b400'),
      critical: css('--pressure-critical', '#d93025'),
      unknown: css('--pressure-unknown', '#9a958e'),
    },
  };
}

/** Builds a chart's options for its current size and theme. */
export type ChartBuilder = (theme: ChartTheme, width: number, height: number) => uPlot.Options;

/** Short numbers for axis ticks: 950, 3.6k, 12k. */
function compact(value: number): string {
  if (Math.abs(value) >= 10_000) return `${Math.round(value / 1000)}k`;
  if (Math.abs(value) >= 1000) return `${(value / 1000).toFixed(1)}k`;
  if (Math.abs(value) >= 10 || value === 0) return `${Math.round(value)}`;
  return `${Number(value.toPrecision(2))}`;
}

function axes(theme: ChartTheme, xLabel: string, yLabel: string, yValues: (value: number) => string): uPlot.Axis[] {
  const common = {
    stroke: theme.muted,
    grid: { stroke: theme.grid, width: 1 },
    ticks: { stroke: theme.grid, width: 1 },
    font: '11px system-ui, sans-serif',
    labelFont: '11px system-ui, sans-serif',
  };
  return [
    { ...common, label: xLabel, labelSize: 18, size: 28 },
    {
      ...common,
      label: yLabel,
      labelSize: 18,
      size: 48,
      values: (_self, splits) => splits.map((split) => (split === null || split === undefined ? '' : yValues(split))),
    },
  ];
}

/** A series drawn as points only: runs are not a time series. */
function pointSeries(label: string, colour: string, unit: string): uPlot.Series {
  return {
    label,
    stroke: colour,
    width: 0,
    paths: () => null,
    points: { show: true, size: 7, width: 1, stroke: colour, fill: colour },
    value: (_self, value) => (value === null || value === undefined ? '—' : `${compact(value)} ${unit}`),
  };
}

const MiB = 2 ** 20;
const GiB = 2 ** 30;

/** Axis ticks in GiB (MiB below 1 GiB), at binary-friendly steps. */
function gibibytes(bytes: number): string {
  if (bytes === 0) return '0';
  if (Math.abs(bytes) < GiB) return `${Math.round(bytes / MiB)} MiB`;
  return `${Number((bytes / GiB).toFixed(1))} GiB`;
}

function withByteTicks(list: uPlot.Axis[]): uPlot.Axis[] {
  const [x, y] = list;
  const incrs = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    .map((n) => n * MiB)
    .concat([1, 2, 4, 8, 16, 32, 64, 128, 256].map((n) => n * GiB));
  return x && y ? [x, { ...y, incrs, size: 58, labelSize: 0 }] : list;
}

const runAxis: uPlot.Scale = { time: false };

/** Prefill and decode tok/s over run index, on a log scale: prefill is often
 * ten times faster than decode, and both must stay readable. */
export const speedChart: ChartBuilder = (theme, width, height) => ({
  width,
  height,
  scales: { x: runAxis, y: { distr: 3 } },
  axes: axes(theme, 'run (oldest first)', 'tok/s', compact),
  series: [
    { label: 'run', value: (_self, value) => (value === null ? '—' : `#${value}`) },
    pointSeries('Prefill', theme.series[0] ?? theme.text, 'tok/s'),
    pointSeries('Decode', theme.series[1] ?? theme.text, 'tok/s'),
  ],
  cursor: { drag: { x: false, y: false } },
  legend: { live: false },
});

/** Aggregate tok/s over streams at once, a line per side. */
export function concurrencyChart(sides: readonly string[]): ChartBuilder {
  return (theme, width, height) => ({
    width,
    height,
    scales: { x: runAxis, y: { distr: 3 } },
    axes: axes(theme, 'streams at once', 'tok/s in all', compact),
    series: [
      { label: 'streams', value: (_self, value) => (value === null ? '—' : `${value}`) },
      ...sides.map((side, index) => {
        const colour = theme.series[index % Math.max(1, theme.series.length)] ?? theme.text;
        return {
          label: side,
          stroke: colour,
          width: 2,
          points: { show: true, size: 7, width: 1, stroke: colour, fill: colour },
          value: (_self: uPlot, value: number | null) => (value === null || value === undefined ? '—' : `${compact(value)} tok/s`),
        } satisfies uPlot.Series;
      }),
    ],
    cursor: { drag: { x: false, y: false } },
    legend: { live: false },
  });
}

/** Load time (cold runs) and time to first token over run index, ms. */
export const coldWarmChart: ChartBuilder = (theme, width, height) => ({
  width,
  height,
  scales: { x: runAxis, y: { distr: 3 } },
  axes: axes(theme, 'run (oldest first)', 'ms', compact),
  series: [
    { label: 'run', value: (_self, value) => (value === null ? '—' : `#${value}`) },
    pointSeries('Load (cold)', theme.series[3] ?? theme.text, 'ms'),
    pointSeries('TTFT', theme.series[2] ?? theme.text, 'ms'),
  ],
  cursor: { drag: { x: false, y: false } },
  legend: { live: false },
});

/** The memory timeline: lines over t_ms, pressure as faint bands behind them
 * and a solid strip along the bottom edge. */
export function timelineChart(segments: readonly PressureSegment[]): ChartBuilder {
  return (theme, width, height) => ({
    width,
    height,
    scales: { x: { time: false } },
    axes: withByteTicks(axes(theme, 'ms since the request', '', gibibytes)),
    series: [
      { label: 't', value: (_self, value) => (value === null ? '—' : `${compact(value)} ms`) },
      ...TIMELINE_SERIES.map(({ label }, index) => ({
        label,
        stroke: theme.series[index] ?? theme.text,
        width: 1.5,
        value: (_self: uPlot, value: number | null) => (value === null ? '—' : formatBytes(value)),
      })),
    ],
    cursor: { drag: { x: false, y: false } },
    legend: { live: false },
    hooks: {
      drawClear: [
        (self: uPlot) => {
          const { ctx, bbox } = self;
          const strip = Math.round(5 * devicePixelRatio);
          ctx.save();
          for (const segment of segments) {
            const from = self.valToPos(segment.from_ms, 'x', true);
            const to = self.valToPos(segment.to_ms, 'x', true);
            const x = Math.max(Math.min(from, to), bbox.left);
            const w = Math.max(Math.min(Math.max(from, to), bbox.left + bbox.width) - x, 2);
            ctx.fillStyle = theme.pressure[segment.level] ?? theme.pressure.unknown ?? theme.muted;
            ctx.globalAlpha = 0.12;
            ctx.fillRect(x, bbox.top, w, bbox.height);
            ctx.globalAlpha = 1;
            ctx.fillRect(x, bbox.top + bbox.height - strip, w, strip);
          }
          ctx.restore();
        },
      ],
    },
  });
}
