// Mounts the page a window shows: the popover in the window labelled
// "main", the main window (Runs, Settings) in the others.
import { mount } from 'svelte';
import './app.css';
import App from './App.svelte';
import type { AppView } from './lib/backend';

const target = document.getElementById('app');
if (!target) throw new Error('index.html has no #app element');

/** A window whose page failed says so instead of staying blank. */
function showFatal(reason: unknown): void {
  if (!target || target.childElementCount > 0) return;
  const note = document.createElement('p');
  note.className = 'fatal';
  note.setAttribute('role', 'alert');
  note.textContent = `Ondo's window could not start: ${reason instanceof Error ? reason.message : String(reason)}. Quit Ondo from the menu bar and open it again; if it happens again, please report it.`;
  target.append(note);
}
window.addEventListener('error', (event) => showFatal(event.error ?? event.message));
window.addEventListener('unhandledrejection', (event) => showFatal(event.reason));

/** The window's label from the metadata Tauri injects (none outside Tauri). */
function windowLabel(): string {
  const internals = (window as { __TAURI_INTERNALS__?: { metadata?: { currentWindow?: { label?: string } } } })
    .__TAURI_INTERNALS__;
  return internals?.metadata?.currentWindow?.label ?? 'main';
}

function viewFromHash(): AppView {
  return location.hash === '#settings' ? 'settings' : 'runs';
}

// The main window's code (charts included) loads only in that window, so the
// popover opens without it.
if (windowLabel() === 'main') {
  mount(App, { target });
} else {
  import('./workspace/Workspace.svelte').then(
    ({ default: Workspace }) => mount(Workspace, { target, props: { initialView: viewFromHash() } }),
    showFatal,
  );
}
