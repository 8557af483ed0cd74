// The app's theme on a page: `data-theme` on <html> forces light or dark
// (app.css holds both palettes); without it the page follows the system.
import type { AppSettings } from '../lib/backend';

export type Theme = AppSettings['theme'];

/** Applies `theme` to `root` (the page's <html> unless given); every window
 * calls it at start with the saved setting. */
export function applyTheme(theme: Theme, root: HTMLElement = document.documentElement): void {
  if (theme === 'system') delete root.dataset.theme;
  else root.dataset.theme = theme;
}
