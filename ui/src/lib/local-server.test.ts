import { describe, expect, it } from 'vitest';
import { DEFAULT_SETTINGS } from './bindings';
import { clientText, curlExample, generateApiKey, routeName, serverAddress, statusParts } from './local-server';

describe('the local server as the pages describe it', () => {
  it('gives the loopback address on the port, the core default included', () => {
    expect(serverAddress(DEFAULT_SETTINGS.local_server.port)).toBe('http://127.0.0.1:11480');
    expect(serverAddress(2000)).toBe('http://127.0.0.1:2000');
  });

  it('writes a curl example that sends the key only when there is one', () => {
    expect(curlExample(11480, false)).toBe(
      `curl http://127.0.0.1:11480/v1/chat/completions \\\n` +
        `  -d '{"model": "tiny", "messages": [{"role": "user", "content": "Hello"}]}'`,
    );
    expect(curlExample(11480, true)).toContain('-H "Authorization: Bearer $ONDO_API_KEY" \\');
    expect(curlExample(11480, true, 'ondo-abc')).toContain('Bearer ondo-abc');
  });

  it('generates keys from the random source: 128 bits as hex, different each time', () => {
    expect(generateApiKey((bytes) => bytes.fill(0xab))).toBe(`ondo-${'ab'.repeat(16)}`);
    const first = generateApiKey();
    expect(first).toMatch(/^ondo-[0-9a-f]{32}$/);
    expect(generateApiKey()).not.toBe(first);
  });

  it('names routes in a word and the client by its User-Agent', () => {
    expect(routeName('POST /v1/chat/completions')).toBe('chat');
    expect(routeName('POST /api/generate')).toBe('generate');
    expect(routeName('POST /v1/completions')).toBe('completion');
    expect(routeName('GET /v1/models')).toBe('/v1/models');
    const client = { route: 'POST /v1/chat/completions', model: 'tiny', user_agent: 'curl/8.5.0', running_ms: 40 };
    expect(clientText(client)).toBe('curl/8.5.0 (chat, tiny)');
    expect(clientText({ ...client, user_agent: null })).toBe('a client (chat, tiny)');
    expect(clientText({ ...client, user_agent: 'x'.repeat(60) })).toMatch(/^x{39}… \(chat, tiny\)$/);
  });

  it('counts requests, then says who is answered and who waits', () => {
    const idle = { url: 'http://127.0.0.1:11480', requests_served: 1, waiting: 0, in_flight: null };
    expect(statusParts(idle)).toEqual(['1 request']);
    expect(
      statusParts({
        ...idle,
        requests_served: 1200,
        waiting: 2,
        in_flight: { route: 'POST /api/chat', model: 'tiny', user_agent: 'ollama-python/0.5', running_ms: 5 },
      }),
    ).toEqual(['1,200 requests', 'answering ollama-python/0.5 (chat, tiny)', '2 waiting']);
  });
});
