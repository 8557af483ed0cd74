import { describe, expect, it } from 'vitest';
import { DEFAULT_SETTINGS } from './bindings';
import {
  CLIENT_KINDS,
  clientSetup,
  clientText,
  curlExample,
  generateApiKey,
  routeName,
  serverAddress,
  statusParts,
} from './local-server';

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

  it('writes each client a set-up that points it at its dialect, with the key when there is one', () => {
    const claude = clientSetup('claude-code', 2000, false);
    expect(claude.baseUrl).toBe('http://127.0.0.1:2000');
    expect(claude.text).toContain('export ANTHROPIC_BASE_URL=http://127.0.0.1:2000\n');
    expect(claude.text).toContain('export ANTHROPIC_MODEL=tiny');
    // Claude Code insists on a token; without a key the server ignores it.
    expect(claude.text).toContain('export ANTHROPIC_AUTH_TOKEN="ondo"');
    expect(clientSetup('claude-code', 2000, true, 'ondo-abc', 'qwen').text).toContain(
      'ANTHROPIC_AUTH_TOKEN="ondo-abc"\nexport ANTHROPIC_MODEL=qwen',
    );

    const codex = clientSetup('codex', 2000, false);
    expect(codex.text).toBe(
      'model = "tiny"\nmodel_provider = "ondo"\n\n[model_providers.ondo]\nname = "Ondo"\n' +
        'base_url = "http://127.0.0.1:2000/v1"\nwire_api = "responses"',
    );
    expect(clientSetup('codex', 2000, true).text).toContain('env_key = "ONDO_API_KEY"');
    expect(clientSetup('codex', 2000, true).where).toContain('export ONDO_API_KEY');

    expect(clientSetup('openai', 2000, true).text).toBe(
      'export OPENAI_BASE_URL=http://127.0.0.1:2000/v1\nexport OPENAI_API_KEY="$ONDO_API_KEY"',
    );
    expect(clientSetup('ollama', 2000, false).text).toBe('export OLLAMA_HOST=http://127.0.0.1:2000');
    expect(CLIENT_KINDS.map((kind) => clientSetup(kind, 1, false).title)).toEqual([
      'Claude Code',
      'Codex CLI',
      'OpenAI clients',
      'Ollama clients',
    ]);
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
    expect(routeName('POST /v1/messages')).toBe('messages');
    expect(routeName('POST /v1/responses')).toBe('response');
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
