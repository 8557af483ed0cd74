import { afterEach, describe, expect, it } from 'vitest';
import { applyTheme } from './theme';

afterEach(() => applyTheme('system'));

describe('applyTheme', () => {
  it('forces light or dark with data-theme on <html>', () => {
    applyTheme('dark');
    expect(document.documentElement.dataset.theme).toBe('dark');
    applyTheme('light');
    expect(document.documentElement.dataset.theme).toBe('light');
  });

  it('removes data-theme for system, so the page follows the OS', () => {
    applyTheme('dark');
    applyTheme('system');
    expect(document.documentElement.hasAttribute('data-theme')).toBe(false);
  });

  it('applies to another root when given one', () => {
    const root = document.createElement('html');
    applyTheme('light', root);
    expect(root.dataset.theme).toBe('light');
    expect(document.documentElement.hasAttribute('data-theme')).toBe(false);
  });
});
