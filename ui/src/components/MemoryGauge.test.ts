import { cleanup, fireEvent, render, screen } from '@testing-library/svelte';
import { afterEach, describe, expect, it } from 'vitest';
import { memorySnapshot } from '../../test/fixtures';
import type { MemorySnapshot } from '../lib/backend';
import MemoryGauge from './MemoryGauge.svelte';

afterEach(cleanup);

describe('MemoryGauge', () => {
  it.each([
    ['normal', 'pressure normal'],
    ['warning', 'pressure warning'],
    ['critical', 'pressure critical'],
    ['unknown', 'pressure unknown'],
  ] as const)('colours the bar for %s pressure and says so', (level, said) => {
    const snapshot: MemorySnapshot = { ...memorySnapshot, level };
    render(MemoryGauge, { snapshot, usedFraction: 0.625 });
    const meter = screen.getByRole('meter');
    expect(meter.getAttribute('aria-label')).toBe(`Memory in use, ${said}`);
    expect(meter.getAttribute('aria-valuenow')).toBe('63');
    expect(meter.getAttribute('aria-valuemin')).toBe('0');
    expect(meter.getAttribute('aria-valuemax')).toBe('100');
    expect(meter.dataset.level).toBe(level);
    const fill = meter.querySelector('.fill') as SVGRectElement;
    expect(fill.getAttribute('class')).toContain(`level-${level}`);
    expect(fill.getAttribute('width')).toBe('63');
  });

  it('is grey without a snapshot', () => {
    render(MemoryGauge, { snapshot: null, usedFraction: 0.2 });
    expect(screen.getByRole('meter').dataset.level).toBe('unknown');
  });

  it('shows the breakdown on keyboard focus and on hover', async () => {
    render(MemoryGauge, { snapshot: memorySnapshot, usedFraction: 4 / 24 });
    const meter = screen.getByRole('meter');
    const breakdown = document.getElementById(meter.getAttribute('aria-describedby') ?? '') as HTMLElement;
    expect(breakdown.hidden).toBe(true);
    expect(meter.getAttribute('tabindex')).toBe('0');

    await fireEvent.focus(meter);
    expect(breakdown.hidden).toBe(false);
    const terms = [...breakdown.querySelectorAll('dt')].map((dt) => dt.textContent?.trim());
    const values = [...breakdown.querySelectorAll('dd')].map((dd) => dd.textContent?.trim());
    expect(Object.fromEntries(terms.map((term, index) => [term, values[index]]))).toEqual({
      Used: '4.00 GiB of 24.0 GiB',
      App: '2.50 GiB',
      Wired: '1.00 GiB',
      Compressed: '512 MiB',
      'Cached files': '6.00 GiB',
      'Swap used': '512 MiB of 2.00 GiB',
    });
    expect(breakdown.textContent).toContain('Ondo: 182 MiB');
    expect(breakdown.textContent).toContain('Memory pressure normal');
    await fireEvent.blur(meter);
    expect(breakdown.hidden).toBe(true);

    await fireEvent.mouseEnter(meter.parentElement as HTMLElement);
    expect(breakdown.hidden).toBe(false);
    await fireEvent.mouseLeave(meter.parentElement as HTMLElement);
    expect(breakdown.hidden).toBe(true);
  });
});
