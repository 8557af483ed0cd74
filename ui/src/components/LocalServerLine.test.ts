import { cleanup, fireEvent, render, screen, waitFor } from '@testing-library/svelte';
import { afterEach, describe, expect, it, vi } from 'vitest';
import type { LocalServerState } from '../lib/backend';
import LocalServerLine from './LocalServerLine.svelte';

afterEach(() => {
  cleanup();
  vi.unstubAllGlobals();
});

type ServerHandler = (payload: LocalServerState) => void;

function fakeApi(first: LocalServerState) {
  let onServer: ServerHandler | null = null;
  const api = {
    serverStatus: vi.fn(async () => first),
    onAppEvent: vi.fn(async (_name: string, handler: ServerHandler) => {
      onServer = handler;
      return () => undefined;
    }),
  };
  return { api, emit: (payload: LocalServerState) => onServer?.(payload) };
}

const serving: LocalServerState = {
  state: 'on',
  status: { url: 'http://127.0.0.1:11480', requests_served: 12, waiting: 0, in_flight: null },
};

const line = () => screen.getByTestId('local-server').textContent?.replace(/\s+/g, ' ').trim();

describe('LocalServerLine', () => {
  it('shows nothing while the server is off', async () => {
    const { api } = fakeApi({ state: 'off' });
    render(LocalServerLine, { api: api as never });
    await waitFor(() => expect(api.serverStatus).toHaveBeenCalled());
    expect(screen.queryByTestId('local-server')).toBeNull();
    expect(api.onAppEvent).toHaveBeenCalledWith('ondo://local-server', expect.any(Function));
  });

  it('shows the address, the requests served and the client in flight, as they change', async () => {
    const { api, emit } = fakeApi(serving);
    render(LocalServerLine, { api: api as never });
    await screen.findByTestId('local-server');
    expect(line()).toMatch(/^Local server on http:\/\/127\.0\.0\.1:11480 · 12 requests Copy$/);

    emit({
      state: 'on',
      status: {
        ...serving.status,
        requests_served: 13,
        in_flight: { route: 'POST /v1/chat/completions', model: 'tiny', user_agent: 'curl/8.5.0', running_ms: 80 },
      },
    });
    await waitFor(() => expect(line()).toContain('13 requests · answering curl/8.5.0 (chat, tiny)'));

    emit({ state: 'off' });
    await waitFor(() => expect(screen.queryByTestId('local-server')).toBeNull());
  });

  it('copies the address from a button the keyboard reaches', async () => {
    const writeText = vi.fn(async () => undefined);
    vi.stubGlobal('navigator', { ...navigator, clipboard: { writeText } });
    const { api } = fakeApi(serving);
    render(LocalServerLine, { api: api as never });
    const copy = await screen.findByRole('button', { name: "Copy the local server's address" });
    copy.focus();
    expect(document.activeElement).toBe(copy);
    await fireEvent.click(copy);
    await waitFor(() => expect(writeText).toHaveBeenCalledWith('http://127.0.0.1:11480'));
    expect(await screen.findByText('Copied')).toBeTruthy();
  });

  it('says why a server turned on is not running', async () => {
    const { api } = fakeApi({
      state: 'failed',
      error: {
        kind: 'address_unavailable',
        message: 'cannot listen on 127.0.0.1:11480: Address already in use; choose another port or address',
      },
    });
    render(LocalServerLine, { api: api as never });
    await screen.findByTestId('local-server');
    expect(line()).toContain('The local server is turned on but not running.');
    expect(line()).toContain('The local server could not take its address');
    expect(line()).toContain('Choose another port in Settings → Local server.');
    expect(screen.queryByRole('button', { name: /Copy/ })).toBeNull();
  });
});
