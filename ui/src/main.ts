// Mounts the page a window shows: the popover in the window labelled
// "main", the main window (Runs, Settings) in the others.
import { mount } from 'svelte';
import './app.css';
import App from './App.svelte';
import type { AppView } from './lib/backend';
import Workspace from './workspace/Workspace.svelte';

const target = document.getElementById('app');
if (!target) throw new Error('index.html has no #app element');

/** The window's label from the metadata Tauri injects (none outside Tauri). */
function windowLabel(): string {
  const internals = (window as { __TAURI_INTERNALS__?: { metadata?: { currentWindow?: { label?: string } } } })
    .__TAURI_INTERNALS__;
  return internals?.metadata?.currentWindow?.label ?? 'main';
}

function viewFromHash(): AppView {
  return location.hash === '#settings' ? 'settings' : 'runs';
}

export default windowLabel() === 'main'
  ? mount(App, { target })
  : mount(Workspace, { target, props: { initialView: viewFromHash() } });
