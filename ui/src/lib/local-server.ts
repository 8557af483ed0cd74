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
