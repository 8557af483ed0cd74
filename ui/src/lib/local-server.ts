// The local server as the pages describe it: the popover's line (address,
// requests served, the client being answered) and the Settings section's
// address, curl example and generated key. Pure, so every wording is
// unit-tested; the key itself never appears in the popover.
import type { ClientInFlight, ServerStatus } from './backend';

/** Where clients reach the app's server on `port` (it listens on loopback only). */
export function serverAddress(port: number): string {
  return `http://127.0.0.1:${port}`;
}

/** A request a user can paste into a terminal to try the server. With a
 * key it sends it: the real one when `key` is given, else `$ONDO_API_KEY`. */
export function curlExample(port: number, keyed: boolean, key: string | null = null): string {
  const lines = [`curl ${serverAddress(port)}/v1/chat/completions \\`];
  if (keyed) lines.push(`  -H "Authorization: Bearer ${key ?? '$ONDO_API_KEY'}" \\`);
  lines.push(`  -d '{"model": "tiny", "messages": [{"role": "user", "content": "Hello"}]}'`);
  return lines.join('\n');
}

/** The clients the Settings section writes a set-up for. */
export type ClientKind = 'claude-code' | 'codex' | 'openai' | 'ollama';

/** One client's set-up: the dialect's base URL, what to paste, and where. */
export interface ClientSetup {
  kind: ClientKind;
  title: string;
  /** The base URL this client's dialect takes. */
  baseUrl: string;
  /** What to paste, as written. */
  text: string;
  /** Where it goes, in one line. */
  where: string;
}

/** The clients, in the order the Settings section offers them. */
export const CLIENT_KINDS: ClientKind[] = ['claude-code', 'codex', 'openai', 'ollama'];

/** A ready-to-paste set-up of `kind` for the server on `port`, asking for
 * `model`. With a key it sends it: the real one when `key` is given, else
 * `$ONDO_API_KEY`; without one the clients that insist on a key get a
 * placeholder the server ignores. */
export function clientSetup(
  kind: ClientKind,
  port: number,
  keyed: boolean,
  key: string | null = null,
  model = 'tiny',
): ClientSetup {
  const address = serverAddress(port);
  const secret = keyed ? (key ?? '$ONDO_API_KEY') : 'ondo';
  switch (kind) {
    case 'claude-code':
      return {
        kind,
        title: 'Claude Code',
        baseUrl: address,
        where: 'In the shell you start claude from (Anthropic Messages, /v1/messages).',
        text: [
          `export ANTHROPIC_BASE_URL=${address}`,
          `export ANTHROPIC_AUTH_TOKEN="${secret}"`,
          `export ANTHROPIC_MODEL=${model}`,
          `export ANTHROPIC_DEFAULT_HAIKU_MODEL=${model}`,
          'claude',
        ].join('\n'),
      };
    case 'codex':
      return {
        kind,
        title: 'Codex CLI',
        baseUrl: `${address}/v1`,
        where: `In ~/.codex/config.toml (OpenAI Responses, /v1/responses)${keyed ? '; export ONDO_API_KEY with the key' : ''}.`,
        text: [
          `model = "${model}"`,
          'model_provider = "ondo"',
          '',
          '[model_providers.ondo]',
          'name = "Ondo"',
          `base_url = "${address}/v1"`,
          'wire_api = "responses"',
          ...(keyed ? ['env_key = "ONDO_API_KEY"'] : []),
        ].join('\n'),
      };
    case 'openai':
      return {
        kind,
        title: 'OpenAI clients',
        baseUrl: `${address}/v1`,
        where: 'In the environment of any program built on the openai library (chat completions, /v1).',
        text: [`export OPENAI_BASE_URL=${address}/v1`, `export OPENAI_API_KEY="${secret}"`].join('\n'),
      };
    case 'ollama':
      return {
        kind,
        title: 'Ollama clients',
        baseUrl: address,
        where: `In the environment of the ollama library or CLI, or as the Ollama URL in Open WebUI (/api)${keyed ? ': they send no key, so leave the key empty for them' : ''}.`,
        text: `export OLLAMA_HOST=${address}`,
      };
  }
}

/** A new random API key: "ondo-" and 32 hex digits (128 bits) from the
 * system's random source. */
export function generateApiKey(random: (bytes: Uint8Array) => Uint8Array = (b) => crypto.getRandomValues(b)): string {
  const bytes = random(new Uint8Array(16));
  return `ondo-${Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('')}`;
}

/** What a route does, in one word: "POST /v1/chat/completions" is "chat". */
export function routeName(route: string): string {
  const path = route.split(' ').pop() ?? route;
  const known: Record<string, string> = {
    '/v1/chat/completions': 'chat',
    '/v1/completions': 'completion',
    '/api/chat': 'chat',
    '/api/generate': 'generate',
    '/v1/messages': 'messages',
    '/v1/responses': 'response',
    '/v1/embeddings': 'embeddings',
    '/api/embed': 'embeddings',
  };
  return known[path] ?? path;
}

/** "curl/8.5.0 (chat, tiny)": who is being answered, and with what. */
export function clientText(client: ClientInFlight): string {
  const agent = client.user_agent?.trim() || 'a client';
  const shortAgent = agent.length > 40 ? `${agent.slice(0, 39)}…` : agent;
  return `${shortAgent} (${routeName(client.route)}, ${client.model})`;
}

/** The popover line's parts after the address: "12 requests",
 * "answering curl/8.5.0 (chat, tiny)", "2 waiting". */
export function statusParts(status: ServerStatus): string[] {
  const served = status.requests_served;
  const parts = [served === 1 ? '1 request' : `${served.toLocaleString('en-US')} requests`];
  if (status.in_flight) parts.push(`answering ${clientText(status.in_flight)}`);
  if (status.waiting > 0) parts.push(`${status.waiting} waiting`);
  return parts;
}
